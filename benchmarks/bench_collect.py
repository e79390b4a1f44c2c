"""Collection throughput on MorcaTiny: episodes per minute with 1 and 2 workers, measured in one run,
and with 2 Ray actors on a local Ray runtime next to them (when ray is installed; --no-ray skips it).

    python benchmarks/bench_collect.py [--episodes 120] [--env MorcaTiny-v0] [--no-ray]

Each worker is a process with one torch thread. Both runs build a fresh dataset
in a temporary Minari root, with references pre-generated so that only
behaviour episodes are timed. One worker runs in the calling process; two are
forked processes (spawned ones paid ~7 s of imports each: 1.56x at 120
episodes, 0.65x at 16). Goal: 2 workers >= 1.7x one worker; measured
1.77x at 120 episodes on the 2-core CI machine (2026-11-30).

Ray: the runtime is started before the clock (its start-up is printed on its own,
~10 s); the timed Ray run includes starting its 2 actors (each imports torch and
morca_env in a fresh process, like a spawned worker) and sending every episode back
to this process, which writes it. Ray efficiency = Ray rate / multiprocessing rate.
Measured 2026-12-01, `--episodes 40`, on the 2-core VM shared with other jobs (load
~4.5, so 2 processes gave only 1.09x): 1 worker 46.6, 2 processes 51.1, 2 Ray actors
36.5 episodes/min, Ray efficiency 0.71x; the runtime start-up took 13.5 s. The ~19 s
Ray lost is about its two actors' fresh-process imports, a fixed cost per run.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--episodes", type=int, default=120)
    p.add_argument("--env", default="MorcaTiny-v0")
    p.add_argument("--ray", action=argparse.BooleanOptionalAction, default=True,
                   help="also time 2 Ray actors on a local runtime (default when ray is installed)")
    args = p.parse_args()
    root = tempfile.mkdtemp(prefix="morca-bench-")
    os.environ["MINARI_DATASETS_PATH"] = os.path.join(root, "minari")
    os.environ["MORCA_CACHE_DIR"] = os.path.join(root, "cache")
    from morca_env.data import collect_dataset

    kwargs = {"prompts": "tiny-train", "lpips": False}  # speedups: the model's default data range
    # warm the reference cache (same seeds as the timed runs) so both runs time episodes only
    collect_dataset("bench/warm-v0", args.env, args.episodes, env_kwargs=kwargs, progress=False)
    rates = {}
    for workers in (1, 2):
        t0 = time.perf_counter()
        collect_dataset(f"bench/w{workers}-v0", args.env, args.episodes, env_kwargs=kwargs, workers=workers,
                        progress=False)
        rates[workers] = 60 * args.episodes / (time.perf_counter() - t0)
        print(f"{workers} worker(s): {rates[workers]:.1f} episodes/min")
    print(f"speedup with 2 workers: {rates[2] / rates[1]:.2f}x (goal >= 1.7x)")
    if not args.ray:
        return
    try:
        import ray
    except ImportError:
        print('Ray: not installed (pip install -e ".[ray]"), not measured')
        return
    from morca_env.parallel.executors import RayExecutor

    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    print(f"Ray local runtime start-up: {time.perf_counter() - t0:.1f} s (not in the rate below)")
    try:
        t0 = time.perf_counter()
        collect_dataset("bench/ray2-v0", args.env, args.episodes, env_kwargs=kwargs, workers=2, progress=False,
                        executor=RayExecutor())
        rate = 60 * args.episodes / (time.perf_counter() - t0)
    finally:
        ray.shutdown()
    print(f"2 Ray actors: {rate:.1f} episodes/min")
    print(f"Ray efficiency on 2 workers: {rate / rates[2]:.2f}x multiprocessing's rate, {rate / rates[1]:.2f}x one worker")


if __name__ == "__main__":
    main()
