"""Measure the speedup calibration K = alpha - beta / rho on this machine, now.

Wall-clock speedups drift with the machine's state (on a shared 2-core VM the
env-to-stock latency ratio moved ~6% within hours), so a calibration is only as
good as it is recent: `morca calibrate` saves one, and `morca evaluate
--calibrate` and the project's env benchmark measure one right before they time.

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

This module measures the speedup calibration (`measure_calibration`); its files and
the global-threshold maps g(rho) read from them live in `morca_env.speedup.files`.
The map K(rho) itself, `SpeedupCalibration`, is part of the budget (`morca_env.budget`).
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from .calibration import SpeedupCalibration
from ..rollout import rollout
from ..schedulers.fixed import UniformInterval


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
