"""A trained scheduler as a plain policy: `policy(obs) -> action` for MorcaEnv and evaluation."""

from __future__ import annotations

import json
import warnings

import numpy as np
import torch

from morca_env.observation import OBS_KEYS, Scalar, as_flat, as_tuple, is_flat_shape  # noqa: F401 (OBS_KEYS re-exported)
from morca_env.observation import check_observation_shapes
from morca_env.schedulers import checkpoint_paths, register


def observation_batch(obs: dict) -> list[np.ndarray]:
    """One env observation -> the tuple [pooled, temporal, scalars, action_mask] with a batch axis (float32)."""
    return [x[None] for x in as_tuple(obs)]


def flat_batch(obs: dict) -> np.ndarray:
    """One env observation -> (1, D) float32 in the flat layout, `morca_env.observation.FLAT_KEYS` (what flat-trained algorithms read)."""
    return as_flat({k: np.asarray(v)[None] for k, v in obs.items()})


class MorcaPolicy:
    """Wraps a d3rlpy algorithm trained on MORCA observations, flat or tuple (e.g. `DiscreteIQL`).

    Follows the rule policies' protocol (`reset(obs, info)`, `__call__(obs)`);
    `deterministic=False` samples from the masked policy (online data collection).
    Actions are always feasible: the policy's logits are masked.
    """

    learned = True  # evaluation times its per-step cost and counts it in the speedup

    def __init__(self, algo, deterministic: bool = True, pace: float = 0.0, trained_steps: int | None = None):
        if not pace >= 0.0:
            raise ValueError(f"pace={pace!r} must be >= 0 (0: the network's own logits)")
        self.algo = algo
        self.deterministic = deterministic
        self.pace = float(pace)
        self.trained_steps = trained_steps  # the step count N of its training episodes, when its checkpoint says
        self._warned_steps: set[int] = set()
        # our DiscreteIQL: call its masked policy network directly. d3rlpy's predict() costs ~0.3 ms
        # per call in conversions and checks, as much as MorcaTiny's scalar-state network itself
        # several times over, and a scheduler's own time is paid in speedup.
        impl = getattr(algo, "impl", None)
        if impl is None:
            raise ValueError(f"{type(algo).__name__} has no networks yet: fit it (or load a checkpoint) first")
        try:  # d3rlpy's own algorithms raise NotImplementedError here (DQN, CQL, BC): they act through predict()
            network = impl.policy
        except (AttributeError, NotImplementedError):
            network = None
        self._network = network if isinstance(network, torch.nn.Module) else None
        self._device = getattr(impl, "device", "cpu")
        self._on_cpu = torch.device(self._device).type == "cpu"
        shape = getattr(impl, "observation_shape", None)
        self.flat = shape is not None and is_flat_shape(shape)  # trained on to_replay_buffer's default (flat) form
        factory = getattr(getattr(algo, "config", None), "actor_encoder_factory", None)
        self.reads_latents = bool(getattr(factory, "features", "p3"))  # unknown encoders: assume they do
        if self.pace and self._network is None:
            raise ValueError(f"pace={pace} needs the policy's logits, and {type(algo).__name__} exposes no policy "
                             "network (impl.policy); use pace=0")

    @classmethod
    def load(cls, path, device: str = "cpu", deterministic: bool = True, pace: float = 0.0,
             trusted: bool = False) -> "MorcaPolicy":
        """A safe checkpoint (`.safetensors`); a legacy d3rlpy `.d3` pickle only with `trusted=True`."""
        from . import iql  # noqa: F401  (registers our config and encoder with d3rlpy)
        from .anchored import anchor_of
        from .checkpoint import is_safe_format, load_learnable, read_header

        if anchor_of(path) is not None:  # its network reads the anchored state: as a MorcaPolicy it would misread
            raise ValueError(f"checkpoint {path} is an anchored scheduler: load it with "
                             "morca_env.schedulers.make('morca', path=...) or agents.anchored.load_anchored")

        algo = load_learnable(path, device=device, trusted=trusted)
        training = json.loads(read_header(path)["training"]) if is_safe_format(path) else None  # legacy: no record
        steps = training.get("num_steps") if isinstance(training, dict) else None
        policy = cls(algo, deterministic, pace, steps)
        policy.source = f"checkpoint {path}"
        return policy

    def reset(self, obs, info) -> None:
        steps = info.get("num_steps")
        if self.trained_steps and steps and steps != self.trained_steps and steps not in self._warned_steps:
            self._warned_steps.add(steps)
            warnings.warn(f"this scheduler was trained on {self.trained_steps}-step episodes and plays a {steps}-step "
                          "one: its state is in shares of the steps, but the schedules it learnt were not seen at "
                          "this step count; expect it to do worse than on its own", stacklevel=2)
        # latent features of a noisy latent are never all zero: zeros mean MorcaEnv(latent_features=False)
        if self.reads_latents and not np.any(obs["pooled"]):
            raise ValueError("this scheduler reads latent features (pooled/temporal) but the observation has none: "
                             "the env was made with latent_features=False; use latent_features=True")
        check_observation_shapes(getattr(self.algo.impl, "observation_shape", None), obs,
                                 getattr(self, "source", "this scheduler"), reads_latents=self.reads_latents)

    @torch.no_grad()
    def logits(self, obs) -> torch.Tensor:
        """The masked policy logits (recompute, reuse) of one observation, shape (2,)."""
        if self._network is None:
            raise TypeError(f"{type(self.algo).__name__} exposes no policy network (impl.policy): its logits "
                            "cannot be read; only a single policy of it can act (through predict)")
        if self.flat:
            x = torch.from_numpy(flat_batch(obs))
            return self._network(x if self._on_cpu else x.to(self._device))[0]
        batch = observation_batch(obs) if self.reads_latents else [
            None, None, np.asarray(obs["scalars"], np.float32)[None], np.asarray(obs["action_mask"], np.float32)[None]]
        return self._network([x if x is None else torch.from_numpy(x) if self._on_cpu
                              else torch.from_numpy(x).to(self._device) for x in batch])[0]

    @torch.no_grad()
    def __call__(self, obs) -> int:
        # the scheduler's time is paid in speedup (MorcaTiny: ~0.35 ms a call in an episode, 1.5% of a stock step):
        # a step with one feasible action needs no network, and a scalar-state network no latent features
        mask = obs["action_mask"]
        if self.deterministic and not (mask[0] and mask[1]):
            return 0 if mask[0] else 1  # what the masked argmax picks
        if self._network is not None:
            logits = self.logits(obs)
            if self.pace:
                logits = logits - logits.new_tensor([0.0, self.pace * reuses_ahead(obs)])  # on the network's device
            action = pick(logits, self.deterministic)
        else:
            batch = flat_batch(obs) if self.flat else observation_batch(obs)
            action = self.algo.predict(batch) if self.deterministic else self.algo.sample_action(batch)
            action = int(action[0])
        if not obs["action_mask"][action]:  # cannot happen with masked logits; guard for foreign algorithms
            action = 1 - action
        return action


