"""Measure the packaged MorcaTiny model for its model card (docs/morca_tiny.md).

    python research/morca_tiny/eval_tiny.py                       # ~25 min on one core
    python research/morca_tiny/eval_tiny.py --prompts 40 --schedule-prompts 6 --schedules 10   # quick look

1. Prompt following over `--prompts` tiny-eval prompts: the dominant foreground
   colour and the direction of the foreground centroid's motion, by pixel
   statistics (`morca_env.models.tiny_data.prompt_following`).
2. Scheduling matters: for `--schedule-prompts` eval prompts, `--schedules`
   random feasible schedules at K = `--budget` of 50 steps: the spread
   (max - min) of terminal PSNR per prompt, and SeaCache at the same exact K
   against the median random schedule.
3. Step error vs terminal error: the correlation, over those random schedules,
   between the summed true step error (cached vs fresh residual, paper Fig. 1)
   and the terminal PSNR.
4. Which prompt words the model reads: the training loss with one attribute of the
   prompt swapped, by noise level, and from which noise level each sample's direction
   of motion stops changing (`research/morca_tiny/tiny_probe.py`; `--sensitivity-only`).
Also times one 50-step CFG episode on one core, and writes sample GIFs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from schedule_analysis import run_schedule
from morca_env.budget import BudgetSpec, forced_recompute_steps
from morca_env.diffusion.denoiser import DenoiserConfig, StepwiseDenoiser
from morca_env.utils.io import atomic_path
from morca_env.diffusion.metrics import to_uint8
from morca_env.models import tiny
from morca_env.models.tiny_data import prompt_following
from morca_env.prompts import get_suite
from tiny_probe import direction_commit_sigmas, prompt_sensitivity
from morca_env.schedulers.fixed import RandomFeasible
from morca_env.schedulers.rules.seacache import exact_schedule
from morca_env.diffusion.video import write_video


def spearman(a, b) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def sample_grid(videos: list[torch.Tensor], columns: int = 4, scale: int = 3) -> np.ndarray:
    frames = []
    for f in range(videos[0].shape[0]):
        tiles = [np.pad(to_uint8(v[f]).numpy(), ((1, 1), (1, 1), (0, 0)), constant_values=255) for v in videos]
        rows = [np.concatenate(tiles[r:r + columns], axis=1) for r in range(0, len(tiles), columns)]
        frames.append(np.concatenate(rows, axis=0).repeat(scale, 0).repeat(scale, 1))
    return np.stack(frames)


def write_samples(den, pairs, out: Path) -> None:
    """samples.gif: 12 eval prompts spread over the suite (no cache), with their prompts in samples.txt."""
    videos = [den.generate(prompt=prompt, seed=seed) for prompt, seed in pairs]
    write_video(sample_grid(videos), out / "samples.gif", fps=4)
    (out / "samples.txt").write_text("\n".join(f"{i + 1}. {p}" for i, (p, _) in enumerate(pairs)) + "\n")


def prompt_following_rate(den, pairs) -> dict:
    """Share of uncached samples whose colour / direction of motion match their prompt."""
    hits = {"colour": [], "direction": []}
    for prompt, seed in tqdm(pairs, desc="prompt following", unit="video"):
        for k, v in prompt_following(den.generate(prompt=prompt, seed=seed), prompt).items():
            hits[k].append(v)
    return {**{k: float(np.mean(v)) for k, v in hits.items()}, "prompts": len(pairs)}


def write_report(path: Path, report: dict) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_text(json.dumps(report, indent=2) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=200)
    p.add_argument("--schedule-prompts", type=int, default=20)
    p.add_argument("--schedules", type=int, default=20)
    p.add_argument("--budget", type=int, default=25)
    p.add_argument("--out", type=Path, default=Path("docs/morca_tiny"))
    p.add_argument("--samples-only", action="store_true", help="only write samples.gif and samples.txt")
    p.add_argument("--sensitivity-only", action="store_true",
                   help="only measure which prompt words the model reads (updates that entry of metrics.json)")
    p.add_argument("--commit-prompts", type=int, default=24,
                   help="eval prompts for the direction-commit probe (one episode each)")
    p.add_argument("--following-only", action="store_true",
                   help="only measure prompt following over --prompts (updates that entry of metrics.json)")
    p.add_argument("--weights", type=Path, help="weights directory (default: the packaged ones)")
    args = p.parse_args(argv)
    if not 1 <= args.prompts <= 200:
        p.error(f"--prompts {args.prompts} must be in [1, 200] (tiny-eval has 200 prompts)")
    if not 1 <= args.commit_prompts <= 200:
        p.error(f"--commit-prompts {args.commit_prompts} must be in [1, 200] (tiny-eval has 200 prompts)")
    if args.sensitivity_only and args.following_only:
        p.error("--sensitivity-only and --following-only each measure one part; pass at most one")
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    pipe = tiny.load_morca_tiny(directory=args.weights)
    den = StepwiseDenoiser(pipe, DenoiserConfig(**tiny.GENERATION))
    pairs = get_suite("tiny-eval").pairs()
    metrics = args.out / "metrics.json"
    if args.following_only:
        report = json.loads(metrics.read_text()) if metrics.exists() else {}
        report["prompt_following"] = prompt_following_rate(den, pairs[: args.prompts])
        write_report(metrics, report)
        print(json.dumps(report["prompt_following"], indent=2))
        return 0
    if args.samples_only:
        write_samples(den, pairs[:: len(pairs) // 12][:12], args.out)
        return 0
    sensitivity = {str(k): v for k, v in prompt_sensitivity(pipe).items()}
    print("prompt sensitivity (loss increase with one attribute swapped):", json.dumps(sensitivity, indent=1))
    commits = direction_commit_sigmas(den, pairs[:: len(pairs) // args.commit_prompts][: args.commit_prompts])
    commit = {"prompts": len(commits), "median_sigma": float(np.median(commits)),
              "quartile_sigmas": [float(q) for q in np.percentile(commits, [25, 75])]}
    print("direction of motion fixed from sigma (median, quartiles):", commit)
    if args.sensitivity_only:
        report = json.loads(metrics.read_text()) if metrics.exists() else {}
        report.update(prompt_sensitivity=sensitivity, direction_commit=commit)
        write_report(metrics, report)
        return 0
    report: dict = {"prompt_sensitivity": sensitivity, "direction_commit": commit}

    write_samples(den, pairs[:: len(pairs) // 12][:12], args.out)

    # cost of one episode on one core
    den.generate(prompt=pairs[0][0], seed=pairs[0][1])
    times = []
    for prompt, seed in pairs[:3]:
        t0 = time.perf_counter()
        den.generate(prompt=prompt, seed=seed)
        times.append(time.perf_counter() - t0)
    report["episode_seconds_one_core"] = float(np.median(times))

    # 1. prompt following
    report["prompt_following"] = prompt_following_rate(den, pairs[: args.prompts])

    # 2 + 3. schedules at K = budget
    spec = BudgetSpec(den.num_steps, forced_recompute_steps(den.num_steps))
    rng_policy = RandomFeasible(seed=0)
    spreads, seacache_gain, all_errors, all_psnr, within = [], [], [], [], []
    for prompt, seed in tqdm(pairs[: args.schedule_prompts], desc="schedules", unit="prompt"):
        reference = to_uint8(den.generate(prompt=prompt, seed=seed))
        runs = [run_schedule(den, prompt, seed, rng_policy.plan(spec, args.budget), reference)
                for _ in range(args.schedules)]
        values = np.array([min(r.psnr, 100.0) for r in runs])
        errors = np.array([r.summed_step_error for r in runs])
        spreads.append(float(values.max() - values.min()))
        all_errors += errors.tolist()
        all_psnr += values.tolist()
        within.append(spearman(errors, values))
        sea, _ = exact_schedule(den, "official", prompt, seed, spec, args.budget)
        sea_run = run_schedule(den, prompt, seed, spec.project_schedule(sea, args.budget), reference, probe=False)
        seacache_gain.append(float(min(sea_run.psnr, 100.0) - np.median(values)))
    spreads = np.array(spreads)
    report["schedules"] = {
        "budget": args.budget, "prompts": len(spreads), "schedules_per_prompt": args.schedules,
        "psnr_spread_median_db": float(np.median(spreads)), "psnr_spread_min_db": float(spreads.min()),
        "fraction_prompts_spread_ge_3db": float(np.mean(spreads >= 3.0)),
        "random_psnr_mean_db": float(np.mean(all_psnr)),
        "seacache_minus_median_random_db_mean": float(np.mean(seacache_gain)),
        "seacache_beats_median_random_fraction": float(np.mean(np.array(seacache_gain) > 0)),
    }
    report["step_vs_terminal_error"] = {
        "pearson_pooled": float(np.corrcoef(all_errors, all_psnr)[0, 1]),
        "spearman_pooled": spearman(all_errors, all_psnr),
        "spearman_within_prompt_mean": float(np.mean(within)),
    }
    write_report(metrics, report)
    print(json.dumps(report, indent=2))
    den.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
