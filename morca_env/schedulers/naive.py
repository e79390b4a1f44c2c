"""The floor of the benchmark's scale: what a collapsed or untrained agent plays, so a reader can tell its score.

Each asks for one action at every step and lets the mask decide the rest, as an agent that learned nothing would:
- "always-recompute": recompute whenever allowed, so the budget forces every reuse into the last free steps;
- "always-reuse": reuse whenever allowed, so every reuse comes first (greedy);
- "coin-flip": a fair coin at every step, masked (seeded).
All spend exactly K under the env's budget mask. The random feasible schedule ("random", the scale's 0) is a
uniformly random placement of exactly K reuses, which is not what any of these play.
"""

from __future__ import annotations

import numpy as np

from .base import feasible
from .registry import register


class Constant:
    """The same requested action at every step, made feasible by the mask."""

    def __init__(self, action: int):
        self.action = int(action)

    def reset(self, obs, info) -> None:
        pass

    def __call__(self, obs) -> int:
        return feasible(self.action, obs)


@register("always-recompute")
def always_recompute() -> Constant:
    return Constant(0)


@register("always-reuse")
def always_reuse() -> Constant:
    return Constant(1)


@register("coin-flip", seeded=True)
class CoinFlip:
    """A fair coin between recompute and reuse at every step, made feasible by the mask."""

    def __init__(self, seed: int | None = None):
        self.rng = np.random.default_rng(seed)

    def reset(self, obs, info) -> None:
        pass

    def __call__(self, obs) -> int:
        return feasible(int(self.rng.integers(0, 2)), obs)