def reuses_ahead(obs) -> float:
    """The share of the reuse budget spent beyond its even share of the steps taken (negative: behind).

    Why: every training seed of the quickstart recipe defers its computes to the end of the run; `pace` subtracts
    this share times the pace from the reuse logit, holding the policy near an even spend while the network still
    places each compute. Measured on MorcaTiny it did not help (the MorcaTiny scheduler results, "Five training
    seeds"): the option exists so that the result can be reproduced and tried on other models.
    """
    scalars = obs["scalars"]
    budget, done = float(scalars[Scalar.K]), 1.0 - float(scalars[Scalar.t])  # both as shares of the N steps
    return (float(scalars[Scalar.u_t]) - budget * done) / max(budget, 1e-9)


def pick(logits: torch.Tensor, deterministic: bool) -> int:
    """Argmax (ties to recompute, as argmax breaks them) or a sample of the (recompute, reuse) logits."""
    if deterministic:
        recompute, reuse = logits.tolist()
        return int(reuse > recompute)
    return int(torch.distributions.Categorical(logits=logits).sample())


class MorcaEnsemble:
    """Several trained schedulers acting as one: the mean of their log-probabilities (a product of experts).

    Why: one training seed of the same recipe can land 2.8 dB away from another on the same validation prompts;
    averaging the members' log-probabilities keeps the choices they agree on and settles the others by how sure
    each member is. Costs one small network call per member and step. Measured on MorcaTiny (five seeds,
    the MorcaTiny scheduler results) an ensemble is no better than its average member: a tool, not a recipe.
    """

    learned = True

    def __init__(self, members: list[MorcaPolicy], deterministic: bool = True):
        if len(members) < 2:
            raise ValueError(f"an ensemble needs at least 2 members, got {len(members)}")
        self.members = members
        self.deterministic = deterministic
        self.reads_latents = any(m.reads_latents for m in members)

    @classmethod
    def load(cls, paths, device: str = "cpu", deterministic: bool = True, trusted: bool = False) -> "MorcaEnsemble":
        return cls([MorcaPolicy.load(p, device=device, trusted=trusted) for p in paths], deterministic)

    def reset(self, obs, info) -> None:
        for member in self.members:
            member.reset(obs, info)

    @torch.no_grad()
    def __call__(self, obs) -> int:
        mask = obs["action_mask"]
        if not (mask[0] and mask[1]):
            return 0 if mask[0] else 1
        log_probs = torch.stack([torch.log_softmax(m.logits(obs).float(), dim=-1) for m in self.members])
        return pick(log_probs.mean(dim=0), self.deterministic)


