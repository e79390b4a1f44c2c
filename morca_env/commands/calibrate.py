"""Measure latency against the reuse budget K and fit K = alpha - beta / rho (paper Fig. 3).

    morca calibrate --env MorcaTiny-v0                  # saves to ~/.cache/morca/calibration/
    morca calibrate --env MorcaWan21-v0 --repeats 2     # on a GPU with the weights
    morca calibrate --env MorcaTiny-v0 --packaged       # update the package default
    morca calibrate --env MorcaTiny-v0 --thresholds     # SeaCache threshold -> speedup map g(rho)

How it measures: `morca_env.speedup.measure` (stock no-cache generation against uniform
K-reuse env episodes, interleaved rounds, mean latency per K, each timed run the
fastest of `--timing-repeats`). The env picks the fit up
automatically (user file first). Wall-clock ratios drift with the machine's
state: recalibrate before timing anything that matters.

`--thresholds` instead runs plain SeaCache (no budget) for a grid of thresholds
on training prompts and records the mean realised K, converted to a speedup with
the env's calibration: the map g(rho) used by the threshold-curve behaviour
policy and by the global-threshold SeaCache baseline (`<model>_threshold.json`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import gymnasium as gym
import numpy as np
from tqdm import tqdm

import morca_env  # noqa: F401
from morca_env.speedup.measure import measure_calibration
from morca_env.speedup.files import calibration_file
from morca_env.rollout import rollout
from morca_env.utils.threads import configure_threads
from morca_env.cli import (env_id, json_dict, nonnegative_int, output_file, positive_int, show_library_messages,
                           thread_count)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="morca calibrate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", type=env_id, default="MorcaTiny-v0", help="registered env id")
    p.add_argument("--env-kwargs", type=json_dict, default={}, help="JSON dict of extra env kwargs")
    p.add_argument("--budgets", type=nonnegative_int, nargs="*", help="K values (default: morca_env.speedup.measure.default_budgets, denser near K_max)")
    p.add_argument("--repeats", type=positive_int, default=6, help="rounds over all budgets")
    p.add_argument("--threads", type=thread_count, default=None, help="torch threads (default: chosen from the free cores, see morca_env.utils.threads)")
    p.add_argument("--timing-repeats", type=positive_int, default=3,
                   help="each timed run counts by its fastest of this many back-to-back runs (1: single runs)")
    p.add_argument("--out", type=output_file, help="output JSON (default: the user calibration dir)")
    p.add_argument("--packaged", action="store_true", help="write the package's default calibration instead")
    p.add_argument("--thresholds", action="store_true", help="fit the SeaCache threshold -> speedup map instead")
    p.add_argument("--prompts", type=positive_int, default=8, help="training prompts per threshold (--thresholds)")
    return p.parse_args(argv)


def calibrate_thresholds(args, kwargs) -> int:
    from morca_env.speedup.files import ThresholdMap
    from morca_env.schedulers.rules.seacache import SeaCacheThreshold

    env = gym.make(args.env, budget=0, enforce_budget=False, **kwargs).unwrapped
    rng = np.random.default_rng(0)
    pairs = [env.suite.sample(rng) for _ in range(args.prompts)]
    deltas = np.geomspace(0.01, 4.0, 16)
    rows = []
    for delta in tqdm(deltas, desc=f"thresholds {args.env}", unit="threshold"):
        policy = SeaCacheThreshold(float(delta))
        budgets = []
        for prompt, seed in pairs:
            budgets.append(rollout(env, policy, {"prompt": prompt, "seed": seed}).num_reuse)
        k = float(np.mean(budgets))
        rows.append((float(delta), k, env.calibration.speedup_of_budget(k)))
    print(f"{'delta':>8} {'mean K':>7} {'speedup':>8}")
    for delta, k, rho in rows:
        print(f"{delta:>8.4f} {k:>7.2f} {rho:>8.3f}")
    speedups, thresholds = [], []
    for delta, k, rho in rows:  # keep a strictly increasing, finite part of the curve
        if np.isfinite(rho) and (not speedups or rho > speedups[-1] + 1e-6) and k < env.budget_spec.max_budget:
            speedups.append(rho)
            thresholds.append(delta)
    name = env.preset.name
    tmap = ThresholdMap(speedups, thresholds, source=f"morca calibrate --env {args.env} --thresholds --prompts {args.prompts}, "
                                                      f"{time.strftime('%Y-%m-%d')}")
    out = args.out or calibration_file(f"{name}_threshold.json", "packaged" if args.packaged else "user")
    from morca_env.utils.io import atomic_write_text

    atomic_write_text(out, json.dumps(tmap.to_dict(), indent=2) + "\n")
    print(f"saved to {out}")
    env.close()
    return 0


def main(argv=None) -> int:
    show_library_messages()
    args = parse_args(argv)
    args.threads = configure_threads(args.threads)
    kwargs = {"lpips": False, **args.env_kwargs}
    if args.thresholds:
        return calibrate_thresholds(args, kwargs)
    env = gym.make(args.env, budget=0, **kwargs).unwrapped
    too_big = [k for k in (args.budgets or []) if k > env.budget_spec.max_budget]
    if too_big:
        env.close()
        raise SystemExit(f"morca calibrate: --budgets {too_big[0]} exceeds this env's largest reuse budget; valid: "
                         f"0 to {env.budget_spec.max_budget}")
    measured = measure_calibration(env, args.budgets, args.repeats, threads=args.threads,
                                  timing_repeats=args.timing_repeats)
    print("\n" + measured.table())
    name = env.preset.name
    out = args.out or calibration_file(f"{name}.json", "packaged" if args.packaged else "user")
    measured.calibration.to_json(out)
    print(f"saved to {out}")
    env.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
