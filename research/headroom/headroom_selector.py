"""Can a scheduler reach the per-run headroom by choosing from a small library of searched schedules after
watching the run's first steps? (`selector_library.py` beside it)

    python research/headroom/headroom_selector.py --budget 35 --prefix 8 --workers 2 --out runs/selector

1. Searches one (prompt, seed) per search prompt at K, starting from the best fixed schedule with its first
   `--prefix` steps frozen (so every found schedule shares them).
2. Plays every found schedule and the best fixed schedule on every search run; a greedy library of `--size`
   members (the best fixed schedule first) maximises the mean over runs of the best member's reward, a run's
   own searched schedule left out of its maximum.
3. Plays the library on the label runs (the selector's training set) and the validation runs, and reads each
   run's switch features (after the prefix) and, for comparison, its no-cache profile (not causal).
4. Reports, on the validation runs: the oracle choice among the library, a constant choice, and ridge selectors
   (alpha and feature set chosen by 5-fold cross-validation on the label runs only), as gains over the best
   fixed schedule with 95% CIs.
Training prompts only, disjoint from the best fixed schedule's fit and validation prompts; every stage resumes
from its evaluation log.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np

import morca_env  # noqa: F401  (registers the envs)
from morca_env.cli import experiment_parser, positive_int, show_library_messages
from morca_env.utils.io import atomic_write_text
from selector_library import FEATURE_KINDS, feature_vector, fit_by_cv, greedy_library, play_on_runs, realised
from morca_env.schedulers.fixed import StaticSchedule
from morca_env.prompts import get_suite
from morca_env.evaluation.search import SearchConfig, SearchTask, search_many
from morca_env.utils.threads import configure_threads

RESERVED = ("tiny-train[::464]", "tiny-train[11::132]")  # the best fixed schedule's fit and validation prompts
ALPHAS = (0.3, 1.0, 3.0, 10.0, 30.0)


def pairs_of(spec: str, exclude: set[str]) -> list[tuple[str, int]]:
    return [(p, s) for p, s in get_suite(spec).pairs() if p not in exclude]


def ci(values) -> str:
    values = np.asarray(values, dtype=float)
    return f"{values.mean():+.2f} ± {1.96 * values.std(ddof=1) / np.sqrt(len(values)):.2f}"


def save_library(where: str, env, budget: int, entry: dict) -> Path:
    """Add (or replace) K's entry of a library file, written atomically."""
    from morca_env.speedup.files import calibration_file

    filename = f"{env.preset.name}_library.json"
    path = calibration_file(filename, where) if where in ("user", "packaged") else Path(where)
    data = json.loads(path.read_text()) if path.exists() else {"source": "research/headroom/headroom_selector.py", "libraries": {}}
    data["libraries"][str(budget)] = entry
    data["libraries"] = dict(sorted(data["libraries"].items(), key=lambda kv: int(kv[0])))
    atomic_write_text(path, json.dumps(data) + "\n")
    return path


