"""Fit the best fixed schedule: for each K, the schedule with the highest mean PSNR over training prompts.

    morca fit-fixed --budgets 34 39 44                       # MorcaTiny, 12 spread tiny-train prompts
    morca fit-fixed --budgets 34 39 44 --prompts tiny-train:16 --evaluations 200 --workers 2
    # how the shipped one was made: six K's, then the other eleven of 26-42 merged in (each K's command is in the file)
    morca fit-fixed --budgets 29 30 34 35 38 39 --prompts 'tiny-train[::464]' --evaluations 80 \
        --select-on 'tiny-train[11:2651:132]' --fresh --save packaged
    morca fit-fixed --budgets 26 27 28 31 32 33 36 37 40 41 42 --prompts 'tiny-train[::464]' --evaluations 80 \
        --select-on 'tiny-train[11:2651:132]' --save packaged
    # no search: weigh other schedules (moved to each K) against the served one and uniform spacing
    morca fit-fixed --budgets 30 31 32 --evaluations 0 --candidates fits.json --select-on 'tiny-train[11:2651:132]'

One `morca_env.evaluation.search` hill climb per K (each candidate played on every
training prompt); resumable (`--out` keeps every evaluated episode). With
`--select-on`, each K keeps whichever of its fitted schedule, uniform spacing and
(merging into a file) the schedule the file served at that K before scores best
on those validation prompts (disjoint from the training ones). Writes the
schedules as a `StaticSchedule` file (`--save`, default: the user calibration
directory, where `StaticSchedule.packaged` finds it; `--save packaged` writes
the copy shipped with the package), merged into the K's already there unless
`--fresh`. `--candidates` adds schedules fitted elsewhere (another K, a subset
of prompts) to that choice, each moved to the K with as few changes as
possible; with `--evaluations 0` nothing is searched and the file's own schedule
competes with uniform spacing and the candidates.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import gymnasium as gym
from tqdm import tqdm

import morca_env  # noqa: F401
from morca_env.utils.io import atomic_write_text
from morca_env.speedup.files import calibration_file
from morca_env.models.presets import preset_for_env
from morca_env.prompts import get_suite, is_evaluation_suite
from morca_env.evaluation.search import SearchConfig, SearchTask, search_many
from morca_env.cli import env_id, json_dict, nonnegative_int, output_directory, thread_count, worker_count


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="morca fit-fixed", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", type=env_id, default="MorcaTiny-v0")
    p.add_argument("--env-kwargs", type=json_dict, default={}, help="JSON dict of env arguments (e.g. num_inference_steps)")
    p.add_argument("--budgets", type=nonnegative_int, nargs="+", required=True, help="the K values to fit")
    p.add_argument("--prompts", help="training prompts with fixed seeds (<suite>:<n> or <suite>[start:stop:step]; "
                   "default: the model's, e.g. tiny-train[::464], 12 spread over MorcaTiny's grammar)")
    p.add_argument("--evaluations", type=nonnegative_int, default=120,
                   help="schedules evaluated per K (0: no search, only the --select-on choice)")
    p.add_argument("--seed", type=int, default=0, help="search RNG seed")
    p.add_argument("--workers", type=worker_count, default=1)
    p.add_argument("--threads", type=thread_count, default=1)
    p.add_argument("--out", type=output_directory, default=Path("runs/fixed_schedule"), help="search logs (resumable)")
    p.add_argument("--save", default="user", help="'user', 'packaged' or a file path")
    p.add_argument("--select-on", default=None, help="validation prompts (a training-suite slice disjoint from "
                   "--prompts): per K, keep the fitted schedule only where it beats uniform spacing there")
    p.add_argument("--fresh", action="store_true", help="write only this run's K's (default: merge into the file)")
    p.add_argument("--candidates", nargs="+", type=Path, default=[],
                   help="JSON files of more schedules to weigh at --select-on: a schedules file "
                        "({\"schedules\": {K: schedule}}, its nearest K used) or {name: schedule}")
    args = p.parse_args(argv)
    if (args.candidates or not args.evaluations) and not args.select_on:
        p.error("--candidates and --evaluations 0 choose on validation prompts: pass --select-on")
    try:
        candidates = {f"{path.stem}:{name}": schedules for path in args.candidates
                      for name, schedules in read_candidates(path).items()}
    except (OSError, ValueError) as error:
        p.error(f"--candidates: {error}")
    args.prompts = args.prompts or preset_for_env(args.env).prompts.fit_fixed
    for option, suite in (("--prompts", args.prompts), ("--select-on", args.select_on)):
        if suite is not None and is_evaluation_suite(suite):
            p.error(f"{option} {suite!r} is an evaluation suite; fit and select on training prompts")
    pairs = tuple(get_suite(args.prompts).pairs())
    validation = tuple(get_suite(args.select_on).pairs()) if args.select_on else ()
    shared = sorted({prompt for prompt, _ in pairs} & {prompt for prompt, _ in validation})
    if shared:
        p.error(f"--select-on shares {len(shared)} prompts with --prompts (e.g. {shared[0]!r}); use disjoint slices")
    env_kwargs = args.env_kwargs
    spec = gym.make(args.env, **{"lpips": False, "latent_features": False, **env_kwargs}).unwrapped.budget_spec
    for k in args.budgets:
        spec.check_budget(k)
    model = gym.spec(args.env).kwargs["model"]
    path = (calibration_file(f"{model}_fixed_schedules.json", args.save) if args.save in ("user", "packaged")
            else Path(args.save))
    old = json.loads(path.read_text()) if path.exists() and not args.fresh else {}
    from morca_env.schedulers.fixed import StaticSchedule, UniformInterval

    served = StaticSchedule(old["schedules"]) if old.get("schedules") else None
    if args.evaluations:
        tasks = [SearchTask(f"fixed_K{k:03d}", pairs, k) for k in args.budgets]
        results = search_many(tasks, args.env, env_kwargs, args.out,
                              SearchConfig(evaluations=args.evaluations, seed=args.seed),
                              workers=args.workers, threads=args.threads)
        fitted = {str(r["budget"]): r["schedule"] for r in results}
        fits = {str(r["budget"]): {"train_psnr": r["value"], "uniform_train_psnr": r["start_value"],
                                   "evaluations": r["evaluations"]} for r in results}
    else:  # no search: the schedule the file serves at K (uniform spacing where it has none) is the one to beat
        fitted = {str(k): (served.plan(spec, k) if served is not None and k in served.schedules
                           else UniformInterval().plan(spec, k)) for k in args.budgets}
        fits = {str(k): {"evaluations": 0} for k in args.budgets}
    if validation:
        from morca_env.evaluation.search import validated_schedule
        from morca_env.schedulers.schedule import adjust_reuses, schedule_key

        env = gym.make(args.env, **{"lpips": False, "latent_features": False, **env_kwargs})
        for k, schedule in tqdm(list(fitted.items()), desc="validation", unit="K"):
            alternatives = {}
            if served is not None and int(k) not in served.schedules:  # what the file played at K before this fit
                nearest = min(served.schedules, key=lambda n: (abs(n - int(k)), n))
                alternatives[f"moved from K={nearest}"] = served.plan(spec, int(k))
            seen = {schedule_key(schedule), schedule_key(UniformInterval().plan(spec, int(k)))}
            for name, by_k in candidates.items():
                nearest = min(by_k, key=lambda n: (abs(n - int(k)), n))
                moved = adjust_reuses(by_k[nearest], spec, int(k))
                if schedule_key(moved) not in seen:  # a candidate equal to one already weighed costs nothing
                    alternatives[name if nearest == int(k) else f"{name} moved from K={nearest}"] = moved
                    seen.add(schedule_key(moved))
            fitted[k], scores = validated_schedule(env, schedule, validation, args.out / f"validation_K{int(k):03d}.jsonl",
                                                   alternatives)
            fits[k].update(scores)
        env.close()
    source = (f"morca fit-fixed --env {args.env} --prompts {args.prompts} --evaluations {args.evaluations} "
              f"--seed {args.seed}" + (f" --select-on {args.select_on}" if validation else "")
              + "".join(f" --candidates {path.name}" for path in args.candidates))
    for fit in fits.values():  # a merged file keeps each K's own command (the file's "source" is the latest)
        fit["source"] = source
    atomic_write_text(path, json.dumps({"source": source, "prompts": args.prompts, "select_on": args.select_on,
                                        "schedules": {**old.get("schedules", {}), **fitted},
                                        "fits": {**old.get("fits", {}), **fits}}, indent=1) + "\n")
    for k, fit in fits.items():
        line = (f"K={k}: mean training PSNR {fit['train_psnr']:.2f} dB (uniform {fit['uniform_train_psnr']:.2f}), "
                f"{fit['evaluations']} schedules x {len(pairs)} prompts" if fit["evaluations"] else f"K={k}: no search")
        if "kept" in fit:
            others = "".join(f", {name[:-len('_validation_psnr')]} {v:.2f}" for name, v in fit.items()
                             if name.endswith("_validation_psnr"))
            line += (f"; validation {fit['validation_psnr']:.2f} dB ({others[2:]}) over {len(validation)} prompts: "
                     f"kept {fit['kept']}")
        print(line)
    print(f"wrote {path}")
    return 0


def read_candidates(path: Path) -> dict[str, dict[int, list[int]]]:
    """{name: {K: schedule}} from a schedules file (one name, every K) or a {name: schedule} file (one K each)."""
    data = json.loads(path.read_text())
    if isinstance(data, dict) and isinstance(data.get("schedules"), dict):
        return {"schedules": {int(k): [int(a) for a in s] for k, s in data["schedules"].items()}}
    if not isinstance(data, dict) or not data or not all(isinstance(s, list) for s in data.values()):
        raise ValueError(f"{path}: expected {{\"schedules\": {{K: schedule}}}} or {{name: schedule}}")
    return {name: {sum(map(int, s)): [int(a) for a in s]} for name, s in data.items()}


if __name__ == "__main__":
    sys.exit(main())
