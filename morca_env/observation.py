"""The scheduler's state z_t (paper Sec. 3.2) built step by step, shared by MorcaEnv and `accelerate`.

z_t = (d_t, D_t, t, l_t, phi(x_t), phi(x_{t+1}), phi(x_{j_t}), u_t, K) plus the
cache-valid bit and the feasible-action mask. Call `observe` before each step's
decision and `record` with the executed action.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np
import torch
from gymnasium import spaces

from .budget import BudgetSpec
from .diffusion.features import (
    batch_latent_features, feature_shapes, latent_features_no_grad, stack_batch_features, stack_features)
from .diffusion.signals import BatchStepDistanceTracker, StepDistanceTracker

# ----------------------------------------------------------------- the layout (its one home: docstrings point here)
OBS_KEYS = ("pooled", "temporal", "scalars", "action_mask")  # order of the tuple form (d3rlpy, networks)
FEATURE_KEYS = ("pooled", "temporal")  # latent features (float16 in datasets unless collected in float32)
MASK_INDEX = OBS_KEYS.index("action_mask")
# The flat form's order is gymnasium's (`spaces.flatten`, `FlattenObservation`): a Dict space sorts its keys.
# A buffer in any other order has the same length, so a policy trained on it and run through gymnasium's
# flatten would read the wrong inputs without an error.
FLAT_KEYS = tuple(sorted(OBS_KEYS))
FLAT_MASK = slice(0, 2)  # the mask leads the flat vector (sorted first), whatever the channel count
assert FLAT_KEYS[0] == "action_mask"


class Scalar(IntEnum):
    """Index of each entry of `obs["scalars"]`."""

    d_t = 0  # SeaCache's filtered step distance
    D_t = 1  # its sum since the last recompute
    t = 2  # remaining steps / N
    l_t = 3  # steps since the last recompute / N
    u_t = 4  # reuses so far / N
    K = 5  # budget / N
    cache_valid = 6  # 1 when every CFG branch holds a residual


SCALAR_NAMES = tuple(s.name for s in Scalar)
NUM_SCALARS = len(Scalar)
# What a trained scheduler's inputs mean, recorded in every checkpoint (agents.checkpoint): a network trained on
# one layout reads another's values in the wrong places without an error, so a checkpoint of another is refused.
LAYOUT = f"tuple={','.join(OBS_KEYS)};flat={','.join(FLAT_KEYS)};scalars={','.join(SCALAR_NAMES)}"
TERMINAL_MASK = np.array([1, 0], dtype=np.int8)


# Observation tracks, as benchmarks offer them (Atari's RAM or pixels): "full" is the paper's state z_t, "scalars"
# the seven scalars and the mask alone (no latent features: cheaper, and any flat-input library reads it as is)
OBSERVATIONS = ("full", "scalars")
TRACK_KEYS = {"full": OBS_KEYS, "scalars": ("scalars", "action_mask")}
SCALARS_FLAT_SIZE = 2 + NUM_SCALARS  # the scalars track flattened: [action_mask (2), scalars (7)]


def check_observation(observation) -> str:
    """`observation` if it names a track, else an error naming the valid ones."""
    if observation not in OBSERVATIONS:
        raise ValueError(f"observation={observation!r}; valid: {', '.join(map(repr, OBSERVATIONS))}")
    return observation


def track_of_flat_size(size: int) -> str:
    """The track a flat observation of length `size` belongs to ("scalars": 9 values; else "full", whose length
    `channels_of_flat` checks)."""
    return "scalars" if int(size) == SCALARS_FLAT_SIZE else "full"


def present(obs: dict, observation: str = "full", flat: bool = False, batched: bool = False):
    """The full observation (or a batch of them, `batched`) in a track's form: its keys, and with `flat` one
    float32 vector per observation in the flat layout's order, `FLAT_KEYS` (`spaces.flatten` of the track's Dict
    space)."""
    if observation != "full":
        obs = {k: obs[k] for k in TRACK_KEYS[observation]}
    if not flat:
        return obs
    return as_flat(obs) if batched else as_flat({k: np.asarray(v)[None] for k, v in obs.items()})[0]


FEATURE_DTYPES = ("float32", "float16")
# int8 is gymnasium's mask convention (`Discrete.sample(mask=...)`, sb3-contrib); bool is torchrl's (`ActionMask`,
# `QValueModule(action_mask_key=...)` refuse any other dtype) and tianshou's
MASK_DTYPES = ("int8", "bool")


def check_mask_dtype(mask_dtype) -> str:
    """`mask_dtype` if valid, else an error naming the valid dtypes."""
    if mask_dtype not in MASK_DTYPES:
        raise ValueError(f"mask_dtype={mask_dtype!r}; valid: {', '.join(MASK_DTYPES)}")
    return mask_dtype


def check_feature_dtype(feature_dtype) -> str:
    """`feature_dtype` if valid, else an error naming the valid dtypes."""
    if feature_dtype not in FEATURE_DTYPES:
        raise ValueError(f"feature_dtype={feature_dtype!r}; valid: {', '.join(FEATURE_DTYPES)}")
    return feature_dtype


def observation_space(channels: int, feature_dtype: str = "float32", mask_dtype: str = "int8",
                      observation: str = "full", flat: bool = False) -> spaces.Space:
    """MorcaEnv's observation space for a latent with `channels` channels (`feature_dtype`: of pooled/temporal;
    `mask_dtype`: of the action mask, a MultiBinary for int8, a boolean Box for bool) on a track (`observation`);
    `flat`: one float32 Box in the flat layout's order, `FLAT_KEYS`, the mask first."""
    check_feature_dtype(feature_dtype)
    check_mask_dtype(mask_dtype)
    check_observation(observation)
    full = _full_space(channels, feature_dtype, mask_dtype)
    space = spaces.Dict({k: full[k] for k in TRACK_KEYS[observation]})
    if not flat:
        return space
    parts = [spaces.flatten_space(space[k]) for k in sorted(space.spaces)]
    low = np.concatenate([np.asarray(b.low, np.float32) for b in parts])
    high = np.concatenate([np.asarray(b.high, np.float32) for b in parts])
    return spaces.Box(low, high, low.shape, np.float32)


