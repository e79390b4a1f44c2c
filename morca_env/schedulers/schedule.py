"""Schedules as values: moving reuses to reach a K, neighbours for local search, and the key a schedule is logged by.

A schedule is a list of N actions (0 = recompute, 1 = reuse); its K is its sum.
Forced steps (`BudgetSpec.forced`) always recompute, so every change here keeps them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..budget import BudgetSpec


def schedule_key(schedule: Sequence[int]) -> str:
    """The schedule as a string of 0/1, the key every log and search result uses."""
    return "".join("1" if a else "0" for a in schedule)


def adjust_reuses(schedule, spec: BudgetSpec, budget: int, first: int = 0) -> list[int]:
    """`schedule` with reuses added or removed (on free steps from `first` on) until it has `budget`: a schedule
    fitted at a neighbouring K, moved as little as possible and keeping the recomputes evenly spaced."""
    schedule = [int(a) for a in schedule]
    free = [i for i in range(first, spec.num_steps) if i not in spec.forced]
    if not sum(schedule[i] for i in range(spec.num_steps) if i not in free) <= budget <= sum(schedule) + sum(
            1 for i in free if not schedule[i]):
        raise ValueError(f"K = {budget} cannot be reached by changing steps {first}.. of {schedule}")
    while sum(schedule) < budget:  # turn the recompute farthest from reuses (then most crowded) into a reuse
        schedule[max((i for i in free if not schedule[i]), key=lambda i: _spacing(schedule, i))] = 1
    while sum(schedule) > budget:  # and back: the reuse farthest from recomputes (then most crowded)
        schedule[max((i for i in free if schedule[i]), key=lambda i: _spacing(schedule, i))] = 0
    return schedule


def _spacing(schedule: list[int], i: int) -> tuple[int, int, int]:
    """(distance to the nearest step of the other kind, minus the distance to the nearest of the same, -i)."""
    def nearest(value):
        left = next((i - j for j in range(i - 1, -1, -1) if schedule[j] == value), len(schedule))
        right = next((j - i for j in range(i + 1, len(schedule)) if schedule[j] == value), len(schedule))
        return min(left, right)

    return nearest(1 - schedule[i]), -nearest(schedule[i]), -i


@dataclass(frozen=True)
class Moves:
    """How `propose` moves a schedule (`morca_env.evaluation.search.SearchConfig` has the same three fields)."""

    max_shift: int = 2  # a near move shifts one step by 1 .. max_shift free steps
    far_fraction: float = 0.0  # share of proposals that swap a random reuse with a random recompute
    frozen_prefix: int = 0  # the first this many steps never move


def propose(schedule: list[int], spec: BudgetSpec, rng: np.random.Generator, moves: Moves = Moves()
            ) -> list[int] | None:
    """A swap neighbour of `schedule` (same K, forced steps and the frozen prefix untouched), or None when none was
    found (K = 0 or K_max, or a near move fell on its own kind)."""
    free = [i for i in range(moves.frozen_prefix, spec.num_steps) if i not in spec.forced]
    reuse = [f for f, i in enumerate(free) if schedule[i]]
    recompute = [f for f, i in enumerate(free) if not schedule[i]]
    if not reuse or not recompute:
        return None  # K = 0 or K = K_max: a single schedule
    out = list(schedule)
    if rng.random() < moves.far_fraction:
        a, b = int(rng.choice(reuse)), int(rng.choice(recompute))
    else:
        movers, targets = (reuse, set(recompute)) if len(reuse) <= len(recompute) else (recompute, set(reuse))
        a = int(rng.choice(movers))
        shift = int(rng.integers(1, moves.max_shift + 1)) * (1 if rng.random() < 0.5 else -1)
        b = a + shift
        if b not in targets:
            return None
    out[free[a]], out[free[b]] = out[free[b]], out[free[a]]
    return out
