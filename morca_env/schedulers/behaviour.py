"""The paper's behaviour policy (App. B.3): SeaCache with a random smooth threshold curve per episode, the
exploration the offline datasets are collected with."""

from __future__ import annotations

import numpy as np

from ..speedup.files import ThresholdMap
from ..observation import Scalar
from ..diffusion.signals import seacache_reuses
from .base import feasible, step_index
from .registry import register
from .rules.seacache import threshold_map_for


def smoothstep_curve(num_steps: int, positions, values) -> np.ndarray:
    """Piecewise cubic smoothstep (3s^2 - 2s^3) through (position, value) knots, flat outside them."""
    positions, values = np.asarray(positions, dtype=float), np.asarray(values, dtype=float)
    steps = np.arange(num_steps, dtype=float)
    curve = np.empty(num_steps)
    curve[steps <= positions[0]] = values[0]
    curve[steps >= positions[-1]] = values[-1]
    for (p0, v0), (p1, v1) in zip(zip(positions[:-1], values[:-1]), zip(positions[1:], values[1:])):
        inside = (steps >= p0) & (steps <= p1)
        s = (steps[inside] - p0) / (p1 - p0)
        curve[inside] = v0 + (v1 - v0) * (3 * s**2 - 2 * s**3)
    return curve


class ThresholdCurve:
    """The paper's behaviour policy (App. B.3): SeaCache with a random smooth threshold curve.

    Per episode: the mean level mu = g(rho*) from the episode's target speedup
    (info["target_speedup"], or one drawn from `speedup_range`); an amplitude
    A ~ U(amplitude); 2-5 random reference steps with relative values in [-1, 1]
    joined by cubic smoothstep; delta_i = mu (1 + A shape_i), then clipped to
    [min_ratio mu, max_ratio mu] and to a per-step change of at most
    max_step_change mu. Reuse while D_t < delta_i; the mask always wins.
    """

    def __init__(self, threshold_map: ThresholdMap, speedup_range=(1.5, 4.5), amplitude=(0.0, 0.9),
                 num_references=(2, 5), min_ratio=0.1, max_ratio=3.0, max_step_change=0.25, seed=None):
        ordered_pair("speedup_range", speedup_range, 1.0, "a speedup")
        ordered_pair("amplitude", amplitude, 0.0, "an amplitude")
        ordered_pair("num_references", num_references, 1, "a count of reference steps", integers=True)
        if not 0 < min_ratio <= max_ratio:
            raise ValueError(f"min_ratio={min_ratio!r}, max_ratio={max_ratio!r}: need 0 < min_ratio <= max_ratio")
        if not max_step_change > 0:
            raise ValueError(f"max_step_change={max_step_change!r} must be > 0")
        self.g = threshold_map
        self.speedup_range = tuple(speedup_range)
        self.amplitude = tuple(amplitude)
        self.num_references = tuple(num_references)
        self.min_ratio, self.max_ratio, self.max_step_change = min_ratio, max_ratio, max_step_change
        self.rng = np.random.default_rng(seed)
        self.curve: np.ndarray | None = None

    def sample_curve(self, num_steps: int, speedup: float) -> np.ndarray:
        mu = self.g(speedup)
        amplitude = self.rng.uniform(*self.amplitude)
        count = int(self.rng.integers(self.num_references[0], self.num_references[1] + 1))
        positions = np.sort(self.rng.choice(num_steps, size=min(count, num_steps), replace=False))
        values = self.rng.uniform(-1, 1, size=len(positions))
        curve = mu * (1 + amplitude * smoothstep_curve(num_steps, positions, values))
        curve = np.clip(curve, self.min_ratio * mu, self.max_ratio * mu)
        limit = self.max_step_change * mu  # smoothness: bounded change per step, applied forward
        for i in range(1, num_steps):
            curve[i] = np.clip(curve[i], curve[i - 1] - limit, curve[i - 1] + limit)
        return curve

    def reset(self, obs, info) -> None:
        self.num_steps = info["num_steps"]
        speedup = info.get("target_speedup") or float(self.rng.uniform(*self.speedup_range))
        self.speedup = speedup
        self.curve = self.sample_curve(self.num_steps, speedup)

    def __call__(self, obs) -> int:
        i = min(step_index(obs, self.num_steps), self.num_steps - 1)
        return feasible(int(seacache_reuses(float(obs["scalars"][Scalar.D_t]), float(self.curve[i]))), obs)


def ordered_pair(name: str, value, minimum, what: str, integers: bool = False) -> None:
    """Refuse a (low, high) option that is not two numbers with minimum <= low <= high, naming it."""
    kinds = (int,) if integers else (int, float)
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or any(isinstance(v, bool) or not isinstance(v, kinds) for v in value)
            or not minimum <= value[0] <= value[1]):
        raise ValueError(f"{name}={value!r} must be (low, high), {what} each, with {minimum} <= low <= high")


@register("threshold-curve", seeded=True, needs_env=True, aliases=("behaviour", "behavior"))
def threshold_curve(env=None, threshold_map=None, **options) -> ThresholdCurve:
    """The behaviour policy on `env`'s packaged threshold map (or a given one)."""
    return ThresholdCurve(threshold_map_for(env, "threshold-curve", threshold_map), **options)
