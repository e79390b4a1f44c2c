"""What one episode costs on each CPU testbed, measured in one run: MorcaScenes-v0 against MorcaTiny-v0.

    python benchmarks/bench_testbed_cost.py [--prompts 6] [--timing-repeats 3] [--threads 1]

For each testbed and each of `--prompts` eval prompts: the stock no-cache generation
(50 steps, CFG) and a full env episode with no reuse (K = 0: every step recomputes, and
the env computes its signal and features on top), each the fastest of
`--timing-repeats` back-to-back runs. The two testbeds alternate prompt by prompt, so
the machine's drift hits both alike. Prints the mean seconds and the ratio of
MorcaScenes to MorcaTiny; the testbed's design bound is 2x on one core.
"""

from __future__ import annotations

import argparse
import warnings

import gymnasium as gym
import numpy as np
import torch

import morca_env  # noqa: F401
from morca_env.speedup.measure import fastest, stock_seconds
from morca_env.cli import positive_int
from morca_env.rollout import rollout
from morca_env import make_scheduler

ENVS = ("MorcaTiny-v0", "MorcaScenes-v0")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=positive_int, default=6)
    p.add_argument("--timing-repeats", type=positive_int, default=3)
    p.add_argument("--threads", type=positive_int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        envs = {env_id: gym.make(env_id, budget=0, lpips=False).unwrapped for env_id in ENVS}
    times = {env_id: {"stock": [], "episode": []} for env_id in ENVS}
    for i in range(args.prompts):
        for env_id, env in envs.items():
            prompt, seed = env.suite.pairs()[i]
            options = {"prompt": prompt, "seed": seed, "budget": 0}
            rollout(env, make_scheduler("uniform"), options)  # the reference is made here, outside the clock
            times[env_id]["stock"].append(fastest(lambda: stock_seconds(env, prompt, seed), args.timing_repeats))
            times[env_id]["episode"].append(fastest(lambda: rollout(env, make_scheduler("uniform"), options).info["latency_s"],
                                                    args.timing_repeats))
    print(f"{args.prompts} eval prompts, {args.threads} thread(s), fastest of {args.timing_repeats}")
    print(f"{'':<16}{'stock s':>10}{'episode s':>12}")
    means = {env_id: {k: float(np.mean(v)) for k, v in t.items()} for env_id, t in times.items()}
    for env_id in ENVS:
        print(f"{env_id:<16}{means[env_id]['stock']:>10.3f}{means[env_id]['episode']:>12.3f}")
    ratio = {k: means["MorcaScenes-v0"][k] / means["MorcaTiny-v0"][k] for k in ("stock", "episode")}
    print(f"{'Scenes / Tiny':<16}{ratio['stock']:>9.2f}x{ratio['episode']:>11.2f}x   (bound: 2x)")
    return ratio


if __name__ == "__main__":
    main()