def _full_space(channels: int, feature_dtype: str, mask_dtype: str) -> spaces.Dict:
    shapes = feature_shapes(channels)
    high = np.full(NUM_SCALARS, 1.0, dtype=np.float32)
    high[[Scalar.d_t, Scalar.D_t]] = np.inf  # distances are unbounded
    return spaces.Dict({
        "pooled": spaces.Box(-np.inf, np.inf, shapes["pooled"], np.dtype(feature_dtype)),
        "temporal": spaces.Box(-np.inf, np.inf, shapes["temporal"], np.dtype(feature_dtype)),
        "scalars": spaces.Box(np.zeros(NUM_SCALARS, np.float32), high, (NUM_SCALARS,), np.float32),
        "action_mask": spaces.MultiBinary(2) if mask_dtype == "int8" else spaces.Box(0, 1, (2,), dtype=bool),
    })


def as_tuple(obs: dict) -> list[np.ndarray]:
    """Dict observation (one, or stacked along a first axis) -> [pooled, temporal, scalars, action_mask], float32."""
    return [np.asarray(obs[k], dtype=np.float32) for k in OBS_KEYS]


def as_flat(obs: dict) -> np.ndarray:
    """Stacked (T, ...) dict observation -> (T, D) float32 in sorted-key order (`FLAT_KEYS` for the full track):
    row t equals `gymnasium.spaces.flatten(env.observation_space, obs_t)`, whichever track's keys it holds."""
    return np.concatenate([np.asarray(obs[k], dtype=np.float32).reshape(len(obs[k]), -1) for k in sorted(obs)],
                          axis=1)


def _part_shapes(channels: int) -> dict[str, tuple[int, ...]]:
    return {**feature_shapes(channels), "scalars": (NUM_SCALARS,), "action_mask": (2,)}


