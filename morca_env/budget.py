"""Reuse budget: forced steps, the feasible-action mask, and speedup <-> K.

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

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterable, Sequence

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
            raise TypeError(f"budget={budget!r} must be an integer number of reuse steps")
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


@dataclass(frozen=True)
class SpeedupCalibration:
    """K = alpha - beta / rho (paper Fig. 3), fitted from measured latencies.

    `budget_for_speedup` picks the attainable K whose predicted speedup is closest
    to the target; targets outside [1, speedup(K_max)] raise `ValueError`.
    `scheduler_fraction` adds a scheduler's own per-step cost (as a fraction of a
    stock step, see `with_scheduler_cost`): negligible on Wan, ~4% of a step for
    MORCA's network on MorcaTiny, which would otherwise miss its targets.
    """

    alpha: float
    beta: float
    max_budget: int
    source: str = "unspecified"
    full_latency_s: float | None = None
    num_steps: int | None = None
    scheduler_fraction: float = 0.0

    def speedup_of_budget(self, budget: float) -> float:
        # 1 / rho = T(K) / T_full; a scheduler adds N c to T(K), i.e. N c / T_full to 1 / rho
        inverse = max(self.alpha - budget, 0.0) / self.beta + self.scheduler_fraction
        return math.inf if inverse <= 0 else 1.0 / inverse

    def with_scheduler_cost(self, seconds_per_step: float) -> "SpeedupCalibration":
        """The same calibration for a scheduler that spends `seconds_per_step` per step."""
        if not (isinstance(seconds_per_step, (int, float)) and math.isfinite(seconds_per_step)
                and seconds_per_step >= 0):
            raise ValueError(f"scheduler_cost_s={seconds_per_step!r} must be a finite number >= 0")
        if seconds_per_step == 0:
            return self
        if not self.full_latency_s or not self.num_steps:
            raise ValueError(f"scheduler_cost_s needs a measured calibration (full latency and step count); "
                             f"this one is: {self.source}. Run scripts/calibrate.py.")
        fraction = seconds_per_step * self.num_steps / self.full_latency_s
        return replace(self, scheduler_fraction=self.scheduler_fraction + fraction,
                       source=f"{self.source} + scheduler {seconds_per_step * 1e3:.2f} ms/step")

    @property
    def speedup_range(self) -> tuple[float, float]:
        return 1.0, self.speedup_of_budget(self.max_budget)

    def attainable_speedups(self) -> np.ndarray:
        return np.array([self.speedup_of_budget(k) for k in range(self.max_budget + 1)])

    def check_speedup(self, speedup: float) -> float:
        if isinstance(speedup, (bool, np.bool_)) or not isinstance(speedup, (int, float, np.floating, np.integer)):
            raise TypeError(f"speedup={speedup!r} must be a number")
        lo, hi = self.speedup_range
        if not (math.isfinite(speedup) and lo <= speedup <= hi):
            raise ValueError(
                f"speedup={speedup} is outside the feasible range [{lo:.2f}, {hi:.2f}] "
                f"(K from 0 to {self.max_budget} reuse steps; calibration: {self.source})"
            )
        return float(speedup)

    def budget_for_speedup(self, speedup: float) -> int:
        speedup = self.check_speedup(speedup)
        errors = np.abs(self.attainable_speedups() - speedup)
        return int(np.argmin(errors))

    @classmethod
    def fit(cls, budgets: Sequence[int], latencies_s: Sequence[float], max_budget: int, source: str,
            num_steps: int | None = None, full_latency_s: float | None = None) -> "SpeedupCalibration":
        """Least-squares fit of K = alpha - beta / rho with rho = T_full / T(K).

        T_full is `full_latency_s` (the stock no-cache latency) or, if omitted, the mean latency at K = 0.
        """
        budgets = np.asarray(budgets, dtype=float)
        latencies = np.asarray(latencies_s, dtype=float)
        if budgets.shape != latencies.shape or budgets.size < 2:
            raise ValueError("need at least two (budget, latency) pairs of equal length")
        if np.any(latencies <= 0):
            raise ValueError("latencies must be positive")
        if full_latency_s is None:
            if not np.any(budgets == 0):
                raise ValueError("calibration needs K=0 (the no-cache latency) among the budgets or full_latency_s")
            full_latency_s = float(np.mean(latencies[budgets == 0]))
        inv_rho = latencies / full_latency_s
        slope, intercept = np.polyfit(inv_rho, budgets, 1)
        return cls(alpha=float(intercept), beta=float(-slope), max_budget=int(max_budget), source=source,
                   full_latency_s=float(full_latency_s), num_steps=num_steps)

    def to_json(self, path: str | Path) -> None:
        from .io import atomic_write_text

        atomic_write_text(Path(path), json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def from_json(cls, path: str | Path) -> "SpeedupCalibration":
        data = json.loads(Path(path).read_text())
        return cls(**data)
