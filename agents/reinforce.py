"""REINFORCE with a baseline, for the training-paradigm ablation (MORCA Table 4).

On-policy: each update samples `episodes_per_update` fresh episodes from the
current masked policy (the same network as MORCA's policy head) at random
training prompts and target speedups, and ascends
sum_t log pi(a_t | s_t) (R - b) over the non-forced steps, R being the
terminal PSNR reward and b an exponential moving average of past returns.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from morca_env.utils.io import atomic_write_text

from .checkpoint import CheckpointError, check_weights, load_torch_state, save_state

from .networks import MorcaNetwork, masked_logits
from morca_env.observation import OBS_KEYS, as_tuple
from morca_env.rollout import rollout_many
from morca_env.vector import single_env
from morca_env.schedulers import register

log = logging.getLogger(__name__)


@dataclass
class ReinforceConfig:
    learning_rate: float = 1e-4
    episodes_per_update: int = 8
    total_episodes: int = 1600
    baseline_decay: float = 0.9
    features: str = "p3,mean,var"
    speedup_range: tuple[float, float] = (1.5, 4.5)
    seed: int = 0


class ReinforcePolicy:
    """The REINFORCE policy network as a plain policy (`reset`, `__call__`); masked, never infeasible."""

    learned = True

    def __init__(self, network: MorcaNetwork, deterministic: bool = True, seed: int | None = None):
        self.network = network
        self.deterministic = deterministic
        self.generator = torch.Generator().manual_seed(seed if seed is not None else 0)

    def reset(self, obs, info) -> None:
        pass

    @torch.no_grad()
    def __call__(self, obs) -> int:
        x = [torch.as_tensor(np.asarray(obs[k], dtype=np.float32))[None] for k in OBS_KEYS]
        logits = masked_logits(self.network(*x[:3]), x[3])[0]
        if self.deterministic:
            return int(logits.argmax())
        return int(torch.multinomial(F.softmax(logits, dim=0), 1, generator=self.generator))

    @classmethod
    def load(cls, path, deterministic: bool = True, trusted: bool = False) -> "ReinforcePolicy":  # pragma: no mutate block (I/O, not learning)
        """A safe checkpoint (`.safetensors`), or a legacy `.pt` (its weights only, unless `trusted=True`)."""
        state = load_torch_state(path, trusted)
        if not isinstance(state, dict) or not {"channels", "config", "network"} <= set(state):
            raise CheckpointError(f"checkpoint {path} is not a REINFORCE checkpoint (it has no 'channels', 'config' "
                                  "and 'network'); a MORCA checkpoint loads with make_scheduler('morca', path=...)")
        network = MorcaNetwork(state["channels"], "policy", state["config"]["features"])
        check_weights(network, state["network"], path)
        network.load_state_dict(state["network"])
        return cls(network.eval(), deterministic)


class Reinforce:
    def __init__(self, env, config: ReinforceConfig, run_dir: str | Path, progress: bool = True):
        self.player = env  # where episodes play: a MorcaEnv, or a MorcaVectorEnv's batches
        self.env = single_env(env)
        self.config = config
        self.run_dir = Path(run_dir)
        self.progress = progress
        channels = self.env.observation_space["pooled"].shape[0] // 3
        torch.manual_seed(config.seed)
        self.network = MorcaNetwork(channels, "policy", config.features)
        self.channels = channels
        self.optimizer = torch.optim.AdamW(self.network.parameters(), lr=config.learning_rate, weight_decay=0.01)
        self.baseline: float | None = None
        self.episodes_done = 0
        self.rng = np.random.default_rng(config.seed)
        self.history: list[dict] = []
        self._resume()

    @property
    def checkpoint_path(self) -> Path:  # pragma: no mutate block (I/O, not learning)
        return self.run_dir / "reinforce.safetensors"

    def _resume(self) -> None:  # pragma: no mutate block (I/O, not learning)
        if not self.checkpoint_path.exists():
            return
        state = load_torch_state(self.checkpoint_path)
        self.network.load_state_dict(state["network"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.baseline, self.episodes_done, self.history = state["baseline"], state["episodes_done"], state["history"]
        self.rng = np.random.default_rng([self.config.seed, self.episodes_done])
        log.info("resumed REINFORCE after %d episodes", self.episodes_done)

    def save(self, path: Path | None = None) -> Path:  # pragma: no mutate block (I/O, not learning)
        path = path or self.checkpoint_path
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {"network": self.network.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "baseline": self.baseline, "episodes_done": self.episodes_done, "history": self.history,
                 "channels": self.channels, "config": asdict(self.config)}
        return save_state(state, path, "reinforce", asdict(self.config), {"trainer": "reinforce"})

    def policy(self, deterministic: bool = True) -> ReinforcePolicy:
        return ReinforcePolicy(self.network, deterministic)

    def sample_episode(self):  # pragma: no mutate block (data collection, not learning)
        return self.sample_episodes(1)[0]

    def sample_episodes(self, count: int) -> list:  # pragma: no mutate block (data collection, not learning)
        """`count` episodes of the stochastic policy, (observations, actions, return, info) each: every episode
        draws its policy seed, prompt, seed and target in turn, then they play (in batches on a MorcaVectorEnv)."""
        policies, options = [], []
        lo, hi = self.config.speedup_range
        for _ in range(count):
            policies.append(ReinforcePolicy(self.network, deterministic=False, seed=int(self.rng.integers(2**31))))
            prompt, seed = self.env.suite.sample(self.rng)
            speedup = float(self.rng.uniform(lo, min(hi, self.env.calibration.speedup_range[1])))
            options.append({"prompt": prompt, "seed": seed, "speedup": speedup})
        episodes = []
        for trajectory in rollout_many(self.player, policies, options, record=True):
            n = len(trajectory.actions)
            observations = {k: v[:n] for k, v in trajectory.observations.items()}
            episodes.append((observations, trajectory.schedule, trajectory.reward, trajectory.info))
        return episodes

    def loss(self, episodes) -> torch.Tensor:
        """Policy-gradient loss of a batch of (observations, actions, return) over non-forced steps."""
        returns = np.array([ret for _, _, ret in episodes])
        baseline = self.baseline if self.baseline is not None else float(returns.mean())
        terms, count = [], 0
        for observations, actions, ret in episodes:
            x = [torch.as_tensor(a) for a in as_tuple(observations)]
            free = x[3].sum(dim=1) > 1.5
            log_probs = F.log_softmax(masked_logits(self.network(*x[:3]), x[3]), dim=1)
            chosen = log_probs.gather(1, torch.as_tensor(actions).reshape(-1, 1)).reshape(-1)
            terms.append((chosen * free).sum() * (ret - baseline))
            count += int(free.sum())
        return -torch.stack(terms).sum() / max(1, count)

    def train(self, checkpoints=(), on_checkpoint=None) -> list[dict]:
        """Train to `total_episodes`; at the first update at or past each of `checkpoints` (episode counts),
        `on_checkpoint(policy, episodes_so_far)` (a learning curve's point)."""
        pending = sorted(c for c in checkpoints if c > self.episodes_done)
        writer = SummaryWriter(str(self.run_dir / "tb"))
        config = self.config
        bar = tqdm(total=config.total_episodes, initial=self.episodes_done, desc="REINFORCE", unit="episode",
                   disable=not self.progress)
        while self.episodes_done < config.total_episodes:
            batch, psnrs = [], []
            for observations, actions, ret, info in self.sample_episodes(
                    min(config.episodes_per_update, config.total_episodes - self.episodes_done)):
                batch.append((observations, actions, ret))
                psnrs.append(min(info["psnr"], 100.0))
                self.episodes_done += 1
                bar.update()
            loss = self.loss(batch)
            self.optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.network.parameters(), 1.0)
            self.optimizer.step()
            mean_return = float(np.mean([r for _, _, r in batch]))
            self.baseline = mean_return if self.baseline is None else (
                config.baseline_decay * self.baseline + (1 - config.baseline_decay) * mean_return)
            record = {"episodes": self.episodes_done, "loss": loss.item(), "rollout_psnr": float(np.mean(psnrs))}
            self.history.append(record)
            writer.add_scalar("reinforce/rollout_psnr", record["rollout_psnr"], self.episodes_done)
            writer.add_scalar("reinforce/loss", record["loss"], self.episodes_done)
            if pending and self.episodes_done >= pending[0]:  # one point per update, however many it passed
                while pending and self.episodes_done >= pending[0]:
                    pending.pop(0)
                if on_checkpoint is not None:  # before the save: a stop in between redoes the update, and its point
                    on_checkpoint(self.policy(), self.episodes_done)
            self.save()
        bar.close()
        writer.close()
        atomic_write_text(self.run_dir / "history.json", json.dumps(self.history, indent=1) + "\n")
        return self.history


@register("reinforce", learned=True, checkpoint_suffixes=(".safetensors", ".pt"))
def load_reinforce(path=None, **options) -> ReinforcePolicy:
    """The registry's "reinforce": a REINFORCE checkpoint (`.safetensors`, or a legacy `.pt`)."""
    if path is None:
        raise ValueError("scheduler 'reinforce' needs a checkpoint: make('reinforce', path=...)")
    return ReinforcePolicy.load(path, **options)