def flat_size(channels: int) -> int:
    """Length of the flat observation for `channels` latent channels (MorcaTiny, C = 3: 3465)."""
    return sum(int(np.prod(shape)) for shape in _part_shapes(channels).values())


def channels_of_flat(size: int) -> int:
    """The channel count C of a flat observation of length `size`, or an error naming the valid lengths."""
    fixed, per_channel = flat_size(0), flat_size(1) - flat_size(0)
    if size < fixed + per_channel or (size - fixed) % per_channel:
        raise ValueError(f"a flat MORCA observation has {fixed} + {per_channel} x C values (C latent channels: "
                         f"{flat_size(3)} for MorcaTiny, {flat_size(16)} for Wan); got {size}")
    return (size - fixed) // per_channel


def split_flat(x, channels: int) -> dict:
    """Flat observations (B, D) (numpy or torch) -> their parts by key, each (B, *shape)."""
    parts, start = {}, 0
    shapes = _part_shapes(channels)
    for key in FLAT_KEYS:
        size = int(np.prod(shapes[key]))
        parts[key] = x[:, start:start + size].reshape(x.shape[0], *shapes[key])
        start += size
    if start != x.shape[1]:
        raise ValueError(f"flat observations of length {x.shape[1]}; {channels} channels give {start}")
    return parts


def is_flat_shape(observation_shape) -> bool:
    """True for a flat observation shape (D,), False for the tuple form's shapes [(3C, 4, 8, 8), ...]."""
    return not isinstance(observation_shape[0], (list, tuple))


def step_of(obs, num_steps: int) -> int:
    """The step index an observation was taken at, from its remaining-steps scalar."""
    return int(round(num_steps * (1.0 - float(obs["scalars"][Scalar.t]))))


def parse_action(action) -> int:
    """A scheduler's action as 0 or 1; anything else (0.9, "1", True, 2) is an error, never coerced."""
    value = action
    if isinstance(value, np.ndarray):
        if value.size != 1:
            raise ValueError(f"action={action!r} must be a single value; valid actions: 0 (recompute) or 1 (reuse)")
        value = value.reshape(-1)[0]
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value not in (0, 1):
        raise ValueError(f"action={action!r} is invalid; valid actions: 0 (recompute) or 1 (reuse)")
    return int(value)


