"""What a training episode costs: the training env's fixed pool against a fixed-seed episode and a fresh seed per
episode, measured in one run, interleaved so that machine noise hits all three alike.

    python benchmarks/bench_training_env.py [--env MorcaTiny-v0] [--episodes 24] [--threads 1]

* fixed seed: one (prompt, seed) replayed, its reference cached (the floor: an episode and nothing else);
* pool: `benchmark.training_env` (`Suite.train_pool`), after one pass that renders the references of the pairs
  it will draw (what every later pass over the pool costs);
* fresh seed: the training prompts with a new seed every reset (each episode renders its own reference first).

Episodes play a uniform schedule at the env's sampled K (the policy's cost is not what is measured).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import torch
from tqdm import tqdm

import morca_env  # noqa: F401
from morca_env.evaluation import benchmark
from morca_env import schedulers
from morca_env.prompts import get_suite
from morca_env.rollout import rollout


def episode_seconds(env, scheduler, options: dict | None, seed: int | None) -> float:
    start = time.perf_counter()
    rollout(env, scheduler, options, seed=seed)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="MorcaTiny-v0")
    p.add_argument("--episodes", type=int, default=24)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    suite = benchmark.suite_of(args.env)
    with tempfile.TemporaryDirectory() as cache:
        envs = {"pool": benchmark.training_env(args.env, reference_cache_dir=cache),
                "fresh seed": benchmark.training_env(args.env, prompts=suite.train_prompts, reference_cache_dir=cache)}
        envs["fixed seed"] = envs["pool"]
        prompt, seed = get_suite(suite.train_pool).pairs()[0]
        fixed = {"prompt": prompt, "seed": seed}
        uniform = schedulers.make("uniform")
        for i in tqdm(range(args.episodes), desc="warm the pool's references", unit="episode"):
            rollout(envs["pool"], uniform, None, seed=1000 + i)
        rollout(envs["pool"], uniform, fixed)
        seconds: dict[str, list[float]] = {name: [] for name in ("fixed seed", "pool", "fresh seed")}
        for i in tqdm(range(args.episodes), desc="timed", unit="round"):
            seconds["fixed seed"].append(episode_seconds(envs["fixed seed"], uniform, fixed, None))
            seconds["pool"].append(episode_seconds(envs["pool"], uniform, None, 1000 + i))  # the warmed draws
            seconds["fresh seed"].append(episode_seconds(envs["fresh seed"], uniform, None, 5000 + i))
    base = float(np.mean(seconds["fixed seed"]))
    print(f"{args.env}, {args.episodes} episodes each, {args.threads} thread(s)")
    print("| episodes | s / episode | x fixed seed |\n|---|---|---|")
    for name, values in seconds.items():
        print(f"| {name} | {np.mean(values):.3f} | {np.mean(values) / base:.2f} |")


if __name__ == "__main__":
    main()