def main(argv=None) -> int:
    show_library_messages()
    p = experiment_parser(__doc__)
    p.add_argument("--budget", type=positive_int, default=35)
    p.add_argument("--prefix", type=int, default=8, help="steps played before the switch (the best fixed schedule's)")
    p.add_argument("--size", type=positive_int, default=8, help="library members")
    p.add_argument("--search-prompts", default="tiny-train[23::173]")
    p.add_argument("--label-prompts", default="tiny-train[41::28]")
    p.add_argument("--validation-prompts", default="tiny-train[59::70]")
    p.add_argument("--evaluations", type=positive_int, default=60)
    p.add_argument("--best-fixed", default=None, help="fixed-schedule file (default: the env's packaged one)")
    p.add_argument("--save", default=None,
                   help="add this K's library and the selector chosen by cross-validation to a library file: 'user' "
                        "(this machine's, found first), 'packaged' (shipped with the package) or a file path; "
                        "the `library` scheduler reads it")
    args = p.parse_args(argv)
    args.threads = configure_threads(args.threads, workers=args.workers)
    env = gym.make(args.env, lpips=False, latent_features=False, **args.env_kwargs).unwrapped
    budget = env.budget_spec.check_budget(args.budget)
    if not 1 <= args.prefix < env.num_steps:
        p.error(f"--prefix {args.prefix} must be in [1, {env.num_steps - 1}]")
    fixed = StaticSchedule.from_file(args.best_fixed) if args.best_fixed else StaticSchedule.packaged(env.preset.name)
    best_fixed = [int(a) for a in fixed.plan(env.budget_spec, budget)]
    prefix = best_fixed[:args.prefix]

    taken = {q for spec in RESERVED for q in get_suite(spec).prompts}
    search_pairs = pairs_of(args.search_prompts, taken)
    taken |= {q for q, _ in search_pairs}
    label_pairs = pairs_of(args.label_prompts, taken)
    taken |= {q for q, _ in label_pairs}
    validation_pairs = pairs_of(args.validation_prompts, taken)
    print(f"runs: {len(search_pairs)} searched, {len(label_pairs)} label, {len(validation_pairs)} validation; "
          f"K {budget}, prefix {''.join(map(str, prefix))}")

    tasks = [SearchTask(f"run{i:03d}_K{budget:03d}", (pair,), budget, tuple(best_fixed))
             for i, pair in enumerate(search_pairs)]
    config = SearchConfig(evaluations=args.evaluations, frozen_prefix=args.prefix)
    found = search_many(tasks, args.env, args.env_kwargs, args.out / "searches", config, workers=args.workers,
                        threads=args.threads)
    # one candidate per distinct schedule; one that a single search found is left out of its run's maximum (one
    # that several searches found, or the best fixed schedule a search kept, is nobody's overfitted own)
    candidates, found_for = {"best-fixed": best_fixed}, []
    for task, result in zip(tasks, found):
        name = next((n for n, s in candidates.items() if s == result["schedule"]), task.name)
        candidates[name] = result["schedule"]
        found_for.append(name)
    own = {n: b for b, n in enumerate(found_for) if n != "best-fixed" and found_for.count(n) == 1}
    matrix, _ = play_on_runs(args.env, args.env_kwargs, candidates, search_pairs, args.out / "candidates.jsonl",
                             workers=args.workers, threads=args.threads, desc="candidates")
    members = greedy_library(matrix, args.size, "best-fixed", own)
    library = {name: candidates[name] for name in members}

    sets = {}
    for name, pairs in (("label", label_pairs), ("validation", validation_pairs)):
        rewards, features = play_on_runs(args.env, args.env_kwargs, library, pairs, args.out / f"{name}.jsonl",
                                         prefix=prefix, profile=True, workers=args.workers, threads=args.threads,
                                         desc=name)
        sets[name] = (np.array([rewards[m] for m in members]).T, features)

    lines = [f"{args.env}, K = {budget}, prefix {args.prefix} steps, library of {len(members)} "
             f"({len(search_pairs)} searches x {args.evaluations} evaluations); gains in dB over the best fixed "
             "schedule, 95% CI over runs", ""]
    own_gain = [matrix[n][b] - matrix["best-fixed"][b] for b, n in enumerate(found_for)]
    lines.append(f"searched for its own run (prefix frozen): {ci(own_gain)} over {len(tasks)} search runs")
    lines += ["", "| library size | oracle choice, label runs | oracle choice, validation runs |", "|---|---|---|"]
    (lab_r, lab_f), (val_r, val_f) = sets["label"], sets["validation"]
    for size in range(2, len(members) + 1):
        lines.append(f"| {size} | {ci(lab_r[:, :size].max(1) - lab_r[:, 0])} | "
                     f"{ci(val_r[:, :size].max(1) - val_r[:, 0])} |")
    constant = int(np.argmax(lab_r.mean(axis=0)))
    lines += ["", f"constant choice (the member best on the label runs: {members[constant]}): "
              f"{ci(val_r[:, constant] - val_r[:, 0])} on validation", ""]
    sizes = sorted({2, 4, len(members)} & set(range(2, len(members) + 1)))
    lines += ["| selector | size | alpha | 5-fold CV on label runs | validation runs |", "|---|---|---|---|---|"]
    scores = []
    for kind in FEATURE_KINDS:
        for size in sizes:
            alpha, cv, selector = fit_by_cv(feature_vector(lab_f, kind), lab_r[:, :size], ALPHAS)
            gain = realised(val_r[:, :size], selector.choose(feature_vector(val_f, kind))) - val_r[:, 0]
            scores.append((cv.mean(), kind, size, alpha, gain, selector))
            lines.append(f"| ridge on {kind} | {size} | {alpha} | {ci(cv)} | {ci(gain)} |")
    # not causal: the no-cache run's whole profile (an upper bound on what features of this kind could tell)
    for size in sizes:
        alpha, cv, selector = fit_by_cv(lab_f["profile"], lab_r[:, :size], ALPHAS)
        gain = realised(val_r[:, :size], selector.choose(val_f["profile"])) - val_r[:, 0]
        lines.append(f"| ridge on the no-cache run's profile (not causal) | {size} | {alpha} | {ci(cv)} | {ci(gain)} |")
    if len(members) >= 2:  # does the choice get learnable with more labelled runs?
        size = min(5, len(members))
        counts = [n for n in (25, 50, 100, 200, 400, 800) if n < len(lab_r)] + [len(lab_r)]
        curve = {"pooled x0": "pooled", "x0 statistics": "summary", "no-cache profile (not causal)": "profile"}
        lines += ["", f"learning curve ({size} members; alpha by 5-fold CV on the first n label runs; validation "
                  "runs):", "", "| label runs | " + " | ".join(f"ridge on {k}" for k in curve) + " |",
                  "|---|" + "---|" * len(curve)]
        for n in counts:
            cells = []
            for key in curve.values():
                _, _, selector = fit_by_cv(lab_f[key][:n], lab_r[:n, :size], ALPHAS)
                cells.append(ci(realised(val_r[:, :size], selector.choose(val_f[key])) - val_r[:, 0]))
            lines.append(f"| {n} | " + " | ".join(cells) + " |")
    best = max(scores, key=lambda s: s[0]) if scores else None
    if best is not None:
        lines += ["", f"chosen by CV on the label runs: ridge on {best[1]}, size {best[2]}, alpha {best[3]}: "
                  f"**{ci(best[4])}** on the validation runs"]
    else:
        lines += ["", "no searched schedule beats the best fixed schedule on any other search run: nothing to select"]
    lines += ["", "library (best fixed first):"] + [f"- `{''.join(map(str, library[m]))}` {m}" for m in members]
    text = "\n".join(lines) + "\n"
    atomic_write_text(args.out / "selector.md", text)
    atomic_write_text(args.out / "selector.json", json.dumps({
        "budget": budget, "prefix": prefix, "members": members, "library": library,
        "label": {"pairs": label_pairs, "rewards": lab_r.tolist()},
        "validation": {"pairs": validation_pairs, "rewards": val_r.tolist()}}) + "\n")
    if args.save is not None and best is None:
        print(f"nothing saved to {args.save}: the library is the best fixed schedule alone")
    elif args.save is not None:
        _, kind, size, alpha, _, selector = best
        path = save_library(args.save, env, budget, {
            "prefix": args.prefix, "members": [library[m] for m in members[:size]], "names": members[:size],
            "feature": kind, "selector": selector.to_dict(),
            "validation_gain_db": float(best[4].mean()), "fitted_on": args.label_prompts})
        print(f"library for K {budget} saved to {path}")
    np.savez(args.out / "features.npz", **{f"{s}_{k}": v for s, (_, f) in sets.items() for k, v in f.items()})
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
