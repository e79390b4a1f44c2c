"""Fit the best fixed schedule: for each K, the schedule with the highest mean PSNR over training prompts.

    python scripts/fit_fixed_schedule.py --budgets 34 39 44                       # MorcaTiny, 12 tiny-train prompts
    python scripts/fit_fixed_schedule.py --budgets 34 39 44 --prompts tiny-train:16 --evaluations 200 --workers 2

One `morca_env.search` hill climb per K (each candidate played on every
training prompt); resumable (`--out` keeps every evaluated episode). Writes the
schedules as a `StaticSchedule` file (`--save`, default: the user calibration
directory, where `StaticSchedule.packaged` finds it; `--save packaged` writes
the copy shipped with the package).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import gymnasium as gym

import morca_env  # noqa: F401
from morca_env.io import atomic_write_text
from morca_env.calibrate import calibration_file
from morca_env.prompts import get_suite
from morca_env.search import SearchConfig, SearchTask, search_many
from morca_env.cli import json_dict, nonnegative_int, positive_int


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="MorcaTiny-v0")
    p.add_argument("--env-kwargs", type=json_dict, default={}, help="JSON dict of env arguments (e.g. num_inference_steps)")
    p.add_argument("--budgets", type=nonnegative_int, nargs="+", required=True, help="the K values to fit")
    p.add_argument("--prompts", default="tiny-train:12", help="training prompt suite with fixed seeds (<suite>:<n>)")
    p.add_argument("--evaluations", type=positive_int, default=120, help="schedules evaluated per K")
    p.add_argument("--seed", type=int, default=0, help="search RNG seed")
    p.add_argument("--workers", type=positive_int, default=1)
    p.add_argument("--threads", type=positive_int, default=1)
    p.add_argument("--out", type=Path, default=Path("runs/fixed_schedule"), help="search logs (resumable)")
    p.add_argument("--save", default="user", help="'user', 'packaged' or a file path")
    args = p.parse_args(argv)
    if args.prompts.startswith("tiny-eval") or args.prompts.startswith("vbench-eval"):
        p.error(f"--prompts {args.prompts!r} is an evaluation suite; fit on training prompts")
    pairs = tuple(get_suite(args.prompts).pairs())
    env_kwargs = args.env_kwargs
    spec = gym.make(args.env, lpips=False, latent_features=False, **env_kwargs).unwrapped.budget_spec
    for k in args.budgets:
        spec.check_budget(k)
    tasks = [SearchTask(f"fixed_K{k:03d}", pairs, k) for k in args.budgets]
    results = search_many(tasks, args.env, env_kwargs, args.out, SearchConfig(evaluations=args.evaluations, seed=args.seed),
                          workers=args.workers, threads=args.threads)
    model = gym.spec(args.env).kwargs["model"]
    path = (calibration_file(f"{model}_fixed_schedules.json", args.save) if args.save in ("user", "packaged")
            else Path(args.save))
    old = json.loads(path.read_text())["schedules"] if path.exists() else {}
    schedules = {**old, **{str(r["budget"]): r["schedule"] for r in results}}
    fits = {str(r["budget"]): {"train_psnr": r["value"], "uniform_train_psnr": r["start_value"],
                               "evaluations": r["evaluations"]} for r in results}
    source = (f"scripts/fit_fixed_schedule.py --prompts {args.prompts} --evaluations {args.evaluations} "
              f"--seed {args.seed} ({args.env})")
    atomic_write_text(path, json.dumps({"source": source, "prompts": args.prompts, "schedules": schedules,
                                        "fits": {**(json.loads(path.read_text()).get("fits", {}) if path.exists() else {}),
                                                 **fits}}, indent=1) + "\n")
    for r in results:
        print(f"K={r['budget']}: mean training PSNR {r['value']:.2f} dB (uniform {r['start_value']:.2f}), "
              f"{r['evaluations']} schedules x {len(pairs)} prompts")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
