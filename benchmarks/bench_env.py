"""MorcaEnv on this machine: realised speedup against target after calibration, and the env's own overhead.

    python benchmarks/bench_env.py [--env MorcaTiny-v0] [--prompts 20] [--threads 1] [--calibrate 8] [--timing-repeats 3]
    python benchmarks/bench_env.py --env-kwargs '{"latent_features": false}'   # the env rule schedulers need

First the speedup calibration is measured on this machine, now (`--calibrate 0`:
use the installed one; wall-clock ratios on a shared VM drift by several % within
hours, more than the goal). Then, for each prompt (held-out eval suite): the stock no-cache generation is timed,
then one env episode per target (uniform schedule at the calibrated K, dithered
between floor(K*) and ceil(K*) by the generation seed, the env's default), in the
same run and interleaved, so machine noise hits all of them alike. Every timing
(calibration included) is the fastest of `--timing-repeats` back-to-back runs
(timeit's convention: a shared machine's noise only adds time). `--feedback`
closes the loop: each target's `SpeedupGovernor` asks for the speedup that the
speedups realised so far say will give the target (drift correction). Realised
speedup = mean stock latency / mean episode latency over the prompts (the ratio
of the latency columns, as in the paper's tables; the mean of per-episode ratios
is printed too). Overhead = everything the env does
besides transformer calls, the scheduler step and decoding (SeaCache signal,
latent features, masks, bookkeeping), as a fraction of an average step.
Goal: mean |realised - target| <= 0.05 (the paper reaches 0.05 on Wan2.1).
"""

from __future__ import annotations

import argparse
import json

import gymnasium as gym
import numpy as np
import torch
from tqdm import tqdm

import morca_env  # noqa: F401
from morca_env.speedup.measure import fastest, measure_calibration, run_uniform_episode, stock_seconds
from morca_env.speedup.governor import SpeedupGovernor


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--env", default="MorcaTiny-v0")
    p.add_argument("--env-kwargs", default="{}", help="JSON dict of extra env kwargs")
    p.add_argument("--prompts", type=int, default=20)
    p.add_argument("--calibrate", type=int, default=8, metavar="ROUNDS",
                   help="calibration rounds measured first (0: the installed calibration)")
    p.add_argument("--targets", type=float, nargs="+", default=[2.0, 3.0, 4.0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--timing-repeats", type=int, default=3, help="each timing is the fastest of this many runs")
    p.add_argument("--feedback", action="store_true",
                   help="closed loop: a SpeedupGovernor per target corrects the requested speedup by the speedups "
                        "realised so far (morca_env.speedup.governor)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    kwargs = {"lpips": False, **json.loads(args.env_kwargs)}
    from morca_env.models.presets import preset_for_env

    env = gym.make(args.env, budget=0, prompts=preset_for_env(args.env).eval_suite, **kwargs).unwrapped
    if args.calibrate:
        measured = measure_calibration(env, repeats=args.calibrate, threads=args.threads,
                                       timing_repeats=args.timing_repeats)
        print(measured.table())
        env.calibration = measured.calibration
    lo, hi = env.calibration.speedup_range
    if any(not lo <= t <= hi for t in args.targets):
        raise SystemExit(f"targets {args.targets} are not all within the speedups this env reaches here, "
                         f"[{lo:.2f}, {hi:.2f}] ({env.calibration.source})")
    governors = {t: SpeedupGovernor(t, (lo, hi)) for t in args.targets}
    pairs = env.suite.pairs()[: args.prompts]
    realised = {t: [] for t in args.targets}
    latency = {t: [] for t in args.targets}
    stocks = []
    budgets = {t: [] for t in args.targets}
    overhead_fraction = []
    env.denoiser.generate(prompt=pairs[0][0], seed=pairs[0][1])  # warm-up
    for prompt, seed in tqdm(pairs, desc="bench_env", unit="prompt"):
        stock = fastest(lambda: stock_seconds(env, prompt, seed), args.timing_repeats)
        stocks.append(stock)
        for target in args.targets:
            requested = governors[target].request() if args.feedback else target
            runs = [run_uniform_episode(env, {"prompt": prompt, "seed": seed, "speedup": requested})
                    for _ in range(args.timing_repeats)]
            info = min(runs, key=lambda i: i["latency_s"])
            governors[target].record(requested, stock, info["latency_s"])
            realised[target].append(stock / info["latency_s"])
            latency[target].append(info["latency_s"])
            budgets[target].append(info["budget"])
            overhead_fraction.append(info["overhead_s"] / info["latency_s"])
    print(f"{args.env} {args.env_kwargs}, {len(pairs)} prompts, {args.threads} thread(s), fastest of {args.timing_repeats}, "
          f"{'closed loop (governor)' if args.feedback else 'open loop'}; "
          f"calibration: {env.calibration.source}")
    print(f"{'target':>7} {'K* (K run, mean)':>18} {'realised':>9} {'|err|':>6}   (mean of per-episode ratios)")
    errors = []
    for target in args.targets:
        values = np.array(realised[target])
        speedup = float(np.mean(stocks) / np.mean(latency[target]))
        err = abs(speedup - target)
        errors.append(err)
        k_run = f"{env.calibration.fractional_budget(target):.2f} ({np.mean(budgets[target]):.2f})"
        if args.feedback:
            k_run += f" m={governors[target].machine_factor:.3f}"
        print(f"{target:>6.1f}x {k_run:>18} {speedup:>8.3f}x {err:>6.3f}   ({values.mean():.3f}x, "
              f"per-episode spread {values.std():.3f}, standard error {values.std() / np.sqrt(len(values)):.3f})")
    print(f"mean |realised - target| over targets: {np.mean(errors):.3f}  (goal <= 0.05)")
    print(f"env overhead: {100 * np.mean(overhead_fraction):.2f}% of episode latency "
          f"(= of an average step), per-episode range {100 * np.min(overhead_fraction):.2f}-{100 * np.max(overhead_fraction):.2f}%")


if __name__ == "__main__":
    main()