# the anchored recipe's scheduler per model (agents/trained/README.md); a model without one has no default "morca"
SHIPPED = {"tiny": "trained/morca-tiny-v0.safetensors", "scenes": "trained/morca-scenes-v0.safetensors"}


def shipped_checkpoint(model: str = "tiny") -> str:
    """The scheduler that ships with the package for `model` (with its checksum sidecar)."""
    from importlib import resources

    if model not in SHIPPED:
        raise FileNotFoundError(f"no scheduler ships for model {model!r} (shipped: {', '.join(sorted(SHIPPED))}); "
                                "train one (morca quickstart --env ...) and pass its checkpoint as path=")
    return str(resources.files("agents").joinpath(SHIPPED[model]))


@register("morca", learned=True, needs_env=True, checkpoint_suffixes=(".safetensors", ".d3"))
def load_morca(path=None, env=None, **options):
    """The registry's "morca": without `path`, the scheduler shipped for `env`'s model (MorcaTiny-v0's without an
    env; MorcaScenes-v0 has its own; a model without one is refused by name, as its best fixed schedule and data
    differ); else a
    checkpoint, an anchored one (`agents.anchored.AnchoredPolicy`, `margin=` overrides its own) or a plain one
    (`MorcaPolicy`), or several plain ones, comma-separated (`MorcaEnsemble`); `trusted=True` admits legacy `.d3`
    pickles."""
    from .anchored import anchor_of, load_anchored

    if path is None:
        path = shipped_checkpoint(env.unwrapped.preset.name if env is not None else "tiny")
    paths = checkpoint_paths(path)
    anchored = [p for p in paths if anchor_of(p) is not None]
    if anchored:
        if len(paths) > 1:
            raise ValueError(f"anchored checkpoints ({', '.join(anchored)}) play alone, not in an ensemble")
        return load_anchored(paths[0], **options)
    if "margin" in options:
        raise ValueError(f"margin= is an anchored scheduler's option; {paths[0]} is a plain MORCA checkpoint")
    return MorcaPolicy.load(paths[0], **options) if len(paths) == 1 else MorcaEnsemble.load(paths, **options)