class ObservationBuilder:
    """`latent_features=False` leaves `pooled` and `temporal` at zero and skips computing them:
    rule schedulers and scalar-state policies do not read them, and on a small model they are a
    visible share of a reused step (MorcaTiny: ~1.2 of ~7 ms)."""

    def __init__(self, spec: BudgetSpec, signal_kind: str = "official", power_exp: float = 3.0,
                 latent_features: bool = True, feature_dtype: str = "float32", mask_dtype: str = "int8"):
        self.spec = spec
        self.latent_features = bool(latent_features)
        self.feature_dtype = np.dtype(check_feature_dtype(feature_dtype))
        self.mask_dtype = np.dtype(check_mask_dtype(mask_dtype))
        self.tracker = StepDistanceTracker(kind=signal_kind, power_exp=power_exp)
        self.reset(0)

    def reset(self, budget: int, enforce_budget: bool = True) -> None:
        self.budget = budget
        self.enforce_budget = enforce_budget
        self.used = 0
        self.last_recompute: int | None = None
        self.tracker.reset()
        self._current = self._previous = self._last = None
        self.mask = TERMINAL_MASK.copy()

    def observe(self, step: int | None, latents: torch.Tensor, signal_input: torch.Tensor | None = None,
                sigma: float | None = None, cache_valid: bool = False) -> dict[str, np.ndarray]:
        """The observation before step `step`'s decision (`step=None`: the terminal observation)."""
        if latents.requires_grad or (signal_input is not None and signal_input.requires_grad):
            with torch.no_grad():
                return self._observe(step, latents, signal_input, sigma, cache_valid)
        # no context when nothing requires grad (no graph is built either way): entering and leaving one cost
        # ~15 us per step in an episode, measured
        return self._observe(step, latents, signal_input, sigma, cache_valid)

    def _observe(self, step, latents, signal_input, sigma, cache_valid) -> dict[str, np.ndarray]:
        n = self.spec.num_steps
        current = latent_features_no_grad(latents) if self.latent_features else None
        if step is not None:
            self.tracker.observe_no_grad(signal_input, sigma)
            self.mask = (self.spec.action_mask(step, self.used, self.budget, cache_valid) if self.enforce_budget
                         else self.spec.unconstrained_mask(step, cache_valid))
            distance, accumulated, index = self.tracker.distance, self.tracker.accumulated, step
        else:
            cache_valid, distance, accumulated, index = False, 0.0, 0.0, n
            self.mask = TERMINAL_MASK.copy()
        if current is None:
            shapes = feature_shapes(latents.shape[1])
            pooled, temporal = (np.zeros(shapes[k], dtype=self.feature_dtype) for k in ("pooled", "temporal"))
        else:
            previous = current if self._previous is None else self._previous
            last = current if self._last is None else self._last
            pooled, temporal = stack_features(current, previous, last)
            if self.feature_dtype != pooled.dtype:
                pooled, temporal = pooled.astype(self.feature_dtype), temporal.astype(self.feature_dtype)
        since = 0 if self.last_recompute is None else index - self.last_recompute
        scalars = np.array([distance, accumulated, (n - index) / n, since / n, self.used / n, self.budget / n,
                            float(cache_valid)], dtype=np.float32)
        self._current = current
        return {"pooled": pooled, "temporal": temporal, "scalars": scalars, "action_mask": self.mask.astype(self.mask_dtype)}

    def project(self, action: int, step: int, cache_valid: bool) -> tuple[int, bool]:
        return self.spec.project(action, step, self.used, self.budget, cache_valid, self.enforce_budget)

    def record(self, step: int, action: int) -> None:
        """Update the state with the executed action of `step`."""
        self.tracker.record(action)
        self._previous = self._current
        if action == 0:
            self.last_recompute = step
            self._last = self._current
        self.used += int(action)


