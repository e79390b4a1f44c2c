"""Measure the speedup calibration K = alpha - beta / rho on this machine, now.

Wall-clock speedups drift with the machine's state (on a shared 2-core VM the
env-to-stock latency ratio moved ~6% within hours), so a calibration is only as
good as it is recent: `scripts/calibrate.py` saves one, and `scripts/evaluate.py
--calibrate` / `benchmarks/bench_env.py` measure one right before they time.

rho = T_full / T(K): T_full is the stock no-cache generation (no scheduler inputs
computed), T(K) an env episode with a uniform K-reuse schedule (cache hooks,
SeaCache signal and latent features included). Each round times one stock
generation and every budget (in a shuffled order) on one prompt, so drift
between rounds hits both sides of the ratio alike (consecutive MorcaTiny
generations on the shared VM differ by up to 15%). A budget's 1/rho is its mean
latency over the rounds divided by the mean stock latency: the same definition
of speedup (ratio of mean latencies) that the evaluation reports.

With `timing_repeats=R` every timed run is repeated R times back to back and
counts by its fastest (timeit's convention): the noise of a shared machine only
ever adds time, so the minimum estimates what the computation costs; on this
VM min-of-3 cut the spread of a stock generation from 13% to 6%.

This module is the speedup calibration's one home: measuring it (`measure_calibration`),
its files (this machine's under the cache root's `calibration/`, the packaged ones
shipped with `morca_env`; `calibration_file`, `find_calibration_file`, `load_calibration`)
and the global-threshold maps g(rho) that turn a target speedup into a rule's threshold
(`ThresholdMap`, `threshold_map_from_counts`, `load_threshold_map`). The map K(rho) itself,
`SpeedupCalibration`, is part of the budget (`morca_env.budget`).
"""

from __future__ import annotations

import json
import math
import platform
import time
import warnings
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .budget import SpeedupCalibration
from .paths import cache_root


@dataclass
class CalibrationMeasurement:
    """The fit and what it was fitted to (mean latency per K, mean stock latency)."""

    calibration: SpeedupCalibration
    budgets: list[int]
    mean_latency_s: dict[int, float]
    full_latency_s: float

    def table(self) -> str:
        calib = self.calibration
        lines = [f"T_full (stock, no cache) = {self.full_latency_s:.3f} s",
                 f"{'K':>4} {'latency s':>10} {'speedup':>8} {'fit speedup':>11}"]
        for k in self.budgets:
            lines.append(f"{k:>4} {self.mean_latency_s[k]:>10.3f} {self.full_latency_s / self.mean_latency_s[k]:>8.3f}"
                         f" {calib.speedup_of_budget(k):>11.3f}")
        lines.append(f"fit: K = {calib.alpha:.3f} - {calib.beta:.3f} / rho   "
                     f"(feasible speedups 1.00 - {calib.speedup_range[1]:.2f})")
        if 0 in self.budgets and self.mean_latency_s[0] > self.full_latency_s:
            lines.append(f"K = 0 runs at {self.full_latency_s / self.mean_latency_s[0]:.3f}x, not 1x: an episode also "
                         "computes the scheduler's inputs (step distance, features), which a stock run does not; "
                         "that cost is in every episode's latency and in the fit")
        return "\n".join(lines)


def default_budgets(max_budget: int) -> list[int]:
    """7 budgets evenly over [0, K_max] plus every other K of the top 8, where one reuse step
    moves the speedup most (0.1-0.3x on MorcaTiny) and the usual targets (2-4x) live."""
    spread = np.linspace(0, max_budget, 7).round().astype(int).tolist()
    top = range(max(0, max_budget - 8), max_budget + 1, 2)
    return sorted({0, *spread, *top})


def fastest(run, repeats: int) -> float:
    """The smallest of `repeats` calls of `run() -> seconds` (one timed measurement, timeit-style)."""
    if repeats < 1:
        raise ValueError(f"timing repeats={repeats!r} must be >= 1")
    return min(run() for _ in range(repeats))


def stock_seconds(env, prompt: str, seed: int) -> float:
    """Seconds of one stock no-cache generation (no scheduler inputs computed)."""
    env.denoiser.generate(prompt=prompt, seed=seed)
    return env.denoiser.elapsed_s


def run_uniform_episode(env, options: dict) -> dict:
    from .policies import UniformInterval  # here, not at the top: policies reads threshold maps from this module
    from .rollout import rollout

    return rollout(env, UniformInterval(), options).info


