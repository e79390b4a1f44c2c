"""Reuse budget: forced steps and the feasible-action mask (speedup <-> K lives in `morca_env.speedup`).

The paper turns a target speedup rho* into an exact number K of reuse steps
(K ~= alpha - beta / rho, Fig. 3) and reduces the budget-constrained MDP to an
augmented one whose state carries u_t (reuses so far) and K (App. D). An
action is feasible when the remaining budget b = K - u can still be spent
exactly:

* reuse (a=1) needs b >= 1, a non-forced step and a valid cache;
* recompute (a=0) needs b <= the number of free (non-forced) steps after this one.

Steps are indexed in execution order, i = 0 .. N-1 (the paper counts t = N .. 1).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

RECOMPUTE = 0
REUSE = 1


def forced_recompute_steps(num_steps: int, expert_switch_step: int | None = None) -> frozenset[int]:
    """Steps that must recompute: the first, the last and (Wan2.2) the first low-noise expert step."""
    if num_steps < 1:
        raise ValueError(f"num_steps={num_steps} must be >= 1")
    forced = {0, num_steps - 1}
    if expert_switch_step is not None:
        if not 0 <= expert_switch_step < num_steps:
            raise ValueError(f"expert_switch_step={expert_switch_step} is outside [0, {num_steps - 1}]")
        forced.add(expert_switch_step)
    return frozenset(forced)


@dataclass(frozen=True)
class BudgetSpec:
    """Forced steps of an N-step schedule and the feasibility rules of the augmented MDP.

    Step 0 is always forced: no residual exists before the first computation.
    """

    num_steps: int
    forced: frozenset[int] = field(default_factory=frozenset)

    def __post_init__(self):
        if self.num_steps < 1:
            raise ValueError(f"num_steps={self.num_steps} must be >= 1")
        bad = [i for i in self.forced if not 0 <= i < self.num_steps]
        if bad:
            raise ValueError(f"forced steps {sorted(bad)} are outside [0, {self.num_steps - 1}]")
        object.__setattr__(self, "forced", frozenset(self.forced) | {0})
        free = np.ones(self.num_steps, dtype=bool)
        free[list(self.forced)] = False
        # free_after[i] = number of free steps strictly after step i
        free_after = np.concatenate([np.cumsum(free[::-1])[::-1][1:], [0]]).astype(int)
        object.__setattr__(self, "_free_after", tuple(int(x) for x in free_after))

    @property
    def max_budget(self) -> int:
        """Largest feasible K: every non-forced step reuses."""
        return self.num_steps - len(self.forced)

    def free_after(self, step: int) -> int:
        return self._free_after[step]

    def check_budget(self, budget: int) -> int:
        if isinstance(budget, (bool, np.bool_)) or not isinstance(budget, (int, np.integer)):
            raise TypeError(f"budget={budget!r} must be an integer number of reuse steps in [0, {self.max_budget}]")
        if not 0 <= budget <= self.max_budget:
            raise ValueError(
                f"budget K={budget} is outside the feasible range [0, {self.max_budget}] "
                f"({self.num_steps} steps, {len(self.forced)} forced recomputes)"
            )
        return int(budget)

    def action_mask(self, step: int, used: int, budget: int, cache_valid: bool = True) -> np.ndarray:
        """int8 mask [recompute_ok, reuse_ok] at `step` after `used` reuses of `budget`."""
        if not 0 <= step < self.num_steps:
            raise ValueError(f"step={step} is outside [0, {self.num_steps - 1}]")
        remaining = budget - used
        reuse_ok = remaining >= 1 and step not in self.forced and cache_valid
        recompute_ok = remaining <= self.free_after(step)
        return np.array([recompute_ok, reuse_ok], dtype=np.int8)

    def choices_along(self, schedule: Iterable[int], budget: int) -> int:
        """How many steps of an executed `schedule` (K = `budget`) allowed both actions: the steps where a
        scheduler chose, counted after an episode instead of at each step."""
        used, free = 0, 0
        for step, action in enumerate(schedule):
            free += bool(self.action_mask(step, used, budget).all())
            used += int(action)
        return free

    def unconstrained_mask(self, step: int, cache_valid: bool = True) -> np.ndarray:
        """Mask without a budget (data collection): only forced steps and a missing cache forbid reuse."""
        return np.array([1, step not in self.forced and cache_valid], dtype=np.int8)

    def project(self, action: int, step: int, used: int, budget: int, cache_valid: bool = True,
                enforce_budget: bool = True) -> tuple[int, bool]:
        """Return (executed action, was_projected): the requested action if feasible, else the feasible one."""
        mask = (self.action_mask(step, used, budget, cache_valid) if enforce_budget
                else self.unconstrained_mask(step, cache_valid))
        if mask[action]:
            return int(action), False
        other = 1 - int(action)
        if not mask[other]:
            raise RuntimeError(
                f"no feasible action at step {step} (used={used}, budget={budget}, cache_valid={cache_valid}); "
                "the budget invariant was broken"
            )
        return other, True

    def project_schedule(self, requested: Iterable[int], budget: int) -> list[int]:
        """Project a whole requested schedule; the result has exactly `budget` reuses."""
        self.check_budget(budget)
        used, executed = 0, []
        requested = list(requested)
        if len(requested) != self.num_steps:
            raise ValueError(f"schedule has {len(requested)} actions, expected {self.num_steps}")
        for step, action in enumerate(requested):
            a, _ = self.project(int(action), step, used, budget)
            used += a
            executed.append(a)
        return executed


_MOVED = ("BUDGET_ROUNDINGS", "SpeedupCalibration", "seed_dither")


def __getattr__(name: str):
    """Speedup <-> K moved to `morca_env.speedup.calibration`; its old names answer here for one release."""
    if name in _MOVED:
        from .speedup import calibration

        warnings.warn(f"morca_env.budget.{name} moved to morca_env.speedup.calibration.{name}; the old path goes "
                      "in the next release", DeprecationWarning, stacklevel=2)
        return getattr(calibration, name)
    raise AttributeError(f"module 'morca_env.budget' has no attribute {name!r}")
