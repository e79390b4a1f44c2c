"""Evaluate cache schedulers against the no-cache reference: the paper's Table 2, Pareto and schedule plots, videos.

    morca evaluate --methods uniform seacache-global seacache-exact random \
        morca-offline=runs/offline/final.d3 morca-online=runs/online/final.d3 reinforce=runs/reinforce/reinforce.pt
    morca evaluate ... --prompts 50 --targets 2 2.5 3 --out runs/eval        # resumable

Methods: `uniform` (uniform interval), `random` (random feasible), `behaviour`
(the datasets' random threshold-curve policy, held to K by the mask), `seacache-exact`
(SeaCache with the per-video threshold that spends exactly K), `seacache-global`
(one threshold per target, g(rho) from `scripts/calibrate.py --thresholds`,
tuned on training prompts as the paper tunes it; its K varies per video),
`best-fixed` (the best fixed schedule per K, fitted on training prompts by
`scripts/fit_fixed_schedule.py`), `searched=<dir>` (the per-prompt oracle:
schedules found by `scripts/search_schedules.py`, same K as the others only
without --calibrate), any other name of `morca_env.schedulers.names()`,
`morca-*=<.d3>` (IQL schedulers), `reinforce=<.pt>`, and `<label>='{"name": <scheduler>, <option>: ...}'`
(a scheduler with options under its own label, e.g. `acid-tea='{"name": "acid-exact", "rule": "teacache"}'`). Every episode appends a
line to `<out>/episodes.jsonl`; a rerun skips what is there. Writes
`table.md`, `table.csv`, `pareto.png`, `schedules.png` and side-by-side videos.
A method that spends its own K (a native or global rule) gets each exact-budget `--baselines` method
replayed at every one of its episodes' K (`<baseline>@<method>` rows; `--no-matched` skips them), so
`table.md`'s same-K table compares schedules, not budgets; its equal-speedup table compares every
method at the same measured speedup (`morca_env.comparison`).
Speedup = mean stock no-cache latency / mean episode latency over the prompts, each
stock generation timed in the same run just before that prompt's episodes
(`--timing-repeats R`: every timing is the fastest of R back-to-back runs;
`--feedback`: a `SpeedupGovernor` per method and target corrects the requested
speedup by what was realised so far).
`--calibrate ROUNDS` first measures the speedup -> K calibration on this machine
(wall-clock ratios drift with its load; the quickstart does this). Latency includes
the scheduler's own per-step inference time, and a learned scheduler's K for a
target counts that time (`scheduler_cost_s`, measured once per method); the per-video
threshold search of `seacache-exact` (its replays) is not counted: it is an
oracle-style baseline for quality at equal K, not a deployable method.
`--ray` runs the episodes on `--workers` Ray actors (see scripts/collect.py), grouped by
(target, prompt) so that each group's stock run is timed on the machine that runs its
episodes; open loop only (not with --feedback).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
from tqdm import tqdm

import morca_env  # noqa: F401
from morca_env.calibrate import fastest, measure_calibration, stock_seconds
from morca_env.comparison import (equal_speedup_table, matched_label, paired_difference, pending_matched,
                                  same_k_table)
from morca_env.workers import needs_gpu
from morca_env.evaluation import (GroupEvaluator, Methods, evaluate_episode, make_envs, run_episode,
                                  scheduler_step_cost, work_entry)
from morca_env.executors import WorkerFailed, add_ray_arguments, executor_from_args
from morca_env.governor import SpeedupGovernor
from morca_env.calibration_files import load_threshold_map
from morca_env.video import side_by_side, write_video
from morca_env.threads import configure_threads
from morca_env.cli import json_dict, nonnegative_int, positive_int, show_library_messages, speedup

def governor_for(method_env, target: float, scheduler_cost_s: float) -> SpeedupGovernor:
    """A governor whose requests stay inside the range the method's env accepts: a learned scheduler's
    own per-step cost lowers the highest speedup its episodes can reach."""
    calibration = method_env.unwrapped.calibration.with_scheduler_cost(scheduler_cost_s)
    return SpeedupGovernor(target, calibration.speedup_range)


def use_fresh_calibration(args, env, free_env):
    """Measure (or, on resume, reload) this run's calibration, install it in both envs; -> the
    SeaCache threshold map re-read through it. Wall-clock ratios drift with the machine's state, so
    targets are only hit with a calibration measured next to the episodes it converts."""
    from morca_env.budget import SpeedupCalibration

    path = args.out / "calibration.json"
    if path.exists():
        calibration = SpeedupCalibration.from_json(path)
        print(f"calibration from {path} (resume): {calibration.source}")
    else:
        measured = measure_calibration(env, repeats=args.calibrate, threads=args.threads,
                                       timing_repeats=args.timing_repeats)
        print(measured.table())
        calibration = measured.calibration
        calibration.to_json(path)
    lo, hi = calibration.speedup_range
    bad = [t for t in args.targets if not lo <= t <= hi]
    if bad:
        raise SystemExit(f"targets {bad} are outside the speedups this machine reaches now, [{lo:.2f}, {hi:.2f}] "
                         f"({path}); pick targets in that range, or delete the file to measure again")
    old = env.calibration
    env.calibration = free_env.calibration = calibration
    return load_threshold_map(env.preset.name).recalibrated(old, calibration)


def parse_methods(items):
    methods = []
    for item in items:
        name, _, spec = item.partition("=")
        methods.append((name, spec or None))
    return methods


def summarise(rows, targets, methods):
    table = []
    for target in targets:
        for name, _ in methods:
            sel = [r for r in rows if r["method"] == name and r["target"] == target]
            if not sel:
                continue
            entry = {"target": target, "method": name, "episodes": len(sel),
                     "latency_s": float(np.mean([r["latency_s"] for r in sel])),
                     "stock_latency_s": float(np.mean([r["stock_latency_s"] for r in sel])),
                     # ratio of mean latencies, as the latency column (the mean of per-episode
                     # ratios is biased upwards by timing noise, Jensen)
                     "speedup": float(np.mean([r["stock_latency_s"] for r in sel])
                                      / np.mean([r["latency_s"] for r in sel])),
                     "K": float(np.mean([r["num_reuse"] for r in sel])),
                     "psnr": float(np.mean([r["psnr"] for r in sel])), "psnr_std": float(np.std([r["psnr"] for r in sel])),
                     "ssim": float(np.mean([r["ssim"] for r in sel]))}
            if all("lpips" in r for r in sel):
                entry["lpips"] = float(np.mean([r["lpips"] for r in sel]))
            table.append(entry)
    return table


def write_tables(out: Path, table, rows, methods, targets, reference_latency,
                 baselines=("seacache-exact", "seacache-global", "best-fixed"), own_k=(), matched=()):
    """table.md / table.csv. `own_k`: the methods that spend their own K, `matched`: the baselines replayed at
    their K (paired lines at the same K); the methods are also compared at equal measured speedup."""
    # each row's speedup is its own stock timings over its own latencies (timed side by side, so a
    # machine's load cancels); the stock column shows them, the reference row is their overall mean
    lines = ["| target | method | K | latency (s) | stock (s) | speedup | PSNR (dB) | SSIM | LPIPS |",
             "|---|---|---|---|---|---|---|---|---|",
             f"| - | no cache (reference) | 0 | {reference_latency:.3f} | {reference_latency:.3f} | 1.00x | - | - | - |"]
    for e in table:
        lpips = f"{e['lpips']:.4f}" if "lpips" in e else "n/a"
        lines.append(f"| {e['target']:.1f}x | {e['method']} | {e['K']:.1f} | {e['latency_s']:.3f} | "
                     f"{e['stock_latency_s']:.3f} | {e['speedup']:.2f}x | "
                     f"{e['psnr']:.2f} ± {e['psnr_std']:.2f} | {e['ssim']:.4f} | {lpips} |")
    notes = []
    names = [m for m, _ in methods]
    for baseline in [b for b in baselines if b in names]:
        for method in [m for m in names if m != baseline]:  # every method against each baseline asked for
            for target in targets:
                d = paired_difference(rows, method, baseline, target)
                if d:
                    notes.append(f"- {method} - {baseline} at {target:.1f}x: {d[0]:+.2f} dB "
                                 f"(std over prompts {d[1]:.2f}, 95% CI ±{d[2]:.2f}, n={d[3]})")
    for method in [m for m in names if m in own_k]:  # a rule on its own K against each baseline at that K
        for baseline in matched:
            for target in targets:
                d = paired_difference(rows, method, matched_label(baseline, method), target)
                if d:
                    notes.append(f"- {method} - {baseline} at {method}'s own K (mean {_mean_k(rows, method, target):.1f})"
                                 f" at {target:.1f}x: {d[0]:+.2f} dB (std over prompts {d[1]:.2f}, 95% CI ±{d[2]:.2f}, "
                                 f"n={d[3]})")
    for learned in [m for m in names if m.startswith("morca")]:
        errs = [abs(e["speedup"] - e["target"]) for e in table if e["method"] == learned]
        if errs:
            notes.append(f"- {learned} speedup control: mean |realised - target| = {np.mean(errs):.3f}")
    text = "\n".join(lines) + ("\n\n" + "\n".join(notes) if notes else "") + "\n"
    reference = next((b for b in baselines if b in names and b not in own_k), None)
    if reference is not None and len(names) > 1:
        text += (f"\nAt the same K (mean K / PSNR / difference to {reference}, 95% CI; a method on its own K is "
                 f"compared with {reference} replayed at that K):\n\n"
                 + "\n".join(same_k_table(rows, names, reference, targets, own_k)) + "\n")
    if reference is not None and len(table) > 1:
        text += (f"\nAt equal measured speedup (each method's PSNR interpolated per prompt along its own measured "
                 f"speedup curve; within 0.1x beyond its ends, the end point's; difference to {reference}, 95% CI):\n\n"
                 + "\n".join(equal_speedup_table(rows, names, reference, targets)) + "\n")
    (out / "table.md").write_text(text)
    with open(out / "table.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["target", "method", "episodes", "K", "latency_s", "stock_latency_s",
                                               "speedup", "psnr", "psnr_std", "ssim", "lpips"])
        writer.writeheader()
        for e in table:
            writer.writerow(e)
    return text


def _mean_k(rows, method, target) -> float:
    return float(np.mean([r["num_reuse"] for r in rows if r["method"] == method and r["target"] == target]))


def plot_pareto(out: Path, table):
    """PSNR against measured speedup, one line per method (20 distinct colours, markers cycling, the legend beside
    the axes so a table of every baseline stays readable)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(e["method"] for e in table))
    colours = plt.get_cmap("tab20").colors
    markers = "osD^vP*Xh<>p"
    fig, ax = plt.subplots(figsize=(6.5 + (2.0 if len(methods) > 6 else 0.0), 4.2))
    for k, method in enumerate(methods):
        pts = sorted((e["speedup"], e["psnr"], e["psnr_std"]) for e in table if e["method"] == method)
        xs, ys, es = zip(*pts)
        ax.errorbar(xs, ys, yerr=np.array(es) / 2, marker=markers[k % len(markers)], capsize=2, label=method,
                    color=colours[(2 * k) % 20 if k < 10 else (2 * k + 1) % 20], elinewidth=0.8,
                    linewidth=2.5 if method.startswith("morca") else 1.2)
    ax.set_xlabel("measured speedup (x)")
    ax.set_ylabel("PSNR vs no-cache reference (dB)")
    ax.set_title("quality against speed (error bars: ±std/2 over prompts)")
    ax.grid(alpha=0.3)
    if len(methods) > 6:
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    else:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "pareto.png", dpi=130)
    plt.close(fig)