def measure_calibration(env, budgets: list[int] | None = None, repeats: int = 3, threads: int | None = None,
                        progress: bool = True, timing_repeats: int = 1) -> CalibrationMeasurement:
    """Time the stock generation and uniform K-reuse episodes of `env` (unwrapped MorcaEnv) and fit.

    `repeats` rounds (prompts); each timed run is the fastest of `timing_repeats` back-to-back runs."""
    if repeats < 1:
        raise ValueError(f"repeats={repeats!r} must be >= 1")
    if timing_repeats < 1:
        raise ValueError(f"timing_repeats={timing_repeats!r} must be >= 1")
    spec = env.budget_spec
    budgets = sorted(set(budgets)) if budgets else default_budgets(spec.max_budget)
    for k in budgets:
        spec.check_budget(k)
    prompts = env.suite.pairs()
    rng = np.random.default_rng(0)
    samples: dict[int, list[float]] = {k: [] for k in budgets}
    full: list[float] = []
    bar = tqdm(total=repeats * (len(budgets) + 1), desc=f"calibrate {env.preset.name}", unit="measurement",
               disable=not progress)
    env.denoiser.generate(prompt=prompts[0][0], seed=prompts[0][1])  # warm-up
    for round_index in range(repeats):
        prompt, seed = prompts[round_index % len(prompts)]
        full.append(fastest(lambda: stock_seconds(env, prompt, seed), timing_repeats))  # the round's stock latency
        bar.update()
        for k in rng.permutation(budgets).tolist():
            options = {"prompt": prompt, "seed": seed, "budget": k}
            samples[k].append(fastest(lambda: run_uniform_episode(env, options)["latency_s"], timing_repeats))
            bar.update()
    bar.close()
    t_full = float(np.mean(full))
    mean = {k: float(np.mean(v)) for k, v in samples.items()}
    where = "cuda" if env.device.type == "cuda" else "cpu"
    calibration = SpeedupCalibration.fit(
        budgets, [mean[k] for k in budgets], max_budget=spec.max_budget, num_steps=env.num_steps,
        full_latency_s=t_full,
        source=f"measured on {platform.node()} ({where}, {threads if threads else '?'} threads, "
               f"fastest of {timing_repeats}) "
               f"{time.strftime('%Y-%m-%d %H:%M')}")
    return CalibrationMeasurement(calibration, budgets, mean, t_full)


# ---------------------------------------------------------------- files
def user_calibration_dir() -> Path:
    return cache_root() / "calibration"


def packaged_calibration_path(name: str) -> Path:
    return Path(str(resources.files("morca_env"))) / "calibration" / f"{name}.json"


_warned: set[str] = set()


def calibration_file(filename: str, where: str = "user") -> Path:
    """Where a calibration file is written: `where` is "user" (this machine's, found first), "packaged" (the copy
    shipped with the package) or a directory."""
    if where == "user":
        return user_calibration_dir() / filename
    if where == "packaged":
        return packaged_calibration_path(filename.removesuffix(".json"))
    return Path(where) / filename


def find_calibration_file(filename: str) -> Path | None:
    """The user's calibration file (written by scripts/calibrate.py) if any, else the packaged one."""
    for path in (user_calibration_dir() / filename, packaged_calibration_path(filename.removesuffix(".json"))):
        if path.is_file():
            return path
    return None


def load_threshold_map(name: str):
    """g(rho) for the threshold-curve behaviour policy and the global-threshold SeaCache baseline."""
    path = find_calibration_file(f"{name}_threshold.json")
    if path is None:
        raise FileNotFoundError(f"no threshold map for {name!r}; run `python scripts/calibrate.py --thresholds` "
                                "for this env")
    return ThresholdMap.from_dict(json.loads(path.read_text()))


def load_calibration(name: str, num_steps: int, max_budget: int) -> SpeedupCalibration:
    """The calibration `scripts/calibrate.py` saved for this machine, else the packaged one, else the ideal model.

    A calibration made for another step count is rescaled (alpha, beta proportional
    to N, since each step costs the same) with a one-time warning.
    """
    from .models.presets import PRESETS

    if name not in PRESETS:
        raise ValueError(f"calibration={name!r} is not a registered model; valid: {', '.join(sorted(PRESETS))}, "
                         "a SpeedupCalibration, or a path to a calibration JSON file")
    path = find_calibration_file(f"{name}.json")
    if path is not None:
        calib = SpeedupCalibration.from_json(path)
    else:
        if name not in _warned:
            warnings.warn(f"no speedup calibration for {name!r}; using the ideal model K = N (1 - 1/rho). "
                          "Run scripts/calibrate.py to measure one.", stacklevel=3)
            _warned.add(name)
        return SpeedupCalibration(alpha=float(num_steps), beta=float(num_steps), max_budget=max_budget,
                                  source="ideal model (uncalibrated)")
    steps = calib.num_steps or num_steps
    if steps != num_steps:
        scale = num_steps / steps
        if (name, num_steps) not in _warned:
            warnings.warn(f"calibration for {name!r} was made at {steps} steps; rescaling to {num_steps}", stacklevel=3)
            _warned.add((name, num_steps))
        full = calib.full_latency_s * scale if calib.full_latency_s else calib.full_latency_s
        points = [[k * scale, r] for k, r in calib.points] if calib.points else None
        calib = replace(calib, alpha=calib.alpha * scale, beta=calib.beta * scale, num_steps=num_steps,
                        full_latency_s=full, points=points, source=f"{calib.source} (rescaled from {steps} steps)")
    return replace(calib, max_budget=max_budget)


