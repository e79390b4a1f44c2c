"""Run-level headroom: how much one run gains from a schedule searched for it alone, and whether that gain follows
the prompt (it would survive another seed) or the noise sample (it would not).

For 2 training prompts per content class (none that fits or validates a class schedule), at each K: a hill climb
from the global best fixed schedule on that one (prompt, seed), then the searched schedule and the global one
played on the same prompt under a fresh seed.

    python research/one_or_many/run_headroom.py --env MorcaScenes-v0 --budgets 27 32 36 --workers 2

Resumable: every episode is logged under `--out`.
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
from morca_env.schedulers.fixed import StaticSchedule
from morca_env.evaluation.search import SearchConfig, SearchTask, schedule_key, search_many
from morca_env.parallel.workers import map_on_envs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from class_headroom import ENV_KWARGS, TESTBEDS, _evaluate, content_class, mean_ci, psnr_table, slug  # noqa: E402


def run_pairs(env_id: str, per_class: int, skip: int) -> dict:
    """{class: [(prompt, seed, other seed)]}: training prompts past the first `skip` of each class (those fit and
    validate class schedules), each with its suite seed and a fresh one."""
    fresh = np.random.default_rng(7_2026)
    seen: dict[str, int] = {}
    out: dict[str, list] = {}
    for prompt, seed in get_suite(f"{TESTBEDS[env_id][1]}[::1]").pairs():
        c = content_class(env_id, prompt)
        seen[c] = seen.get(c, 0) + 1
        if seen[c] > skip and len(out.setdefault(c, [])) < per_class:
            out[c].append((prompt, int(seed), int(fresh.integers(0, 2**31 - 1))))
    return dict(sorted(out.items()))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", choices=sorted(TESTBEDS), default="MorcaScenes-v0")
    p.add_argument("--budgets", type=int, nargs="+", required=True)
    p.add_argument("--per-class", type=int, default=2)
    p.add_argument("--evaluations", type=int, default=40, help="schedules per run's search")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=None, help="default runs/one_or_many/<model>")
    args = p.parse_args(argv)
    args.out = (args.out or Path("runs/one_or_many") / TESTBEDS[args.env][0]) / "run_level"
    pairs = run_pairs(args.env, args.per_class, skip=20)  # class_headroom takes 12 + 8 of each class
    env = gym.make(args.env, **ENV_KWARGS)
    spec = env.unwrapped.budget_spec
    fixed = StaticSchedule.packaged(TESTBEDS[args.env][0])
    env.close()
    results = {"env": args.env, "evaluations": args.evaluations, "budgets": {}}
    for k in args.budgets:
        start = tuple(int(a) for a in fixed.plan(spec, k))
        tasks = [SearchTask(f"K{k:03d}_{slug(c)}_{i}", ((prompt, seed),), k, start)
                 for c, group in pairs.items() for i, (prompt, seed, _) in enumerate(group)]
        searched = {r["name"]: r for r in search_many(tasks, args.env, ENV_KWARGS, args.out / "searches",
                                                      SearchConfig(evaluations=args.evaluations, seed=k),
                                                      workers=args.workers, threads=args.threads)}
        jobs = []
        for c, group in pairs.items():
            for i, (prompt, _, other) in enumerate(group):
                schedules = {"global": list(start), "searched": searched[f"K{k:03d}_{slug(c)}_{i}"]["schedule"]}
                jobs.append((str(args.out / f"other_seed_K{k:03d}.jsonl"), [(prompt, other)], schedules))
        for _ in map_on_envs(_evaluate, jobs, args.env, ENV_KWARGS, 1, args.threads):
            pass  # one worker: every job appends to the same log
        table = psnr_table(args.out / f"other_seed_K{k:03d}.jsonl")
        own, transfer = [], []
        for c, group in pairs.items():
            for i, (prompt, seed, other) in enumerate(group):
                r = searched[f"K{k:03d}_{slug(c)}_{i}"]
                own.append(r["value"] - r["start_value"])  # reward = PSNR below the cap
                transfer.append(table[(prompt, other, schedule_key(r["schedule"]))]
                                - table[(prompt, other, schedule_key(start))])
        results["budgets"][str(k)] = {"own_run": mean_ci(np.array(own)), "other_seed": mean_ci(np.array(transfer)),
                                      "runs": len(own)}
        print(f"K={k}: searched for the run +{np.mean(own):.3f} dB on it; on the same prompt, another seed "
              f"{np.mean(transfer):+.3f} dB ({len(own)} runs)")
    atomic_write_text(args.out / "run_headroom.json", json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
