"""Does a fixed slice of the quickstart survive a shared machine? Time it alone and beside one busy process.

    python benchmarks/bench_contention.py [--updates 400] [--pairs 3] [--threads auto]

The slice is the stage that collapsed on the 2-core VM (41 min instead of 9
for the whole quickstart; offline IQL at 0.5-2 updates/s instead of ~38):
offline discrete IQL updates of the quickstart's scalar-state network on a
replay buffer of synthetic MorcaTiny-shaped episodes. It runs in a fresh
process with the scripts' default thread choice (`morca_env.utils.threads`), once on
the machine as it is and once right after a single-threaded busy loop starts,
and prints both times and their ratio, measured in one run; `--pairs` such
pairs back to back, and the medians (one pair swings with the VM's noise).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import subprocess
import sys
import time

import numpy as np

SLICE = r"""
import sys, time
import numpy as np
from morca_env.utils.threads import configure_threads
threads = configure_threads(None if sys.argv[2] == "auto" else int(sys.argv[2]))
import agents
from agents.iql import DiscreteIQLConfig
from agents.networks import MorcaEncoderFactory
from agents.training import batch_source, make_buffer, run_updates
from d3rlpy.dataset import Episode
rng = np.random.default_rng(0)
episodes = []
for _ in range(64):
    n = 50
    obs = [rng.standard_normal((n, 9, 4, 8, 8)).astype(np.float32), rng.standard_normal((n, 18, 8, 8)).astype(np.float32),
           rng.random((n, 7)).astype(np.float32), np.ones((n, 2), np.float32)]
    rewards = np.zeros((n, 1), np.float32); rewards[-1] = rng.uniform(15, 35)
    episodes.append(Episode(observations=obs, actions=rng.integers(0, 2, (n, 1)), rewards=rewards, terminated=True))
buffer = make_buffer(episodes, n_step=50)
encoder = MorcaEncoderFactory(features="")
algo = DiscreteIQLConfig(actor_encoder_factory=encoder, critic_encoder_factory=encoder, value_encoder_factory=encoder,
                         batch_size=256).create(device="cpu")
algo.build_with_dataset(buffer)
batches = batch_source(buffer, algo)  # what train_offline.py samples from
run_updates(algo, batches, 20, progress=False)  # warm-up
t0 = time.perf_counter()
run_updates(algo, batches, int(sys.argv[1]), progress=False)
print(f"RESULT {time.perf_counter() - t0:.3f} {threads}")
"""


def _busy() -> None:
    while True:
        pass


def run_slice(updates: int, threads: str) -> tuple[float, int]:
    out = subprocess.run([sys.executable, "-c", SLICE, str(updates), threads], capture_output=True, text=True,
                         check=True)
    line = next(line for line in out.stdout.splitlines() if line.startswith("RESULT"))
    seconds, chosen = line.split()[1:]
    return float(seconds), int(chosen)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--updates", type=int, default=400)
    p.add_argument("--pairs", type=int, default=3,
                   help="alone / shared pairs, back to back (one pair's ratio ranged 1.18-1.61x on the noisy VM)")
    p.add_argument("--threads", default="auto", help="'auto' (the scripts' default) or a number to force")
    args = p.parse_args(argv)
    if args.updates < 1 or args.pairs < 1:
        p.error(f"--updates {args.updates} and --pairs {args.pairs} must both be >= 1")
    print(f"{args.updates} offline IQL updates (quickstart's scalar-state network, batch 256), threads={args.threads}")
    alones, shareds = [], []
    for pair in range(args.pairs):
        alone, threads_alone = run_slice(args.updates, args.threads)
        busy = mp.get_context("fork").Process(target=_busy, daemon=True)
        busy.start()
        try:
            time.sleep(1.0)
            shared, threads_shared = run_slice(args.updates, args.threads)
        finally:
            busy.kill()
            busy.join()
        alones.append(alone)
        shareds.append(shared)
        print(f"  pair {pair + 1}: alone {alone:6.2f} s ({args.updates / alone:5.1f} updates/s, {threads_alone} thread(s)), "
              f"beside one busy process {shared:6.2f} s ({args.updates / shared:5.1f} updates/s, "
              f"{threads_shared} thread(s)): {shared / alone:.2f}x")
    alone, shared = float(np.median(alones)), float(np.median(shareds))
    print(f"  median: alone {alone:.2f} s, shared {shared:.2f} s, ratio {shared / alone:.2f}x  (goal <= 1.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
