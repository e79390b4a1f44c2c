"""Measure the packaged MorcaScenes model for its model card (docs/morca_scenes.md).

    python research/morca_scenes/model_card.py                 # ~25 min on one core
    python research/morca_scenes/model_card.py --prompts 48 --schedule-prompts 8 --schedules 8   # a quick look

1. Prompt following per factor over `--prompts` scenes-eval prompts (no cache), by pixel
   statistics (`morca_env.models.scenes_data.prompt_following`): motion (amount and
   direction), object count, background texture, temporal event, scale change, colour.
2. Scheduling matters: for `--schedule-prompts` eval prompts spread over the content
   classes, `--schedules` random feasible schedules at K = `--budget` of 50 steps; the
   spread (max - min) of terminal PSNR per prompt, per content class too, and SeaCache's
   exact-K form against the median random schedule.
Writes metrics.json and samples.gif (12 eval prompts, one per row of the grid) to --out.
Public API only: the env, its schedulers and `morca_env.models`.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections import defaultdict
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from tqdm import tqdm

import morca_env
from morca_env.diffusion.denoiser import DenoiserConfig, StepwiseDenoiser
from morca_env.utils.io import atomic_write_text
from morca_env.diffusion.metrics import to_uint8
from morca_env.models import scenes
from morca_env.models.scenes_data import parse_prompt, prompt_following
from morca_env.prompts import get_suite
from morca_env.diffusion.video import write_video

FACTORS = ("motion", "count", "background", "event", "scale", "colour")


def spread_pairs(pairs, n: int):
    """`n` pairs taken round-robin over the content classes, so every class is represented."""
    by_class = defaultdict(list)
    for prompt, seed in pairs:
        by_class[parse_prompt(prompt).content_class].append((prompt, seed))
    classes = sorted(by_class)
    picked = []
    for i in range(max(len(v) for v in by_class.values())):
        for c in classes:
            if i < len(by_class[c]):
                picked.append((by_class[c][i], c))
    return picked[:n]


def sample_grid(videos: list[torch.Tensor], columns: int = 4, scale: int = 3) -> np.ndarray:
    frames = []
    for f in range(videos[0].shape[0]):
        tiles = [np.pad(to_uint8(v[f]).numpy(), ((1, 1), (1, 1), (0, 0)), constant_values=255) for v in videos]
        rows = [np.concatenate(tiles[r:r + columns], axis=1) for r in range(0, len(tiles), columns)]
        frames.append(np.concatenate(rows, axis=0).repeat(scale, 0).repeat(scale, 1))
    return np.stack(frames)


def following(den, pairs) -> dict:
    hits = {k: [] for k in FACTORS}
    per_class = defaultdict(lambda: {k: [] for k in FACTORS})
    for (prompt, seed), cls in tqdm(pairs, desc="prompt following", unit="video"):
        for k, v in prompt_following(den.generate(prompt=prompt, seed=seed), prompt).items():
            hits[k].append(v)
            per_class[cls][k].append(v)
    return {"prompts": len(pairs), **{k: float(np.mean(v)) for k, v in hits.items()},
            "per_class": {c: {k: float(np.mean(v)) for k, v in d.items()} for c, d in sorted(per_class.items())}}


def schedule_spread(pairs, schedules: int, budget: int, weights) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = gym.make("MorcaScenes-v0", budget=budget, lpips=False, latent_features=False,
                       **({"model_id": str(weights)} if weights else {}))
    random = morca_env.make_scheduler("random", env)
    seacache = morca_env.make_scheduler("seacache-exact", env)
    spreads, gains, by_class, psnrs = [], [], defaultdict(list), []
    for (prompt, seed), cls in tqdm(pairs, desc="schedules", unit="prompt"):
        options = {"prompt": prompt, "seed": seed, "budget": budget}
        values = np.array([min(morca_env.rollout(env, random, options).info["psnr"], 100.0) for _ in range(schedules)])
        sea = min(morca_env.rollout(env, seacache, options).info["psnr"], 100.0)
        spreads.append(float(values.max() - values.min()))
        by_class[cls].append(spreads[-1])
        gains.append(float(sea - np.median(values)))
        psnrs += values.tolist()
    spreads = np.array(spreads)
    return {"budget": budget, "prompts": len(spreads), "schedules_per_prompt": schedules,
            "psnr_spread_median_db": float(np.median(spreads)), "psnr_spread_min_db": float(spreads.min()),
            "fraction_prompts_spread_ge_3db": float(np.mean(spreads >= 3.0)),
            "random_psnr_mean_db": float(np.mean(psnrs)),
            "spread_median_db_per_class": {c: float(np.median(v)) for c, v in sorted(by_class.items())},
            "seacache_minus_median_random_db_mean": float(np.mean(gains)),
            "seacache_beats_median_random_fraction": float(np.mean(np.array(gains) > 0))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = len(get_suite("scenes-eval"))
    p.add_argument("--prompts", type=int, default=size)
    p.add_argument("--schedule-prompts", type=int, default=24)
    p.add_argument("--schedules", type=int, default=20)
    p.add_argument("--budget", type=int, default=25)
    p.add_argument("--weights", type=Path, help="weights directory (default: the packaged ones)")
    p.add_argument("--out", type=Path, default=Path("docs/morca_scenes"))
    p.add_argument("--following-only", action="store_true", help="only prompt following (and the samples)")
    p.add_argument("--schedules-only", action="store_true",
                   help="only the schedule spread, merged into --out's metrics.json")
    args = p.parse_args(argv)
    for name, value, top in (("--prompts", args.prompts, size), ("--schedule-prompts", args.schedule_prompts, size)):
        if not 1 <= value <= top:
            p.error(f"{name} {value} must be in [1, {top}] (scenes-eval has {size} pairs)")
    if not 1 <= args.schedules:
        p.error(f"--schedules {args.schedules} must be >= 1")
    torch.set_num_threads(1)
    pipe = scenes.load_morca_scenes(directory=args.weights)
    den = StepwiseDenoiser(pipe, DenoiserConfig(**scenes.MODEL.generation))
    pairs = get_suite("scenes-eval").pairs()
    args.out.mkdir(parents=True, exist_ok=True)
    metrics = args.out / "metrics.json"
    if args.schedules_only:
        report = json.loads(metrics.read_text()) if metrics.is_file() else {}
    else:
        samples = [pair for pair, _ in spread_pairs(pairs, 12)]
        write_video(sample_grid([den.generate(prompt=p_, seed=s) for p_, s in samples]), args.out / "samples.gif",
                    fps=4)
        atomic_write_text(args.out / "samples.txt", "".join(f"{i + 1}. {p_}\n" for i, (p_, _) in enumerate(samples)))
        report = {"prompt_following": following(den, spread_pairs(pairs, args.prompts))}
        print(json.dumps({k: v for k, v in report["prompt_following"].items() if k != "per_class"}, indent=1))
    if not args.following_only:
        report["schedules"] = schedule_spread(spread_pairs(pairs, args.schedule_prompts), args.schedules,
                                              args.budget, args.weights)
        print(json.dumps(report["schedules"], indent=1))
    atomic_write_text(metrics, json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
