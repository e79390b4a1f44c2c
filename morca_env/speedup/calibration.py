"""Speedup <-> K: the calibration K ~= alpha - beta / rho (paper Fig. 3) that turns a target speedup into an exact
number of reuse steps, and its rounding.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Sequence

import numpy as np

_GOLDEN = 0.6180339887498949
BUDGET_ROUNDINGS = ("dither", "nearest")


def seed_dither(seed: int) -> float:
    """A rounding draw in [0, 1) keyed on the generation seed (golden-ratio sequence).

    Consecutive seeds give evenly spread draws, so the mean K over a few prompts is
    already close to K*; every method run on the same (prompt, seed, target) gets
    the same K, which keeps paired comparisons paired.
    """
    return float(((int(seed) + 1) * _GOLDEN) % 1.0)


@dataclass(frozen=True)
class SpeedupCalibration:
    """K = alpha - beta / rho (paper Fig. 3), fitted from measured latencies.

    `budget_for_speedup` picks the attainable K whose predicted speedup is closest
    to the target; targets outside [1, speedup(K_max)] raise `ValueError`.
    `points` ((K, T(K) / T_full) pairs, as measured) when present replace the global
    line inside their range by a quadratic fit through them: on MorcaTiny the line
    overstates the speedup near the ceiling (4.25x fitted against 4.06x measured at
    K = 48 of 50), enough to miss a 4x target by 0.15x; alpha and beta stay the
    paper's summary of the curve.
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
    points: list[list[float]] | None = None

    @cached_property
    def _measured_curve(self) -> tuple[np.ndarray, np.ndarray] | None:
        """1/rho against K from the measured points, on a fine K grid over their range.

        A quadratic least-squares fit (it bends where the line does not, and averages
        the noise of single points: +-10% between consecutive runs on a shared VM);
        if it is not decreasing over the range, the points themselves, made non-increasing.
        """
        if not self.points or len(self.points) < 2:
            return None
        data = np.asarray(sorted(self.points), dtype=float)
        ks, inverse = data[:, 0], data[:, 1]
        grid = np.linspace(ks[0], ks[-1], 20 * int(ks[-1] - ks[0]) + 2)
        if len(ks) >= 4:
            smooth = np.polyval(np.polyfit(ks, inverse, 2), grid)
            if np.all(np.diff(smooth) < 0) and smooth[-1] > 0:
                return grid, smooth
        return grid, np.interp(grid, ks, np.minimum.accumulate(inverse))

    def _inverse_speedup(self, budget: float) -> float:
        """T(K) / T_full without the scheduler's share."""
        measured = self._measured_curve
        if measured is not None and measured[0][0] <= budget <= measured[0][-1]:
            return float(np.interp(budget, *measured))
        return max(self.alpha - budget, 0.0) / self.beta

    def speedup_of_budget(self, budget: float) -> float:
        # 1 / rho = T(K) / T_full; a scheduler adds N c to T(K), i.e. N c / T_full to 1 / rho
        inverse = self._inverse_speedup(budget) + self.scheduler_fraction
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
                             f"this one is: {self.source}. Run morca calibrate.")
        fraction = seconds_per_step * self.num_steps / self.full_latency_s
        costed = replace(self, scheduler_fraction=self.scheduler_fraction + fraction,
                         source=f"{self.source} + scheduler {seconds_per_step * 1e3:.2f} ms/step")
        best = costed.speedup_of_budget(self.max_budget)
        if best < 1.0:
            raise ValueError(f"scheduler_cost_s={seconds_per_step!r}: a scheduler this slow "
                             f"({seconds_per_step * self.num_steps / self.full_latency_s:.0%} of a stock run's "
                             f"{self.full_latency_s:.3f} s) makes even K={self.max_budget} slower than no cache "
                             f"({best:.2f}x); no speedup >= 1 is reachable")
        return costed

    @property
    def speedup_range(self) -> tuple[float, float]:
        return 1.0, self.speedup_of_budget(self.max_budget)

    def attainable_speedups(self) -> np.ndarray:
        return np.array([self.speedup_of_budget(k) for k in range(self.max_budget + 1)])

    def check_speedup(self, speedup: float) -> float:
        if isinstance(speedup, (bool, np.bool_)) or not isinstance(speedup, (int, float, np.floating, np.integer)):
            lo, hi = self.speedup_range
            raise TypeError(f"speedup={speedup!r} must be a number in [{lo:.2f}, {hi:.2f}]")
        lo, hi = self.speedup_range
        if not (math.isfinite(speedup) and lo <= speedup <= hi):
            raise ValueError(
                f"speedup={speedup} is outside the feasible range [{lo:.2f}, {hi:.2f}] "
                f"(K from 0 to {self.max_budget} reuse steps; calibration: {self.source})"
            )
        return float(speedup)

    def fractional_budget(self, speedup: float) -> float:
        """The real-valued K* whose predicted latency is exactly the target's (clipped to [0, K_max])."""
        k = self.budget_at(self.check_speedup(speedup))
        return float(min(max(k, 0.0), self.max_budget))

    def budget_at(self, speedup: float) -> float:
        """The calibration curve read backwards: the (unclipped, unchecked) K predicted to give `speedup`."""
        inverse = 1.0 / speedup - self.scheduler_fraction
        measured = self._measured_curve
        if measured is not None and measured[1][-1] <= inverse <= measured[1][0]:
            return float(np.interp(inverse, measured[1][::-1], measured[0][::-1]))
        return self.alpha - self.beta * inverse

    def budget_for_speedup(self, speedup: float, dither: float | None = None) -> int:
        """The integer K for a target speedup.

        `dither=None`: the K whose predicted speedup is nearest the target. Near the
        ceiling one reuse step moves the speedup by 0.1-0.3x (MorcaTiny, 50 steps), so
        nearest rounding alone misses targets by up to half that. `dither=u` in [0, 1)
        rounds K* up when u < frac(K*), down otherwise: with u spread evenly over
        episodes, the mean latency (linear in K) is the target's, so the mean realised
        speedup hits the target; each episode still runs floor(K*) or ceil(K*).
        """
        if dither is None:
            speedup = self.check_speedup(speedup)
            errors = np.abs(self.attainable_speedups() - speedup)
            return int(np.argmin(errors))
        if not (isinstance(dither, (int, float, np.floating)) and 0.0 <= dither < 1.0):
            raise ValueError(f"dither={dither!r} must be a number in [0, 1)")
        k = self.fractional_budget(speedup)
        low = math.floor(k)
        return int(min(low + (dither < k - low), self.max_budget))

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
                   full_latency_s=float(full_latency_s), num_steps=num_steps,
                   points=[[float(k), float(r)] for k, r in zip(budgets, inv_rho)])

    def to_json(self, path: str | Path) -> None:  # pragma: no mutate block (I/O, tested by a round trip)
        from ..utils.io import atomic_write_text

        atomic_write_text(Path(path), json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def from_json(cls, path: str | Path) -> "SpeedupCalibration":  # pragma: no mutate block (I/O)
        from ..utils.io import read_json

        data = read_json(path, "speedup calibration")
        names = [f.name for f in fields(cls)]
        if not isinstance(data, dict) or not {"alpha", "beta", "max_budget"} <= set(data) <= set(names):
            got = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"speedup calibration {path} is not one (got {got}); it needs alpha, beta, max_budget "
                             f"and may hold {', '.join(f for f in names if f not in ('alpha', 'beta', 'max_budget'))}")
        try:
            return cls(**data)
        except (TypeError, ValueError) as error:
            raise ValueError(f"speedup calibration {path}: {error}") from None
