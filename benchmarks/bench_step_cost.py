"""What each scheduler charges a MorcaTiny episode per step, measured in one run as the evaluation measures it.

    python benchmarks/bench_step_cost.py [--methods best-fixed uniform follow-best-fixed morca] [--repeats 3]

At equal measured speedup every exact-K method pays its own per-step time in K
(`morca_env.evaluation.runner`), so a scheduler that plays the best fixed
schedule is only level with it when it costs about the same per step. Prints
microseconds per step (the median of `--repeats` measurements, each one
warm-up and one timed episode at K = 0) and the ratio to the first method.
"""

from __future__ import annotations

import argparse
import statistics

import gymnasium as gym

import morca_env  # noqa: F401
from morca_env import schedulers
from morca_env.evaluation.episodes import scheduler_step_cost
from morca_env.utils.threads import configure_threads


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", nargs="+", default=["best-fixed", "uniform", "follow-best-fixed", "morca"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    configure_threads(args.threads)
    if "morca" in args.methods:
        import agents.policy  # noqa: F401  (registers "morca", the shipped scheduler)
    env = gym.make("MorcaTiny-v0", budget=0, latent_features=False, lpips=False)
    costs = {}
    for name in args.methods:
        policy = schedulers.make(name, env)
        costs[name] = statistics.median(scheduler_step_cost(policy, env, "a red ball rolling", 1) * 1e6
                                        for _ in range(args.repeats))
    first = args.methods[0]
    for name, us in costs.items():
        print(f"{name:>20}: {us:6.1f} us per step, {us / costs[first]:.2f}x {first}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
