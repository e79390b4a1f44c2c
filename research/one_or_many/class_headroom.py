"""Class-level headroom: what a scheduler that knows a video's content class could gain over one schedule.

For each content class and K, fit a best fixed schedule on that class's training prompts with the
procedure and the episode count of the global fit (`morca fit-fixed`: a hill climb from uniform spacing,
80 schedules x 12 prompts), keep it, uniform spacing or the global schedule, whichever scores best on
8 validation prompts of the class (so a class schedule is never chosen on its training prompts alone),
then play every class's schedule and the global one on held-out pairs of every class (the transfer
matrix). The fair "one schedule" is the best single candidate (any class's fit, the global fit, uniform spacing)
on the validation prompts of all classes together: the class-level headroom is what the class schedules gain over it.
Resumable: every episode is logged under `--out`.

    python research/one_or_many/class_headroom.py --env MorcaScenes-v0 --budgets 32 --workers 2
    python research/one_or_many/class_headroom.py --env MorcaScenes-v0 --budgets 27 32 36 --report

Prompts: training and validation come from the env's training suite, disjoint; the held-out pairs are
the first `--eval-per-class` pairs of each class in its evaluation suite (fixed seeds no fit or
selection saw), topped up, for a class the suite holds too few of, with other training prompts under fresh seeds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np

import morca_env  # noqa: F401
from morca_env.utils.io import atomic_write_text
from morca_env.prompts import get_suite
from morca_env.schedulers.fixed import StaticSchedule, UniformInterval
from morca_env.evaluation.search import (
    EvaluationLog, SearchConfig, SearchTask, schedule_key, schedule_objective, search_many)
from morca_env.evaluation.search import validated_schedule
from morca_env.parallel.workers import map_on_envs

TESTBEDS = {  # env -> (model, training suite, evaluation suite)
    "MorcaScenes-v0": ("scenes", "scenes-train", "scenes-eval"),
    "MorcaTiny-v0": ("tiny", "tiny-train", "tiny-eval"),
}
ENV_KWARGS = {"lpips": False, "latent_features": False}


def content_class(env_id: str, prompt: str) -> str:
    """Scenes: motion amount x complexity (its grammar's strata); Tiny: speed x size."""
    if env_id == "MorcaScenes-v0":
        from morca_env.models.scenes_data import parse_prompt

        return parse_prompt(prompt).content_class
    from morca_env.models.tiny_data import parse_prompt

    scene = parse_prompt(prompt)
    return f"{scene.speed or 'medium-speed'}/{scene.size or 'medium'}"


def class_pairs(env_id: str, train_per_class: int, validate_per_class: int, eval_per_class: int) -> dict:
    """{class: {"train": pairs, "validate": pairs, "eval": pairs}}; train and validate from the training suite in its
    (shuffled) order, eval from the held-out suite; training pairs never validate."""
    _, train_suite, eval_suite = TESTBEDS[env_id]
    split: dict[str, dict[str, list]] = {}
    for prompt, seed in get_suite(f"{train_suite}[::1]").pairs():
        groups = split.setdefault(content_class(env_id, prompt), {"train": [], "validate": [], "eval": []})
        if len(groups["train"]) < train_per_class:
            groups["train"].append((prompt, int(seed)))
        elif len(groups["validate"]) < validate_per_class:
            groups["validate"].append((prompt, int(seed)))
    for prompt, seed in get_suite(eval_suite).pairs():
        groups = split[content_class(env_id, prompt)]
        if len(groups["eval"]) < eval_per_class:
            groups["eval"].append((prompt, int(seed)))
    # a class the evaluation suite holds too few of (MorcaTiny's, drawn without strata) is topped up with training
    # prompts that neither fit nor validate it, each under a fresh seed that no fit or selection saw
    fresh = np.random.default_rng(2026_12_05)
    used = {p for g in split.values() for p, _ in g["train"] + g["validate"]}
    for prompt, _ in get_suite(f"{train_suite}[::1]").pairs():
        groups = split[content_class(env_id, prompt)]
        if len(groups["eval"]) < eval_per_class and prompt not in used:
            groups["eval"].append((prompt, int(fresh.integers(0, 2**31 - 1))))
    short = {c: len(g["eval"]) for c, g in split.items() if len(g["eval"]) < eval_per_class}
    if short:
        raise ValueError(f"fewer than {eval_per_class} held-out pairs for classes {short}")
    return dict(sorted(split.items()))


def slug(name: str) -> str:
    return name.replace("/", "-")


def _evaluate(env, job) -> str:
    """Play every schedule on every pair of one (K, class) group; the log keeps each episode."""
    log_path, pairs, schedules = job
    log = EvaluationLog(log_path)
    for pair in pairs:
        value = schedule_objective(env, [tuple(pair)], log)
        try:
            for schedule in schedules.values():
                value([int(a) for a in schedule])
        finally:
            for player in value.players.values():
                player.close()
    return log_path


def class_schedules(args, split: dict, k: int) -> dict:
    """Fit (resumable) and validate each class's schedule at K -> {name: schedule}, "global" included."""
    out = args.out / f"K{k:03d}"
    config = SearchConfig(evaluations=args.evaluations, seed=args.seed)
    tasks = [SearchTask(f"fit_{slug(c)}", tuple(g["train"]), k) for c, g in split.items()]
    results = {r["name"]: r for r in search_many(tasks, args.env, ENV_KWARGS, out / "fits", config,
                                                 workers=args.workers, threads=args.threads)}
    model = TESTBEDS[args.env][0]
    env = gym.make(args.env, **ENV_KWARGS)
    spec = env.unwrapped.budget_spec
    schedules = {"global": [int(a) for a in StaticSchedule.packaged(model).plan(spec, k)],
                 "uniform": [int(a) for a in UniformInterval().plan(spec, k)]}
    chosen_path = out / "class_schedules.json"
    chosen = json.loads(chosen_path.read_text()) if chosen_path.exists() else {}
    for c, groups in split.items():
        if c not in chosen:
            fitted = results[f"fit_{slug(c)}"]["schedule"]
            schedule, scores = validated_schedule(env, fitted, groups["validate"], out / f"validate_{slug(c)}.jsonl",
                                                  {"global": schedules["global"]})
            chosen[c] = {"schedule": schedule, **scores, "train_psnr": results[f"fit_{slug(c)}"]["value"]}
            atomic_write_text(chosen_path, json.dumps(chosen, indent=1) + "\n")
    env.close()
    return {**schedules, **{c: v["schedule"] for c, v in chosen.items()}}


def fitted_schedules(args, split: dict, k: int) -> dict:
    """{class: its fitted schedule} (before validation) from the fit logs' results."""
    out = args.out / f"K{k:03d}" / "fits"
    return {c: json.loads((out / f"fit_{slug(c)}.json").read_text())["schedule"] for c in split}


def pooled_choice(args, split: dict, k: int) -> tuple[str, list[int]]:
    """The best ONE schedule among every class's fit, the global fit and uniform spacing, chosen on the validation
    prompts of all classes together: the fair "one schedule" to compare class schedules with (the same
    candidates, selected on the same prompts, only not told the class)."""
    env = gym.make(args.env, **ENV_KWARGS)
    spec = env.unwrapped.budget_spec
    env.close()
    candidates = {"global": [int(a) for a in StaticSchedule.packaged(TESTBEDS[args.env][0]).plan(spec, k)],
                  "uniform": [int(a) for a in UniformInterval().plan(spec, k)],
                  **{f"fit {c}": s for c, s in fitted_schedules(args, split, k).items()}}
    out = args.out / f"K{k:03d}"
    jobs = [(str(out / f"validate_pooled_{slug(c)}.jsonl"), g["validate"], candidates) for c, g in split.items()]
    for _ in map_on_envs(_evaluate, jobs, args.env, ENV_KWARGS, args.workers, args.threads):
        pass
    means = {}
    for name, schedule in candidates.items():
        key = schedule_key(schedule)
        values = [psnr_table(out / f"validate_pooled_{slug(c)}.jsonl")[(p, s, key)]
                  for c, g in split.items() for p, s in g["validate"]]
        means[name] = float(np.mean(values))
    best = max(means, key=lambda n: means[n])
    atomic_write_text(out / "pooled_choice.json", json.dumps({"chosen": best, "schedule": candidates[best],
                                                              "validation_psnr": means}, indent=1) + "\n")
    return best, candidates[best]


def evaluate(args, split: dict, k: int, schedules: dict) -> None:
    out = args.out / f"K{k:03d}"
    jobs = [(str(out / f"eval_{slug(c)}.jsonl"), g["eval"], schedules) for c, g in split.items()]
    from tqdm import tqdm

    for _ in tqdm(map_on_envs(_evaluate, jobs, args.env, ENV_KWARGS, args.workers, args.threads), total=len(jobs),
                  desc=f"held-out K={k}", unit="class"):
        pass


def psnr_table(path: Path) -> dict:
    """{(prompt, seed, schedule key): psnr} of one evaluation log."""
    from morca_env.utils.io import read_json_lines

    return {(r["prompt"], int(r["seed"]), r["schedule"]): float(r["psnr"]) for r in read_json_lines(path)}


def mean_ci(x: np.ndarray) -> tuple[float, float, float]:
    """Mean and a 95% t-interval (paired differences over pairs)."""
    from scipy import stats

    m = float(np.mean(x))
    half = float(stats.t.ppf(0.975, len(x) - 1) * np.std(x, ddof=1) / np.sqrt(len(x))) if len(x) > 1 else float("nan")
    return m, m - half, m + half


def report(args, split: dict, budgets: list[int]) -> dict:
    """Per K: the paired difference (class schedule on its class minus global) per class with its 95% CI, the
    mean over classes (the class-level headroom) and the transfer matrix (schedule i on class j minus global)."""
    results = {"env": args.env, "classes": list(split), "budgets": {}}
    for k in budgets:
        out = args.out / f"K{k:03d}"
        chosen = json.loads((out / "class_schedules.json").read_text())
        env = gym.make(args.env, **ENV_KWARGS)
        spec = env.unwrapped.budget_spec
        glob = schedule_key(StaticSchedule.packaged(TESTBEDS[args.env][0]).plan(spec, k))
        uniform = schedule_key(UniformInterval().plan(spec, k))
        keys = {c: schedule_key(v["schedule"]) for c, v in chosen.items()}
        own, matrix, vs_uniform = {}, [], {}
        for j, cj in enumerate(split):
            table = psnr_table(out / f"eval_{slug(cj)}.jsonl")
            pairs = split[cj]["eval"]
            base = np.array([table[(p, s, glob)] for p, s in pairs])
            row = []
            for ci in split:
                row.append(float(np.mean([table[(p, s, keys[ci])] for p, s in pairs]) - base.mean()))
            matrix.append(row)
            diff = np.array([table[(p, s, keys[cj])] for p, s in pairs]) - base
            m, lo, hi = mean_ci(diff)
            own[cj] = {"diff": m, "ci": [lo, hi], "n": len(pairs), "kept": chosen[cj]["kept"],
                       "global_psnr": float(base.mean())}
            vs_uniform[cj] = float(base.mean() - np.mean([table[(p, s, uniform)] for p, s in pairs]))
        entry = {"per_class": own, "headroom": float(np.mean([v["diff"] for v in own.values()])),
                 "transfer": matrix, "global_minus_uniform": vs_uniform}
        pooled_path = out / "pooled_choice.json"
        if pooled_path.exists():  # class schedules against the best ONE schedule of the same candidates
            pooled = json.loads(pooled_path.read_text())
            one = schedule_key(pooled["schedule"])
            per = {}
            for cj in split:
                table = psnr_table(out / f"eval_{slug(cj)}.jsonl")
                pairs = split[cj]["eval"]
                diff = np.array([table[(p, s, keys[cj])] - table[(p, s, one)] for p, s in pairs])
                m, lo, hi = mean_ci(diff)
                per[cj] = {"diff": m, "ci": [lo, hi],
                           "one_minus_global": float(np.mean([table[(p, s, one)] - table[(p, s, glob)]
                                                              for p, s in pairs]))}
            entry["vs_one_schedule"] = {"chosen": pooled["chosen"], "per_class": per,
                                        "headroom": float(np.mean([v["diff"] for v in per.values()])),
                                        "one_minus_global": float(np.mean([v["one_minus_global"]
                                                                           for v in per.values()]))}
        results["budgets"][str(k)] = entry
    atomic_write_text(args.out / "class_headroom.json", json.dumps(results, indent=1) + "\n")
    plot_transfer(results, args.out / "transfer.png")
    return results


def plot_transfer(results: dict, path: Path) -> None:
    """One heatmap per K: rows = the class whose prompts are played, columns = whose schedule, cells = mean PSNR
    minus the global schedule's (dB)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budgets = list(results["budgets"])
    classes = results["classes"]
    fig, axes = plt.subplots(1, len(budgets), figsize=(4.6 * len(budgets), 4.4), squeeze=False)
    lim = max(0.05, max(abs(v) for k in budgets for row in results["budgets"][k]["transfer"] for v in row))
    for i, (ax, k) in enumerate(zip(axes[0], budgets)):
        m = np.array(results["budgets"][k]["transfer"])
        im = ax.imshow(m, cmap="RdBu", vmin=-lim, vmax=lim)
        ax.set_xticks(range(len(classes)), classes, rotation=60, ha="right", fontsize=7)
        # the rows are the same classes in every panel: named once, at the left
        ax.set_yticks(range(len(classes)), classes if i == 0 else [], fontsize=7)
        ax.set_xlabel("schedule fitted on class")
        if i == 0:
            ax.set_ylabel("held-out prompts of class")
        ax.set_title(f"K = {k}: PSNR - global (dB)")
        for (r, c), v in np.ndenumerate(m):
            ax.text(c, r, f"{v:+.2f}", ha="center", va="center", fontsize=6)
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", choices=sorted(TESTBEDS), default="MorcaScenes-v0")
    p.add_argument("--budgets", type=int, nargs="+", required=True)
    p.add_argument("--evaluations", type=int, default=80, help="schedules per fit (the global fit's)")
    p.add_argument("--train-per-class", type=int, default=12, help="training prompts per fit (the global fit's)")
    p.add_argument("--validate-per-class", type=int, default=8)
    p.add_argument("--eval-per-class", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=None, help="default runs/one_or_many/<model>")
    p.add_argument("--report", action="store_true", help="only summarise what the logs hold")
    args = p.parse_args(argv)
    args.out = args.out or Path("runs/one_or_many") / TESTBEDS[args.env][0]
    split = class_pairs(args.env, args.train_per_class, args.validate_per_class, args.eval_per_class)
    if not args.report:
        for k in args.budgets:
            schedules = class_schedules(args, split, k)
            _, one = pooled_choice(args, split, k)
            evaluate(args, split, k, {**schedules, "one": one})
    results = report(args, split, args.budgets)
    for k, r in results["budgets"].items():
        print(f"K={k}: class schedules - the shipped global one: {r['headroom']:+.3f} dB")
        for c, v in r["per_class"].items():
            print(f"  {c:22s} {v['diff']:+.3f} dB [{v['ci'][0]:+.3f}, {v['ci'][1]:+.3f}] (kept {v['kept']})")
        if "vs_one_schedule" in r:
            one = r["vs_one_schedule"]
            print(f"K={k}: the best one schedule ({one['chosen']}) - the shipped global: {one['one_minus_global']:+.3f} "
                  f"dB; class schedules - the best one: {one['headroom']:+.3f} dB (the class-level headroom)")
            for c, v in one["per_class"].items():
                print(f"  {c:22s} {v['diff']:+.3f} dB [{v['ci'][0]:+.3f}, {v['ci'][1]:+.3f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
