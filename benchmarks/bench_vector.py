"""Batched episodes: episodes/s of MorcaVectorEnv at N = 1..32 against one MorcaEnv and gymnasium's SyncVectorEnv,
on 1 and 2 torch threads, with memory per sub-env; then collection end to end with and without batching. One run,
so the ratios share the machine's load.

    python benchmarks/bench_vector.py [--episodes 32] [--sizes 1 2 4 8 16 32] [--threads 1 2] [--collect 64]

Every configuration plays the same episodes (env seeds base .. base + episodes - 1, target 3x, a random feasible
policy that differs per sub-env, so batches mix reuse and recompute rows), with their references generated before
the clock; each env's first reset (its stock timing runs) is not timed either. Memory: the process's resident
set after the env's first episode minus before it was built, per sub-env (this is the batch's working set on the
CPU; on a GPU read torch.cuda.max_memory_allocated, benchmarks/bench_wan_gpu.py). Collection: `collect_dataset`
of the quickstart's mixture recipe with 2 worker processes of one thread each, references generated inside the
run as in the quickstart, with num_envs = 1 and 8.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

ENV_KWARGS = {"lpips": False, "speedup": 3.0, "prompts": "tiny-train"}


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def play(envs, seeds: list[int], rng: np.random.Generator) -> None:
    """The episodes of `seeds`, num_envs at a time, each sub-env reusing where it may with probability 0.8."""
    vector = hasattr(envs, "num_envs")
    n = envs.num_envs if vector else 1
    for start in range(0, len(seeds), n):
        if not vector:
            obs, _ = envs.reset(seed=seeds[start])
            done = False
            while not done:
                action = int(obs["action_mask"][1] and rng.random() < 0.8)
                obs, _, done, _, _ = envs.step(action if obs["action_mask"][action] else 1 - action)
            continue
        obs, _ = envs.reset(seed=seeds[start])
        done = False
        while not done:
            mask = obs["action_mask"]
            wish = ((mask[:, 1] == 1) & (rng.random(n) < 0.8)).astype(np.int64)
            actions = np.where(mask[np.arange(n), wish] == 1, wish, 1 - wish)
            obs, _, terminated, _, _ = envs.step(actions)
            done = bool(terminated.all())


def episodes_per_second(make, seeds: list[int]) -> tuple[float, float]:
    """(episodes/s, resident MiB per sub-env) of the env `make()` builds, its first reset untimed."""
    before = resident_bytes()
    envs = make()
    n = getattr(envs, "num_envs", 1)
    envs.reset(seed=seeds[0])  # the stock timing runs of its first reset
    play(envs, seeds[:n], np.random.default_rng(1))
    memory = (resident_bytes() - before) / n / 2**20
    t0 = time.perf_counter()
    play(envs, seeds, np.random.default_rng(0))
    rate = len(seeds) / (time.perf_counter() - t0)
    envs.close()
    return rate, memory


def bench_envs(args) -> None:
    import gymnasium as gym
    import torch

    import morca_env  # noqa: F401

    seeds = list(range(1000, 1000 + args.episodes))
    warm = gym.make("MorcaTiny-v0", **ENV_KWARGS)
    for seed in seeds:  # the references of every timed episode, before the clock
        warm.reset(seed=seed)
    warm.close()
    for threads in args.threads:
        torch.set_num_threads(threads)
        print(f"\n{threads} torch thread(s), {args.episodes} episodes at 3x per configuration")
        print(f"{'configuration':<22} {'episodes/s':>10} {'vs 1 env':>9} {'MiB/sub-env':>12}")
        base, _ = episodes_per_second(lambda: gym.make("MorcaTiny-v0", **ENV_KWARGS), seeds)
        print(f"{'MorcaEnv (one)':<22} {base:>10.2f} {1.0:>8.2f}x {'':>12}")
        rate, memory = episodes_per_second(
            lambda: gym.make_vec("MorcaTiny-v0", num_envs=8, vectorization_mode="sync", **ENV_KWARGS), seeds)
        print(f"{'SyncVectorEnv N=8':<22} {rate:>10.2f} {rate / base:>8.2f}x {memory:>12.1f}")
        for n in args.sizes:
            rate, memory = episodes_per_second(
                lambda: gym.make_vec("MorcaTiny-v0", num_envs=n, vectorization_mode="vector_entry_point",
                                     **ENV_KWARGS), seeds)
            print(f"{f'MorcaVectorEnv N={n}':<22} {rate:>10.2f} {rate / base:>8.2f}x {memory:>12.1f}")


def bench_collection(args) -> None:
    from morca_env.data import CollectionRecipe, collect_dataset

    root = tempfile.mkdtemp(prefix="morca-bench-vector-")
    os.environ["MINARI_DATASETS_PATH"] = os.path.join(root, "minari")
    recipe = CollectionRecipe.from_file("morca/tiny/mixture-v0")
    print(f"\ncollection end to end: {args.collect} episodes of {recipe.dataset_id}'s recipe, 2 workers x 1 thread, "
          "references generated in the run")
    rates = {}
    for num_envs in (1, 8):
        os.environ["MORCA_CACHE_DIR"] = os.path.join(root, f"cache-{num_envs}")  # fresh references each
        t0 = time.perf_counter()
        collect_dataset(f"bench/vector{num_envs}-v0", recipe.env_id, args.collect, env_kwargs=recipe.env_kwargs,
                        behavior=recipe.behavior, workers=2, threads=1, num_envs=num_envs, progress=False)
        rates[num_envs] = 60 * args.collect / (time.perf_counter() - t0)
        print(f"num_envs={num_envs}: {rates[num_envs]:.1f} episodes/min")
    print(f"batched collection: {rates[8] / rates[1]:.2f}x the unbatched rate")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=32, help="episodes per env configuration (a multiple of the sizes)")
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--collect", type=int, default=64, help="episodes per collection run (0: skip collection)")
    p.add_argument("--device", default="cpu", help="the env's device (cuda on a GPU machine; collection stays CPU)")
    args = p.parse_args()
    ENV_KWARGS["device"] = args.device
    bench_envs(args)
    if args.collect:
        bench_collection(args)


if __name__ == "__main__":
    main()
