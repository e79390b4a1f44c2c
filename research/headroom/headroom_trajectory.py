"""Where along the run does a searched schedule win? (is the headroom kept error or cancelled error?)

    python research/headroom/headroom_trajectory.py --prompts 'tiny-train[13::250]' --budget 35 --evaluations 60 \
        --workers 2 --out runs/trajectory

A per-run searched schedule beats the best fixed schedule by ~1.5 dB at the same K, but no scheduler learned from
the run reaches it (docs/results/scheduler_tiny.md). Two different things could make a schedule win: it keeps the
cached run closer to the no-cache run all along (the errors are smaller: a scheduler with a good error estimate
could, in principle, follow it), or its errors are as large on the way and cancel in the last steps (the gain is in
the final PSNR only, and nothing observable during the run announces it). This searches each (prompt, seed) from
the best fixed schedule (`morca_env.evaluation.search`, resumable, parallel), replays the no-cache run, the best fixed
schedule and the searched one step by step, and measures at every step the distance of the latent x_t and of
the predicted clean video x0 = x_t - sigma_t v_t to the no-cache run's. Writes trajectory.md, trajectory.json
and trajectory.png under --out; training prompts only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

import morca_env  # noqa: F401  (registers the envs)
from morca_env.cli import experiment_parser, positive_int, show_library_messages
from morca_env.utils.io import atomic_write_text
from morca_env.schedulers.fixed import StaticSchedule
from morca_env.prompts import get_suite
from morca_env.evaluation.search import SearchConfig, SearchTask, search_many
from morca_env.utils.threads import configure_threads


def run_states(den, schedule, prompt: str, seed: int, branch_steps=()) -> tuple[list, list, torch.Tensor, dict]:
    """-> (latent after each step, predicted clean video at each step, decoded video, {step: the decoded video
    when the steps from `step` on are all recomputed}) of one schedule."""
    den.start(prompt=prompt, seed=seed)
    latents, clean, snapshots = [], [], {}
    for i, action in enumerate(schedule):
        if i in branch_steps:
            snapshots[i] = den.snapshot()
        x = den.latents.clone()
        den.step(reuse=bool(action))
        clean.append(x - den.sigma(i) * den.last_velocity)  # x0 = x_t - sigma_t v_t (flow matching)
        latents.append(den.latents.clone())
    video = den.decode()
    continued = {}
    for i, snapshot in snapshots.items():
        den.restore(snapshot)
        while not den.done:
            den.step(reuse=False)
        continued[i] = den.decode()
    return latents, clean, video, continued


def relative_errors(states: list[torch.Tensor], reference: list[torch.Tensor]) -> np.ndarray:
    """||s_t - r_t|| / ||r_t|| per step."""
    return np.array([float((s - r).norm() / r.norm().clamp_min(1e-12)) for s, r in zip(states, reference)])


def compare(env, pairs, schedules: dict[str, list[list[int]]], branch_steps: list[int]) -> dict:
    """Per pair and schedule kind: latent and x0 errors at every step, the final PSNR, and the PSNR when the run is
    finished without cache from each of `branch_steps` on."""
    from tqdm import tqdm

    from morca_env.diffusion.metrics import to_uint8, video_metrics

    def psnr(video, reference) -> float:
        return env.terminal_reward(float(video_metrics(to_uint8(video), reference, None)["psnr"]))

    den = env.side_run()
    out = {kind: {"latent": [], "x0": [], "psnr": [], "continued": []} for kind in schedules}
    try:
        for b, (prompt, seed) in enumerate(tqdm(pairs, desc="trajectories", unit="run")):
            ref_latents, ref_clean, ref_video, _ = run_states(den, [0] * env.num_steps, prompt, seed)
            ref_video = to_uint8(ref_video)
            for kind, per_pair in schedules.items():
                latents, clean, video, continued = run_states(den, per_pair[b], prompt, seed, branch_steps)
                out[kind]["latent"].append(relative_errors(latents, ref_latents).tolist())
                out[kind]["x0"].append(relative_errors(clean, ref_clean).tolist())
                out[kind]["psnr"].append(psnr(video, ref_video))
                out[kind]["continued"].append([psnr(continued[i], ref_video) for i in branch_steps])
    finally:
        den.close()
    return out


def gap_db(errors: dict, kind: str, baseline: str, space: str) -> np.ndarray:
    """20 log10(error of `kind` / error of `baseline`) per run and step: < 0 where `kind` is closer. Steps where
    both runs are still identical give 0."""
    a, b = np.array(errors[kind][space]), np.array(errors[baseline][space])
    same = a == b
    return np.where(same, 0.0, 20 * np.log10(np.maximum(a, 1e-30) / np.maximum(b, 1e-30)))


def mean_ci(values) -> str:
    values = np.asarray(values, dtype=float)
    ci = 1.96 * values.std(ddof=1) / np.sqrt(len(values)) if len(values) > 1 else 0.0
    return f"{values.mean():+.2f} ± {ci:.2f}"


def summary_lines(errors: dict, schedules: dict, budget: int, num_steps: int, branch_steps: list[int]) -> list[str]:
    searched, fixed = np.array(schedules["searched"]), np.array(schedules["best-fixed"])
    first = [int(np.flatnonzero(s != f)[0]) if (s != f).any() else num_steps for s, f in zip(searched, fixed)]
    gain = np.array(errors["searched"]["psnr"]) - np.array(errors["best-fixed"]["psnr"])
    gaps = {space: gap_db(errors, "searched", "best-fixed", space) for space in ("latent", "x0")}
    continued = np.array(errors["searched"]["continued"]) - np.array(errors["best-fixed"]["continued"])
    lines = [f"K = {budget}, {len(gain)} runs; searched vs best fixed: final PSNR {mean_ci(gain)} dB; the schedules "
             f"first differ at step {np.median(first):.0f} (median, of {num_steps})", "",
             "Searched vs best fixed at step t (mean ± 95% CI over the runs): the error of the run's latent x_t and "
             "of its predicted clean video x0 against the no-cache run's, as 20 log10(ratio) in dB (negative: the "
             "searched run is closer), and the PSNR gain when both runs are finished without cache from step t on:", "",
             "| step t | latent error | x0 error | PSNR gain, finished without cache from t | its correlation with the "
             "final gain over runs | reuses from t on, searched / best fixed (mean) |", "|---|---|---|---|---|---|"]
    for j, t in enumerate(branch_steps):
        correlation = np.corrcoef(continued[:, j], gain)[0, 1] if len(gain) > 2 else float("nan")
        lines.append(f"| {t} | {mean_ci(gaps['latent'][:, t - 1])} | {mean_ci(gaps['x0'][:, t - 1])} | "
                     f"{mean_ci(continued[:, j])} | {correlation:.2f} | "
                     f"{searched[:, t:].sum(axis=1).mean():.1f} / {fixed[:, t:].sum(axis=1).mean():.1f} |")
    lines.append(f"| {num_steps} (end) | {mean_ci(gaps['latent'][:, -1])} | {mean_ci(gaps['x0'][:, -1])} | "
                 f"{mean_ci(gain)} (the schedules' own PSNR) | 1 | 0 / 0 |")
    shares = [float(np.mean(g[f:] < 0)) for g, f in zip(gaps["latent"], first) if f < num_steps]
    lines += ["", f"The searched run's latent is closer to the no-cache run's at {np.mean(shares):.0%} of the steps "
              "after the schedules first differ (mean over runs)."]
    return lines


def plot(path: Path, errors: dict, budget: int, branch_steps: list[int]) -> None:
    """Left: the searched run's error gap to the best fixed run per step. Right: at the branch steps, that gap
    next to the PSNR gain when both runs are finished without cache from there."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def band(values):
        return values.mean(axis=0), 1.96 * values.std(axis=0, ddof=1) / np.sqrt(len(values))

    fig, (left, right) = plt.subplots(1, 2, figsize=(9.5, 3.5))
    for space in ("latent", "x0"):
        mean, ci = band(gap_db(errors, "searched", "best-fixed", space))
        steps = np.arange(1, len(mean) + 1)
        left.plot(steps, mean, label=f"error of {space}")
        left.fill_between(steps, mean - ci, mean + ci, alpha=0.2)
    left.axhline(0, color="grey", lw=0.8)
    left.set_ylim(-8, 8)
    left.set_xlabel("step")
    left.set_ylabel("searched vs best fixed, 20 log10 ratio (dB)")
    left.set_title("distance to the no-cache run (below 0: searched closer)", fontsize=9)
    left.legend(fontsize=7)
    gap = gap_db(errors, "searched", "best-fixed", "latent")
    ends = branch_steps + [gap.shape[1]]
    kept_gain = np.column_stack([np.array(errors["searched"]["continued"]) - np.array(errors["best-fixed"]["continued"]),
                                 np.array(errors["searched"]["psnr"]) - np.array(errors["best-fixed"]["psnr"])])
    for label, values in (("how much closer the searched latent is", -gap[:, [t - 1 for t in ends]]),
                          ("PSNR gain, finished without cache from the step", kept_gain)):
        mean, ci = band(values)
        right.errorbar(ends, mean, yerr=ci, marker="o", capsize=3, label=label)
    right.axhline(0, color="grey", lw=0.8)
    right.set_xlabel("step")
    right.set_ylabel("searched vs best fixed (dB)")
    right.set_title("same error size, better final PSNR", fontsize=9)
    right.legend(fontsize=7)
    fig.suptitle(f"where along the run a searched schedule wins (K {budget})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(argv=None) -> int:
    show_library_messages()
    p = experiment_parser(__doc__)
    p.add_argument("--prompts", default="tiny-train[13::250]", help="prompt suite (training prompts)")
    p.add_argument("--budget", type=positive_int, default=35, help="K, the same for every run")
    p.add_argument("--evaluations", type=positive_int, default=60, help="schedules evaluated per search")
    p.add_argument("--branch-at", type=float, nargs="+", default=[0.25, 0.5, 0.75, 0.9],
                   help="fractions of the steps from which a run is also finished without cache")
    args = p.parse_args(argv)
    bad = [f for f in args.branch_at if not 0.0 < f < 1.0]
    if bad:
        p.error(f"--branch-at {bad}: each fraction must lie in (0, 1)")
    args.threads = configure_threads(args.threads, workers=args.workers)
    pairs = get_suite(args.prompts).pairs()
    env = gym.make(args.env, lpips=False, latent_features=False, **args.env_kwargs).unwrapped
    budget = env.budget_spec.check_budget(args.budget)
    fixed = StaticSchedule.packaged(env.preset.name).plan(env.budget_spec, budget)
    tasks = [SearchTask(f"run{i:03d}_K{budget:03d}", (pair,), budget, start=tuple(fixed)) for i, pair in enumerate(pairs)]
    results = search_many(tasks, args.env, args.env_kwargs, args.out / "searches",
                          SearchConfig(evaluations=args.evaluations), workers=args.workers, threads=args.threads)
    schedules = {"best-fixed": [fixed] * len(pairs), "searched": [r["schedule"] for r in results]}
    torch.set_num_threads(args.threads * args.workers)
    branch_steps = sorted({max(1, round(f * env.num_steps)) for f in args.branch_at})
    errors = compare(env, pairs, schedules, branch_steps)
    lines = summary_lines(errors, schedules, budget, env.num_steps, branch_steps)
    atomic_write_text(args.out / "trajectory.md", "\n".join(lines) + "\n")
    atomic_write_text(args.out / "trajectory.json",
                      json.dumps({"pairs": pairs, "budget": budget, "schedules": schedules, "branch_steps": branch_steps,
                                  "errors": errors}) + "\n")
    plot(args.out / "trajectory.png", errors, budget, branch_steps)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
