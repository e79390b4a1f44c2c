"""Per-prompt schedule search: the best exact-K schedule found for each (prompt, seed) at each target speedup.

    morca search --prompts tiny-eval --count 10 --targets 2 2.5 3 --out runs/search/eval
    morca search --prompts tiny-train --count 40 --targets 2 2.5 3 --out runs/search/train

A lower bound on what an adaptive scheduler could reach (the oracle rows of
the MorcaTiny scheduler results). K for a target is the one every method gets at
that target for that seed (`MorcaEnv.budget_for_speedup`). Every evaluated
schedule is kept with its PSNR (`<out>/<prompt>_<seed>_K<k>.jsonl`, a search's
result in the `.json` next to it); rerunning resumes. Play the found schedules
with the `searched` scheduler (`morca evaluate --methods searched=<out>`).
`--ray` runs the searches on Ray actors (see morca collect --help), `--workers` of them.
"""

from __future__ import annotations

import argparse
import hashlib
import sys

import gymnasium as gym

import morca_env  # noqa: F401
from morca_env.models.presets import preset_for_env
from morca_env.prompts import get_suite
from morca_env.evaluation.search import SearchConfig, SearchTask, search_many
from morca_env.cli import (env_id, json_dict, nonnegative_int, output_directory, positive_int, show_library_messages,
                           speedup, thread_count, worker_count)
from morca_env.parallel.executors import add_ray_arguments, executor_from_args


def task_name(prompt: str, seed: int, budget: int) -> str:
    digest = hashlib.sha256(f"{prompt}|{seed}".encode()).hexdigest()[:10]
    return f"{digest}_K{budget:03d}"


def main(argv=None) -> int:
    show_library_messages()
    p = argparse.ArgumentParser(prog="morca search", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", type=env_id, default="MorcaTiny-v0")
    p.add_argument("--env-kwargs", type=json_dict, default={}, help="JSON dict of env arguments (e.g. num_inference_steps)")
    p.add_argument("--prompts", help="prompt suite (evaluation suites have fixed seeds; default: the model's "
                                     "evaluation suite, e.g. tiny-eval)")
    p.add_argument("--skip", type=nonnegative_int, default=0, help="start at this prompt of the suite")
    p.add_argument("--count", type=positive_int, default=10, help="number of prompts")
    p.add_argument("--targets", type=speedup, nargs="+", default=[2.0, 2.5, 3.0])
    p.add_argument("--evaluations", type=positive_int, default=100, help="schedules evaluated per search")
    p.add_argument("--seed", type=int, default=0, help="search RNG seed")
    p.add_argument("--workers", type=worker_count, default=1)
    p.add_argument("--threads", type=thread_count, default=1)
    p.add_argument("--out", type=output_directory, required=True)
    add_ray_arguments(p)
    args = p.parse_args(argv)
    executor = executor_from_args(p, args)
    suite = get_suite(args.prompts or preset_for_env(args.env).eval_suite)
    if args.count < 1 or not 0 <= args.skip < len(suite):
        p.error(f"--skip {args.skip} / --count {args.count}: the suite has {len(suite)} prompts (skip in "
                f"[0, {len(suite) - 1}], count >= 1)")
    pairs = suite.pairs()[args.skip: args.skip + args.count]
    env_kwargs = args.env_kwargs
    env = gym.make(args.env, **{"lpips": False, "latent_features": False, **env_kwargs}).unwrapped
    tasks = [SearchTask(task_name(prompt, seed, k), ((prompt, seed),), k)
             for target in args.targets for prompt, seed in pairs
             for k in [env.budget_for_speedup(target, seed)]]
    tasks = list({t.name: t for t in tasks}.values())  # two targets can round to one K
    results = search_many(tasks, args.env, env_kwargs, args.out, SearchConfig(evaluations=args.evaluations, seed=args.seed),
                          workers=args.workers, threads=args.threads, executor=executor)
    gains = [r["value"] - r["start_value"] for r in results]
    print(f"{len(results)} searches: mean PSNR gain over uniform spacing {sum(gains) / len(gains):+.2f} dB "
          f"(min {min(gains):+.2f}, max {max(gains):+.2f}); results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
