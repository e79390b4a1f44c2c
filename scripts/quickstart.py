"""MORCA gym quickstart on MorcaTiny-v0 (the packaged CPU model).

    python scripts/quickstart.py [--prompts 3] [--targets 2 3 4] [--out runs/quickstart]

Runs rule schedulers at 2x / 3x / 4x target speedups on held-out `tiny-eval`
prompts, prints mean PSNR / SSIM / measured speedup per method and target,
and writes a side-by-side GIF (reference | schedulers) for the first prompt.
The learned MORCA scheduler (offline IQL + online fine-tuning) joins this table
once the agents are in; until then this is the rule-based demo.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from tqdm import tqdm

import morca_env  # noqa: F401
from morca_env.policies import RandomFeasible, SeaCacheExactBudget, UniformInterval
from morca_env.video import side_by_side, write_video


def run(env, policy, options):
    obs, info = env.reset(options=options)
    policy.reset(obs, info)
    done = False
    while not done:
        obs, _, done, _, info = env.step(policy(obs))
    return info, env.unwrapped.last_video


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--targets", type=float, nargs="+", default=[2.0, 3.0, 4.0])
    p.add_argument("--out", type=Path, default=Path("runs/quickstart"))
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    env = gym.make("MorcaTiny-v0", prompts="tiny-eval", reference_cache_dir=str(args.out / "references"))
    methods = {"uniform": UniformInterval(), "seacache (exact K)": SeaCacheExactBudget(env), "random": RandomFeasible(0)}
    pairs = env.unwrapped.suite.pairs()[: args.prompts]
    results = defaultdict(list)
    videos = {}
    bar = tqdm(total=len(args.targets) * len(pairs) * len(methods), desc="quickstart", unit="episode")
    for target in args.targets:
        for index, (prompt, seed) in enumerate(pairs):
            for name, policy in methods.items():
                info, video = run(env, policy, {"prompt": prompt, "seed": seed, "speedup": target})
                results[(name, target)].append(info)
                if index == 0 and target == args.targets[len(args.targets) // 2]:
                    videos["reference"] = env.unwrapped.reference_video
                    videos[f"{name} {info['psnr']:.1f}dB"] = video
                bar.update()
    bar.close()
    lines = ["| method | target | K | PSNR (dB) | SSIM | measured speedup |", "|---|---|---|---|---|---|"]
    for (name, target), infos in results.items():
        psnr = np.mean([min(i["psnr"], 99.0) for i in infos])
        lines.append(f"| {name} | {target:.1f}x | {infos[0]['budget']} | {psnr:.2f} | "
                     f"{np.mean([i['ssim'] for i in infos]):.4f} | {np.mean([i['speedup'] for i in infos]):.2f}x |")
    table = "\n".join(lines)
    print("\n" + table)
    (args.out / "results.md").write_text(table + "\n")
    (args.out / "results.json").write_text(json.dumps({f"{k[0]}@{k[1]}": v for k, v in results.items()}, indent=1,
                                                      default=float))
    gif = write_video(side_by_side(videos), args.out / "comparison.gif")
    print(f"\nwrote {args.out / 'results.md'}, {gif} ({time.perf_counter() - t_start:.0f} s)")
    methods["seacache (exact K)"].close()
    env.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