def schedule_rows(rows, target: float, prompt_index: int = 0) -> dict[str, list[int]]:
    """Every method's schedule for one prompt at one target, labelled with the K it executed
    (methods run different K under per-method feedback, and the global threshold never holds K)."""
    return {f"{r['method']} (K={sum(r['schedule'])})": r["schedule"] for r in rows
            if r["prompt_index"] == prompt_index and r["target"] == target}


def plot_schedules(out: Path, schedules: dict[str, list[int]], title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(schedules)
    grid = np.array([schedules[n] for n in names])
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(names) + 1.2))
    ax.imshow(grid, aspect="auto", cmap="Greys", vmin=0, vmax=1.4, interpolation="nearest")
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("denoising step (dark = reuse, light = recompute)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "schedules.png", dpi=130)
    plt.close(fig)


def run_on_ray(executor, args, methods, pairs, cost, k_cost, todo, threshold_map, env, record) -> None:
    """The pending episodes, grouped by (target, prompt), on Ray actors (`GroupEvaluator`); each group's rows are
    written as it returns, so a killed run resumes where it stopped. Each actor times its own stock runs."""
    groups: dict[tuple, list] = {}
    for target, index, entry in todo:
        groups.setdefault((target, index), []).append(entry)
    items = [(target, index, names) for (target, index), names in groups.items()]
    factory_args = (args.env, env.unwrapped.suite, {"lpips": args.lpips, **args.env_kwargs}, methods, pairs, cost,
                    k_cost, args.timing_repeats, env.unwrapped.calibration if args.calibrate else None, threshold_map)
    bar = tqdm(total=len(todo), desc=f"evaluate on Ray ({args.workers} workers)", unit="episode")
    try:
        gpus = 1 if needs_gpu(args.env, args.env_kwargs) else 0  # a Wan env's actor holds one GPU
        for _, group_rows in executor.map_unordered(GroupEvaluator, factory_args, items, workers=args.workers,
                                                    threads=args.threads, gpus=gpus):
            for row in group_rows:
                record(row)
            bar.update(len(group_rows))
    except WorkerFailed as error:
        raise SystemExit(f"{error}; the episodes returned so far are in {args.out / 'episodes.jsonl'}: rerun the "
                         "same command to finish") from None
    finally:
        bar.close()


def main(argv=None) -> int:
    show_library_messages()
    p = argparse.ArgumentParser(prog="morca evaluate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="MorcaTiny-v0")
    p.add_argument("--env-kwargs", type=json_dict, default={})
    p.add_argument("--suite", help="prompt suite (default: the env's held-out eval suite)")
    p.add_argument("--prompts", type=positive_int, default=200)
    p.add_argument("--skip-prompts", type=nonnegative_int, default=0,
                   help="start after the suite's first N prompts (e.g. keep prompts used to pick settings out of a report)")
    p.add_argument("--targets", type=speedup, nargs="+", help="speedups (default: the model's eval targets)")
    p.add_argument("--methods", nargs="+", default=["uniform", "seacache-global", "seacache-exact", "random"])
    p.add_argument("--out", type=Path, default=Path("runs/eval"))
    p.add_argument("--videos", type=nonnegative_int, default=3, help="prompts to render side by side (at the middle target)")
    p.add_argument("--lpips", action="store_true", help="compute LPIPS (needs AlexNet weights in $TORCH_HOME)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: chosen from the free cores, see morca_env.threads)")
    p.add_argument("--calibrate", type=nonnegative_int, default=0, metavar="ROUNDS",
                   help="measure the speedup calibration first (ROUNDS rounds over ~10 budgets, ~0.5 s per episode "
                        "on MorcaTiny) and use it; saved to <out>/calibration.json and reused on resume. "
                        "0 (default): the installed calibration")
    p.add_argument("--timing-repeats", type=positive_int, default=1, metavar="R",
                   help="time every stock generation and episode R times back to back and count the fastest "
                        "(timeit's convention; a shared machine's noise only adds time); R x the episodes")
    p.add_argument("--feedback", action="store_true",
                   help="closed-loop speedup control: per method and target a SpeedupGovernor corrects the requested "
                        "speedup by the speedups realised so far (drift on a shared machine); rebuilt on resume")
    p.add_argument("--baselines", nargs="+", default=["seacache-exact", "seacache-global", "best-fixed"],
                   help="methods the others are compared with in paired differences (95%% CIs over prompts)")
    p.add_argument("--no-matched", action="store_true",
                   help="skip the matched episodes (each exact-budget baseline replayed at every own-K episode's K, "
                        "for same-K differences of native and global rules; ~0.6 s each on MorcaTiny)")
    p.add_argument("--same-k", action="store_true",
                   help="learned schedulers run at the rules' K (their inference time still counts in their latency, "
                        "not in their K): the paper's Table 4 comparison at equal budget")
    p.add_argument("--workers", type=positive_int, default=2,
                   help="Ray actors with --ray (each its own envs; the local loop runs one episode at a time)")
    add_ray_arguments(p)
    args = p.parse_args(argv)
    if args.feedback and args.same_k:
        p.error("--feedback and --same-k exclude each other: per-method feedback would give each method its own K")
    if args.ray and args.feedback:
        p.error("--feedback needs the episodes in order on one machine (each governor learns from the previous "
                "episodes' speedups); drop --feedback to run on Ray")
    executor = executor_from_args(p, args)
    args.threads = configure_threads(args.threads, workers=args.workers if args.ray else 1)
    args.out.mkdir(parents=True, exist_ok=True)
    kwargs = {"lpips": args.lpips, **args.env_kwargs}
    preset = morca_env.models.presets.PRESETS[gym.spec(args.env).kwargs["model"]]
    args.targets = args.targets or list(preset.eval_targets)
    env, free_env = make_envs(args.env, args.suite or preset.eval_suite, kwargs)
    threshold_map = None
    if args.calibrate:
        threshold_map = use_fresh_calibration(args, env.unwrapped, free_env.unwrapped)
    methods = parse_methods(args.methods)
    loaded = Methods(methods, env, free_env, threshold_map)
    pairs = env.unwrapped.suite.pairs()[args.skip_prompts: args.skip_prompts + args.prompts]
    if not pairs:
        raise SystemExit(f"--skip-prompts {args.skip_prompts} leaves no prompts: the suite has "
                         f"{len(env.unwrapped.suite.pairs())}")
    cost = {name: scheduler_step_cost(*loaded[name], *pairs[0]) if getattr(loaded[name][0], 'learned', False) else 0.0
            for name, _ in methods}
    k_cost = {name: 0.0 if args.same_k else c for name, c in cost.items()}  # what the speedup -> K map counts
    log = args.out / "episodes.jsonl"
    rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    done = {(r["method"], r["target"], r["prompt_index"]) for r in rows}
    todo = [(t, i, m) for t in args.targets for i in range(len(pairs)) for m, _ in methods if (m, t, i) not in done]
    own_k = {m for m, _ in methods if loaded[m][1] is free_env}
    matched = [] if args.no_matched else [b for b in args.baselines if b in dict(methods) and b not in own_k]
    middle = args.targets[len(args.targets) // 2]
    governors = {(m, t): governor_for(loaded[m][1], t, k_cost[m]) for t in args.targets for m, _ in methods
                 } if args.feedback else {}
    for row in rows:  # resume: the governors continue from what the finished episodes realised
        if (row["method"], row["target"]) in governors and "requested_speedup" in row:
            governors[row["method"], row["target"]].record(row["requested_speedup"], row["stock_latency_s"],
                                                           row["latency_s"])
    stock = {}  # (target, prompt index) -> no-cache latency timed next to that group's episodes
    with open(log, "a") as f:
        def record(row):
            f.write(json.dumps(row) + "\n")
            f.flush()
            rows.append(row)

        def run(todo):
            """The episodes of `todo`, (target, prompt index, entry), an entry as `work_entry` reads it."""
            if not todo:
                return None
            if executor is not None:
                return run_on_ray(executor, args, methods, pairs, cost, k_cost, todo, threshold_map, env, record)
            for target, index, entry in tqdm(todo, desc="evaluate", unit="episode"):
                label, name, budget, given_stock_s = work_entry(entry)
                policy, method_env = loaded.for_episode(name, target, index)
                prompt, seed = pairs[index]
                if (target, index) not in stock and given_stock_s is None:
                    stock[target, index] = fastest(lambda: stock_seconds(env.unwrapped, prompt, seed),
                                                   args.timing_repeats)
                governor = governors.get((name, target)) if budget is None else None
                requested = governor.request() if governor else target
                row = evaluate_episode(label, policy, method_env, target, index, pairs[index], requested=requested,
                                       stock_s=given_stock_s if given_stock_s is not None else stock[target, index],
                                       scheduler_cost_s=cost[name], k_cost_s=k_cost[name],
                                       timing_repeats=args.timing_repeats, budget=budget)
                if governor:
                    governor.record(requested, row["stock_latency_s"], row["latency_s"])
                record(row)

        run(todo)
        # a method on its own K (a native or global rule) meets each exact-budget baseline at that K too
        run(pending_matched(rows, own_k, matched))
    for index in range(min(args.videos, len(pairs))):  # side-by-side videos at the middle target
        if (args.out / f"video_{index:03d}.mp4").exists():
            continue
        prompt, seed = pairs[index]
        vids = {}
        for name, _ in methods:
            policy, method_env = loaded[name]
            info, _, _ = run_episode(method_env, policy, {"prompt": prompt, "seed": seed, "speedup": middle,
                                                          "scheduler_cost_s": k_cost[name]})
            vids["reference"] = method_env.unwrapped.reference_video
            vids[f"{name} {min(info['psnr'], 99):.1f}dB"] = method_env.unwrapped.last_video
        write_video(side_by_side(vids), args.out / f"video_{index:03d}.gif")
        write_video(side_by_side(vids, min_height=256), args.out / f"video_{index:03d}.mp4")
    table = summarise(rows, args.targets, methods)
    reference_latency = float(np.mean([r["latency_s"] * r["speedup"] for r in rows])) if rows else 0.0
    text = write_tables(args.out, table, rows, methods, args.targets, reference_latency, args.baselines,
                        own_k, matched)
    plot_pareto(args.out, table)
    schedules = schedule_rows(rows, middle)
    if schedules:
        plot_schedules(args.out, schedules, f"schedules at {middle:.1f}x: {pairs[0][0]}")
    print("\n" + text)
    print(f"wrote {args.out}/table.md, table.csv, pareto.png, schedules.png and videos")
    for policy, _ in loaded.values():
        if hasattr(policy, "close"):
            policy.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