# ---------------------------------------------------------------- threshold maps
class ThresholdMap:
    """g(rho): the global SeaCache threshold whose mean realised speedup is rho (interpolated in log delta).

    Built from (speedup, threshold) pairs measured by `scripts/calibrate.py --thresholds`
    (or, for Wan2.1 / Wan2.2, the paper's Table 7 settings).
    """

    def __init__(self, speedups, thresholds, source: str = "unspecified"):
        order = np.argsort(speedups)
        self.speedups = np.asarray(speedups, dtype=float)[order]
        self.thresholds = np.asarray(thresholds, dtype=float)[order]
        if len(self.speedups) < 2 or np.any(self.thresholds <= 0) or np.any(np.diff(self.speedups) <= 0):
            raise ValueError("a threshold map needs >= 2 points with distinct speedups and positive thresholds")
        self.source = source

    def __call__(self, speedup: float) -> float:
        log_delta = np.log(self.thresholds)
        x, y = self.speedups, log_delta
        if speedup <= x[0]:
            slope = (y[1] - y[0]) / (x[1] - x[0])
            return float(np.exp(y[0] + slope * (speedup - x[0])))
        if speedup >= x[-1]:
            slope = (y[-1] - y[-2]) / (x[-1] - x[-2])
            return float(np.exp(y[-1] + slope * (speedup - x[-1])))
        return float(np.exp(np.interp(speedup, x, y)))

    def recalibrated(self, old, new) -> "ThresholdMap":
        """The same thresholds with speedups re-read through a newer calibration.

        The map's speedups are mean realised budgets K converted with the calibration
        of the time (`old`); a threshold's K does not depend on the machine, so reading
        `old` backwards and `new` forwards gives today's speedup.
        """
        speedups = [new.speedup_of_budget(old.budget_at(rho)) for rho in self.speedups]
        keep = []  # a strictly increasing, finite part: thresholds whose K reads as one speedup say nothing more
        for i, rho in enumerate(speedups):
            if np.isfinite(rho) and (not keep or rho > speedups[keep[-1]] + 1e-9):
                keep.append(i)
        if len(keep) < 2:
            raise ValueError(f"the threshold map re-read through {new.source!r} keeps fewer than 2 distinct speedups "
                             f"({[round(float(r), 3) for r in speedups]}); measure the calibration again")
        return ThresholdMap(np.asarray(speedups)[keep], self.thresholds[keep],
                            source=f"{self.source}, recalibrated: {new.source}")

    def to_dict(self) -> dict:
        return {"speedups": self.speedups.tolist(), "thresholds": self.thresholds.tolist(), "source": self.source}

    @classmethod
    def from_dict(cls, data: dict) -> "ThresholdMap":
        return cls(data["speedups"], data["thresholds"], data.get("source", "unspecified"))


def threshold_map_from_counts(name: str, grid, counts, calibration, source: str) -> ThresholdMap:
    """A ThresholdMap from reuse counts (mean K over prompts, or one K) measured at increasing thresholds `grid`:
    each distinct count with the geometric middle of its thresholds, at the speedup `calibration` predicts."""
    grid, counts = np.asarray(grid, dtype=float), np.asarray(counts, dtype=float)
    speedups, thresholds = [], []
    for k in np.unique(counts):
        run = grid[counts == k]
        speedup = calibration.speedup_of_budget(float(k))
        if math.isfinite(speedup):
            speedups.append(speedup)
            thresholds.append(float(np.sqrt(run[0] * run[-1])))
    if len(speedups) < 2:
        raise ValueError(f"{name}: its reuse count takes fewer than two values over thresholds "
                         f"{grid[0]:g}..{grid[-1]:g}; no threshold map can be fitted")
    order = np.argsort(speedups)
    speedups, thresholds = np.asarray(speedups)[order], np.asarray(thresholds)[order]
    keep = np.concatenate([[True], np.diff(speedups) > 0])
    return ThresholdMap(speedups[keep], thresholds[keep], source=f"{name}: {source}")