class BatchObservationBuilder:
    """`ObservationBuilder` for N videos run in lockstep (`MorcaVectorEnv`): the same z_t per sample, stacked
    along a first axis, with the features and the SEA filter computed once for the batch. Every sample has its own
    budget, reuse count, last recompute and distance state; the step, its sigma and the cache's validity are the
    batch's (every video of a run is at the same step, and step 0 recomputes them all)."""

    def __init__(self, spec: BudgetSpec, signal_kind: str = "official", power_exp: float = 3.0,
                 latent_features: bool = True, feature_dtype: str = "float32", mask_dtype: str = "int8"):
        self.spec = spec
        self.latent_features = bool(latent_features)
        self.feature_dtype = np.dtype(check_feature_dtype(feature_dtype))
        self.mask_dtype = np.dtype(check_mask_dtype(mask_dtype))
        self.tracker = BatchStepDistanceTracker(kind=signal_kind, power_exp=power_exp)
        self.reset([0])

    def reset(self, budgets, enforce_budget: bool = True) -> None:
        self.budget = np.asarray(budgets, dtype=np.int64)
        self.enforce_budget = enforce_budget
        self.used = np.zeros(len(self.budget), dtype=np.int64)
        self.last_recompute = np.full(len(self.budget), -1)  # -1: none yet
        self.tracker.reset(len(self.budget))
        self._current = self._previous = self._last = None
        self.mask = np.tile(TERMINAL_MASK, (len(self.budget), 1))

    def observe(self, step: int | None, latents: torch.Tensor, signal_input: torch.Tensor | None = None,
                sigma: float | None = None, cache_valid: bool = False) -> dict[str, np.ndarray]:
        """The batch's observations before step `step`'s decisions (`step=None`: the terminal ones)."""
        n, batch = self.spec.num_steps, len(self.budget)
        current = batch_latent_features(latents) if self.latent_features else None
        if step is not None:
            distance = self.tracker.observe(signal_input, sigma)
            accumulated, index = self.tracker.accumulated, step
            self.mask = np.stack([self.spec.action_mask(step, int(u), int(k), cache_valid) if self.enforce_budget
                                  else self.spec.unconstrained_mask(step, cache_valid)
                                  for u, k in zip(self.used, self.budget)])
        else:
            cache_valid, distance, accumulated, index = False, np.zeros(batch), np.zeros(batch), n
            self.mask = np.tile(TERMINAL_MASK, (batch, 1))
        if current is None:
            shapes = feature_shapes(latents.shape[1])
            pooled, temporal = (np.zeros((batch, *shapes[k]), dtype=self.feature_dtype) for k in ("pooled", "temporal"))
        else:
            previous = current if self._previous is None else self._previous
            last = current if self._last is None else self._last
            pooled, temporal = stack_batch_features(current, previous, last)
            if self.feature_dtype != pooled.dtype:
                pooled, temporal = pooled.astype(self.feature_dtype), temporal.astype(self.feature_dtype)
        since = np.where(self.last_recompute < 0, 0, index - self.last_recompute)
        scalars = np.stack([distance, accumulated, np.full(batch, (n - index) / n), since / n, self.used / n,
                            self.budget / n, np.full(batch, float(cache_valid))], axis=1).astype(np.float32)
        self._current = current
        return {"pooled": pooled, "temporal": temporal, "scalars": scalars, "action_mask": self.mask.astype(self.mask_dtype)}

    def project(self, actions, step: int, cache_valid: bool) -> tuple[np.ndarray, np.ndarray]:
        """(executed, projected) per sample: each requested action, or the feasible one in its place."""
        pairs = [self.spec.project(int(a), step, int(u), int(k), cache_valid, self.enforce_budget)
                 for a, u, k in zip(actions, self.used, self.budget)]
        return np.array([a for a, _ in pairs], dtype=np.int64), np.array([p for _, p in pairs], dtype=bool)

    def record(self, step: int, actions: np.ndarray) -> None:
        """Update every sample's state with its executed action of `step`."""
        actions = np.asarray(actions)
        self.tracker.record(actions)
        recomputed = actions == 0
        self._previous = self._current
        if self._current is not None:
            if self._last is None:  # step 0 recomputes every sample
                self._last = self._current
            else:
                rows = torch.as_tensor(recomputed, device=self._current.pooled.device).view(-1, 1, 1, 1, 1)
                self._last = type(self._current)(*(torch.where(rows, c, l) for c, l in zip(self._current, self._last)))
        self.last_recompute = np.where(recomputed, step, self.last_recompute)
        self.used = self.used + actions.astype(np.int64)


def check_observation_shapes(network_shape, obs: dict, source: str, extra_scalars: int = 0,
                             reads_latents: bool = True) -> None:
    """Refuse, before the first step, an observation whose shapes differ from what the network was trained on
    (another model, resolution or frame count): otherwise the first step fails inside a matmul, naming nothing.
    `extra_scalars`: what the scheduler appends to the env's scalars (the anchored state adds one);
    `reads_latents=False`: a scalar-state network, whose latent inputs are never read."""
    if network_shape is None:
        return
    if is_flat_shape(network_shape):
        flat = as_flat({k: np.asarray(v)[None] for k, v in obs.items()})
        expected, got = tuple(network_shape), (flat.shape[1] + extra_scalars,)
    else:
        expected = tuple(tuple(int(n) for n in shape) for shape in network_shape)
        pooled, temporal, scalars, mask = as_tuple(obs)
        got = (pooled.shape, temporal.shape, (scalars.shape[0] + extra_scalars,), mask.shape)
        if not reads_latents:  # a scalar-state network never reads pooled/temporal: any model's shapes will do
            expected, got = expected[2:], got[2:]
    if got != expected:
        raise ValueError(f"{source} was trained on observations of shapes {list(expected)} and this env gives "
                         f"{list(got)} (another model, resolution or frame count): play it on the env it was "
                         "trained on, or train one for this env")
