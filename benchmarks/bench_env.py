"""MorcaEnv on this machine: realised speedup against target after calibration, and the env's own overhead.

    python benchmarks/bench_env.py [--env MorcaTiny-v0] [--prompts 6] [--threads 1]

For each prompt (held-out eval suite): the stock no-cache generation is timed,
then one env episode per target (uniform schedule at the calibrated K), in the
same run and interleaved, so machine noise hits all of them alike. Realised
speedup = stock latency / episode latency. Overhead = everything the env does
besides transformer calls, the scheduler step and decoding (SeaCache signal,
latent features, masks, bookkeeping), as a fraction of an average step.
Goal (issue): mean |realised - target| <= 0.05 (the paper reaches 0.05 on Wan2.1).
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np
import torch

import morca_env  # noqa: F401
from morca_env.policies import UniformInterval


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--env", default="MorcaTiny-v0")
    p.add_argument("--prompts", type=int, default=6)
    p.add_argument("--targets", type=float, nargs="+", default=[2.0, 3.0, 4.0])
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    env = gym.make(args.env, budget=0, prompts="tiny-eval" if "Tiny" in args.env else "vbench-eval", lpips=False).unwrapped
    policy = UniformInterval()
    pairs = env.suite.pairs()[: args.prompts]
    realised = {t: [] for t in args.targets}
    overhead_fraction = []
    env.denoiser.generate(prompt=pairs[0][0], seed=pairs[0][1])  # warm-up
    for prompt, seed in pairs:
        env.denoiser.generate(prompt=prompt, seed=seed)
        stock = env.denoiser.elapsed_s
        for target in args.targets:
            obs, info = env.reset(options={"prompt": prompt, "seed": seed, "speedup": target})
            policy.reset(obs, info)
            done = False
            while not done:
                obs, _, done, _, info = env.step(policy(obs))
            realised[target].append(stock / info["latency_s"])
            overhead_fraction.append(info["overhead_s"] / info["latency_s"])
    print(f"{args.env}, {len(pairs)} prompts, {args.threads} thread(s); calibration: {env.calibration.source}")
    print(f"{'target':>7} {'K':>4} {'realised (mean)':>16} {'|err| (mean)':>13}")
    errors = []
    for target in args.targets:
        values = np.array(realised[target])
        err = float(np.abs(values.mean() - target))
        errors.append(err)
        print(f"{target:>6.1f}x {env.calibration.budget_for_speedup(target):>4} {values.mean():>15.3f}x {err:>13.3f}"
              f"   (per-episode spread {values.std():.3f})")
    print(f"mean |realised - target| over targets: {np.mean(errors):.3f}  (goal <= 0.05)")
    print(f"env overhead: {100 * np.mean(overhead_fraction):.2f}% of episode latency "
          f"(= of an average step), per-episode range {100 * np.min(overhead_fraction):.2f}-{100 * np.max(overhead_fraction):.2f}%")


if __name__ == "__main__":
    main()
