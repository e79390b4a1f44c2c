"""Offline-to-online fine-tuning of discrete IQL (MORCA Algorithm 1(b), Table 6).

Each round: sample new trajectories from the current stochastic, masked policy
at random training prompts and target speedups; add them to a replay buffer
that keeps the offline data; train the critics alone for a few epochs
(warm-up), then policy and critics jointly. Starting without an offline
algorithm and without offline data gives "online IQL from scratch" (Table 4).
An epoch is one pass over the replay buffer's transitions in batches.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from torch.utils.tensorboard import SummaryWriter

from morca_env.utils.io import atomic_path, atomic_write_text
from morca_env.rollout import rollout_many as play_many
from morca_env.vector import single_env

from morca_env.schedulers.anchored import FollowBaseline

from .anchored import ANCHOR, GROUP_SIZE, AnchoredPolicy, anchored_episodes, baseline_of, episode_key
from .checkpoint import load_learnable
from .iql import DiscreteIQL, DiscreteIQLConfig
from .networks import MorcaEncoderFactory, parse_features
from .policy import MorcaPolicy
from .training import (CheckpointDir, batch_source, episode_from_trajectory, make_buffer, observation_shapes, run_updates, tuple_episode,
                       steps_per_epoch)

log = logging.getLogger(__name__)


@dataclass
class OnlineConfig:
    """Online fine-tuning settings (defaults: paper Table 6)."""

    rounds: int = 16
    trajectories_per_round: int = 100
    warmup_epochs: int = 5
    joint_epochs: int = 20
    actor_learning_rate: float = 4e-5
    critic_learning_rate: float = 1e-4
    weight_temp: float = 1.0
    max_weight: float = 20.0
    batch_size: int = 256
    speedup_range: tuple[float, float] = (1.5, 4.5)
    max_steps_per_epoch: int | None = None  # cap an epoch's updates (CPU budgets); None = a full pass
    n_step: int = 1  # return horizon of the Q targets (morca_env.data.transition_picker); 1 = the paper's TD
    features: str = "p3,mean,var"  # latent features of the networks when starting from scratch (offline: its own)
    seed: int = 0

    def __post_init__(self):  # pragma: no mutate block (data collection, not learning)
        for name in ("rounds", "trajectories_per_round", "batch_size", "n_step"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        parse_features(self.features)  # a bad name fails here, naming the valid ones
        lo, hi = self.speedup_range
        if not 1.0 <= lo <= hi:
            raise ValueError(f"speedup_range={self.speedup_range!r} must be (low, high) with 1 <= low <= high")


class OnlineTrainer:
    """Runs the rounds of Algorithm 1(b); resumable from `run_dir`."""

    def __init__(self, env, config: OnlineConfig, run_dir: str | Path, offline_algo: DiscreteIQL | None = None,
                 offline_buffer=None, device: str = "cpu", progress: bool = True, anchor: dict | None = None):
        self.player = env  # where rollouts play: a MorcaEnv, or a MorcaVectorEnv's batches
        self.env = single_env(env)
        self.config = config
        self.run_dir = Path(run_dir)
        self.progress = progress
        self.rng = np.random.default_rng(config.seed)
        iql = DiscreteIQLConfig(actor_learning_rate=config.actor_learning_rate,
                                critic_learning_rate=config.critic_learning_rate, weight_temp=config.weight_temp,
                                max_weight=config.max_weight, batch_size=config.batch_size)
        if offline_algo is not None:  # keep the offline networks' encoders (ablation features, sharing included)
            iql = dataclasses.replace(iql, actor_encoder_factory=offline_algo.config.actor_encoder_factory,
                                      critic_encoder_factory=offline_algo.config.critic_encoder_factory,
                                      value_encoder_factory=offline_algo.config.value_encoder_factory,
                                      shared_critic_encoder=offline_algo.config.shared_critic_encoder)
        else:
            encoder = MorcaEncoderFactory(features=config.features)
            iql = dataclasses.replace(iql, actor_encoder_factory=encoder, critic_encoder_factory=encoder,
                                      value_encoder_factory=encoder)
        self.algo = iql.create(device=device)
        # anchored (agents.anchored): the state gains the baseline's action, rollouts come in groups led by the
        # baseline, and returns are relative to the group's (offline_buffer must be anchored too)
        self.anchor = anchor
        self.baseline = baseline_of(anchor["baseline"]) if anchor is not None else None
        shapes = observation_shapes(self.env)
        if anchor is not None:
            shapes[2] = (shapes[2][0] + 1,)
        self.algo.create_impl(shapes, 2)
        if offline_algo is not None:
            self.algo.copy_weights_from(offline_algo)
        self.offline_episodes = [tuple_episode(e) for e in offline_buffer.episodes] if offline_buffer is not None else []
        self.online_episodes = []
        record = {"trainer": "online", **dataclasses.asdict(config), "num_steps": getattr(self.env, "num_steps", None)}
        if anchor is not None:
            record[ANCHOR] = {**anchor, "margin": None}
        self.checkpoints = CheckpointDir(self.run_dir, record)
        self.start_round = 0
        self.history: list[dict] = []
        self._resume()

    # ------------------------------------------------------------ persistence
    def _episodes_path(self, index: int) -> Path:  # pragma: no mutate block (I/O, not learning)
        return self.run_dir / "online_episodes" / f"round_{index:03d}.npz"

    def _save_round_episodes(self, index: int, episodes) -> None:  # pragma: no mutate block (I/O, not learning)
        arrays = {}
        for e, episode in enumerate(episodes):
            for k, obs in enumerate(episode.observations):
                arrays[f"{e}/obs{k}"] = obs
            arrays[f"{e}/actions"], arrays[f"{e}/rewards"] = episode.actions, episode.rewards
        path = self._episodes_path(index)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, **arrays)

    def _load_round_episodes(self, index: int):  # pragma: no mutate block (I/O, not learning)
        from d3rlpy.dataset import Episode

        with np.load(self._episodes_path(index)) as data:
            count = len({k.split("/")[0] for k in data.files})
            return [Episode(observations=[data[f"{e}/obs{k}"] for k in range(4)], actions=data[f"{e}/actions"],
                            rewards=data[f"{e}/rewards"], terminated=True) for e in range(count)]

    def _resume(self) -> None:  # pragma: no mutate block (I/O, not learning)
        found = self.checkpoints.latest()
        if found is None:
            return
        path, state = found
        self.algo.copy_weights_from(load_learnable(path))
        self.start_round = state["index"] + 1
        self.history = state.get("history", [])
        self.rng = np.random.default_rng([self.config.seed, self.start_round])
        for index in range(self.start_round):
            self.online_episodes += self._load_round_episodes(index)
        log.info("resumed online fine-tuning after round %d (%d online episodes)", self.start_round,
                 len(self.online_episodes))

    # ------------------------------------------------------------ the loop
    def collect(self, count: int) -> tuple[list, list[dict]]:  # pragma: no mutate block (data collection, not learning)
        lo, hi = self.config.speedup_range
        options = []
        group = GROUP_SIZE if self.anchor is not None else 1  # anchored: one draw per group, led by the baseline
        for _ in range(0, count, group):
            prompt, seed = self.env.suite.sample(self.rng)
            speedup = float(self.rng.uniform(lo, min(hi, self.env.calibration.speedup_range[1])))
            options += [{"prompt": prompt, "seed": seed, "speedup": speedup}] * group
        options = options[:count]
        if self.anchor is None:
            policies = [MorcaPolicy(self.algo, deterministic=False)] * count  # no per-episode state: one for all
        else:
            policies = [FollowBaseline(self.baseline) if i % group == 0
                        else AnchoredPolicy(self.algo, self.baseline, deterministic=False) for i in range(count)]
        trajectories = play_many(self.player, policies, options, record=True,
                                 progress="online rollouts" if self.progress else None)
        episodes = [episode_from_trajectory(t) for t in trajectories]
        if self.anchor is not None:
            episodes = anchored_episodes(episodes, [episode_key(t.info) for t in trajectories], self.baseline,
                                         self.env.budget_spec)
        return episodes, [t.info for t in trajectories]

    def run(self, on_round=None) -> list[dict]:
        """The rounds not done yet; after each, `on_round(algo, online_episodes_so_far)` (a learning curve's
        point; rounds a resumed run had done are not replayed)."""
        writer = SummaryWriter(str(self.run_dir / "tb"))
        config = self.config
        for index in range(self.start_round, config.rounds):
            t0 = time.perf_counter()
            new, infos = self.collect(config.trajectories_per_round)
            self._save_round_episodes(index, new)
            self.online_episodes += new
            buffer = make_buffer(self.offline_episodes + self.online_episodes, config.n_step)
            epoch_steps = steps_per_epoch(buffer, config.batch_size, config.max_steps_per_epoch)
            batches = batch_source(buffer, self.algo)
            self.algo.set_critic_only(True)
            warm = run_updates(self.algo, batches, config.warmup_epochs * epoch_steps, writer, "warmup",
                               f"round {index + 1} warm-up", self.progress)
            self.algo.set_critic_only(False)
            joint = run_updates(self.algo, batches, config.joint_epochs * epoch_steps, writer, "joint",
                                f"round {index + 1} joint", self.progress)
            psnr = float(np.mean([min(i["psnr"], 100.0) for i in infos]))
            record = {"round": index + 1, "rollout_psnr": psnr, "transitions": buffer.transition_count,
                      "updates": (config.warmup_epochs + config.joint_epochs) * epoch_steps,
                      "seconds": time.perf_counter() - t0, **{f"warmup_{k}": v for k, v in warm.items()},
                      **{f"joint_{k}": v for k, v in joint.items()}}
            self.history.append(record)
            writer.add_scalar("online/rollout_psnr", psnr, index + 1)
            if on_round is not None:  # before the save: a stop in between redoes the round, and its point
                on_round(self.algo, (index + 1) * config.trajectories_per_round)
            self.checkpoints.save(self.algo, index, {"history": self.history})
            if self.progress:
                log.info("round %d/%d: rollout PSNR %.2f dB, %d transitions, %.0f s", index + 1, config.rounds, psnr,
                         buffer.transition_count, record["seconds"])
        writer.close()
        atomic_write_text(self.run_dir / "history.json", json.dumps(self.history, indent=1) + "\n")
        self.checkpoints.save_final(self.algo)
        return self.history

