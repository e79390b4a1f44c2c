"""Measure the benchmark's references: the random feasible policy and the best fixed schedule on an env's suite.

    morca benchmark-references MorcaTiny-v0            # remakes the shipped file (~6 min on 2 CPU cores)
    morca benchmark-references MorcaTiny-v0 --out refs.json
    morca benchmark-references MorcaTiny-v0 --per-k 20 45 --pair-step 4   # per-K references (datasets over a range)

They are the 0 and the 100 of `morca_env.evaluation.benchmark`'s normalized score; the shipped
copy (morca_env/data_files/benchmark_references.json) was made by the first line.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from morca_env.evaluation import benchmark
from morca_env.cli import positive_int, thread_count


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="morca benchmark-references", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("env_id", choices=sorted(benchmark.SUITES))
    p.add_argument("--out", default=None, help="JSON file to merge into (default: the packaged references)")
    p.add_argument("--seed", type=int, default=0, help="the random feasible policy's seed")
    p.add_argument("--threads", type=thread_count, default=1, help="torch threads (1 is fastest on a shared CPU)")
    p.add_argument("--per-k", type=positive_int, nargs=2, metavar=("LOW", "HIGH"),
                   help="instead: the references at every K from LOW to HIGH (morca_env.evaluation.k_references)")
    p.add_argument("--pair-step", type=positive_int, default=4, help="with --per-k: every n-th pair of the suite")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.per_k:
        return per_k(args)
    refs = benchmark.measure_references(args.env_id, seed=args.seed)
    path = benchmark.save_references(refs, args.out)
    for target, entry in refs["targets"].items():
        print(f"{args.env_id} {target}x: random {entry['random']['mean_psnr']:.2f} dB, "
              f"best fixed {entry['best-fixed']['mean_psnr']:.2f} dB (K mean {sum(entry['k']) / len(entry['k']):.1f})")
    print(f"wrote {path}")
    return 0


def per_k(args) -> int:
    from morca_env.evaluation import k_references

    low, high = args.per_k
    if low > high:
        raise SystemExit(f"--per-k {low} {high}: LOW must be at most HIGH")
    refs = k_references.measure_k_references(args.env_id, range(low, high + 1), pair_step=args.pair_step,
                                             seed=args.seed)
    path = k_references.save_k_references(refs, args.out)
    for k, entry in refs["ks"].items():
        print(f"{args.env_id} K={k}: random {np.mean(entry['random']['psnr']):.2f} dB, "
              f"best fixed {np.mean(entry['best-fixed']['psnr']):.2f} dB")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
