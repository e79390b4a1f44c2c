"""Evaluate cache schedulers against the no-cache reference: the paper's Table 2, Pareto and schedule plots, videos.

    morca evaluate --methods uniform seacache-global seacache-exact random \
        morca-offline=runs/offline/final.safetensors morca-online=runs/online/final.safetensors \
        reinforce=runs/reinforce/reinforce.safetensors
    morca evaluate ... --prompts 50 --targets 2 2.5 3 --out runs/eval        # resumable

Methods: `uniform` (uniform interval), `random` (random feasible), `behaviour`
(the datasets' random threshold-curve policy, held to K by the mask), `seacache-exact`
(SeaCache with the per-video threshold that spends exactly K), `seacache-global`
(one threshold per target, g(rho) from `morca calibrate --thresholds`,
tuned on training prompts as the paper tunes it; its K varies per video),
`best-fixed` (the best fixed schedule per K, fitted on training prompts by
`morca fit-fixed`), `searched=<dir>` (the per-prompt oracle:
schedules found by `morca search`, same K as the others only
without --calibrate), any other name of `morca_env.schedulers.names()`,
`morca-*=<.safetensors>` (IQL or REINFORCE schedulers: the checkpoint names which), and `<label>='{"name": <scheduler>, <option>: ...}'`
(a scheduler with options under its own label, e.g. `acid-tea='{"name": "acid-exact", "rule": "teacache"}'`). Every episode appends a
line to `<out>/episodes.jsonl`; a rerun skips what is there (only for the same run: `run.json` records the env, suite and every
method with its checkpoints' sha256, and a changed one is refused; `--overwrite` starts afresh). Writes
`table.md`, `table.csv`, `pareto.png`, `schedules.png` and side-by-side videos.
A method that spends its own K (a native or global rule) gets each exact-budget `--baselines` method
replayed at every one of its episodes' K (`<baseline>@<method>` rows; `--no-matched` skips them), so
`table.md`'s same-K table compares schedules, not budgets; its equal-speedup table compares every
method at the same measured speedup (`morca_env.evaluation.comparison`).
Speedup = mean stock no-cache latency / mean episode latency over the prompts, each
stock generation timed in the same run just before that prompt's episodes
(`--timing-repeats R`: every timing is the fastest of R back-to-back runs;
`--feedback`: `SpeedupGovernor`s correct the requested speedup by what was realised
so far: one per target shared by the exact-K methods, whose only unknown is the
machine's pace, so equal schedulers of equal cost run the same K; one per method
and target for a rule that spends its own K).
`--calibrate ROUNDS` first measures the speedup -> K calibration on this machine
(wall-clock ratios drift with its load; the quickstart does this). Latency includes
the scheduler's own per-step inference time, and the K of every method held to an
exact K counts that time (`scheduler_cost_s`, measured once per method as the fastest
of R timed episodes: a static table lookup ~15 us a step on MorcaTiny, a learned
scheduler that calls its network more); the per-video
threshold search of `seacache-exact` (its replays) is not counted: it is an
oracle-style baseline for quality at equal K, not a deployable method.
`--ray` runs the episodes on `--workers` Ray actors (see morca collect --help), grouped by
(target, prompt) so that each group's stock run is timed on the machine that runs its
episodes; open loop only (not with --feedback).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from morca_env.cli import (env_id, json_dict, nonnegative_int, output_directory, positive_int, show_library_messages,
                           speedup, thread_count, worker_count)
from morca_env.evaluation.runner import DEFAULT_BASELINES, DEFAULT_METHODS, EvaluationConfig, run_evaluation
from morca_env.parallel.executors import add_ray_arguments, executor_from_args
from morca_env.utils.threads import configure_threads


def main(argv=None) -> int:
    show_library_messages()
    p = argparse.ArgumentParser(prog="morca evaluate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", type=env_id, default="MorcaTiny-v0")
    p.add_argument("--env-kwargs", type=json_dict, default={})
    p.add_argument("--suite", help="prompt suite (default: the env's held-out eval suite)")
    p.add_argument("--prompts", type=positive_int, default=200)
    p.add_argument("--skip-prompts", type=nonnegative_int, default=0,
                   help="start after the suite's first N prompts (e.g. keep prompts used to pick settings out of a report)")
    p.add_argument("--targets", type=speedup, nargs="+", help="speedups (default: the model's eval targets)")
    p.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS))
    p.add_argument("--out", type=output_directory, default=Path("runs/eval"))
    p.add_argument("--videos", type=nonnegative_int, default=3, help="prompts to render side by side (at the middle target)")
    p.add_argument("--lpips", action="store_true", help="compute LPIPS (needs AlexNet weights in $TORCH_HOME)")
    p.add_argument("--threads", type=thread_count, default=None, help="torch threads (default: chosen from the free cores, see morca_env.utils.threads)")
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
    p.add_argument("--baselines", nargs="+", default=list(DEFAULT_BASELINES),
                   help="methods the others are compared with in paired differences (95%% CIs over prompts)")
    p.add_argument("--no-matched", action="store_true",
                   help="skip the matched episodes (each exact-budget baseline replayed at every own-K episode's K, "
                        "for same-K differences of native and global rules; ~0.6 s each on MorcaTiny)")
    p.add_argument("--same-k", action="store_true",
                   help="learned schedulers run at the rules' K (their inference time still counts in their latency, "
                        "not in their K): the paper's Table 4 comparison at equal budget")
    p.add_argument("--workers", type=worker_count, default=2,
                   help="Ray actors with --ray (each its own envs; the local loop runs one episode at a time)")
    add_ray_arguments(p)
    p.add_argument("--overwrite", action="store_true",
                   help="discard the rows of an earlier run in --out (a rerun otherwise continues an identical run "
                        "and refuses a changed one, naming what changed)")
    args = p.parse_args(argv)
    if args.feedback and args.same_k:
        p.error("--feedback and --same-k exclude each other: per-method feedback would give each method its own K")
    if args.ray and args.feedback:
        p.error("--feedback needs the episodes in order on one machine (each governor learns from the previous "
                "episodes' speedups); drop --feedback to run on Ray")
    executor = executor_from_args(p, args)
    try:
        config = EvaluationConfig(
            env_id=args.env, env_kwargs=args.env_kwargs, methods=tuple(args.methods),
            targets=tuple(args.targets) if args.targets else None, suite=args.suite, prompts=args.prompts,
            skip_prompts=args.skip_prompts, out=args.out, videos=args.videos, lpips=args.lpips,
            calibrate=args.calibrate, timing_repeats=args.timing_repeats, feedback=args.feedback,
            baselines=tuple(args.baselines), matched=not args.no_matched, same_k=args.same_k, workers=args.workers)
        threads = configure_threads(args.threads, workers=args.workers if args.ray else 1)
        result = run_evaluation(config, executor, threads=threads, overwrite=args.overwrite)
    except (ValueError, RuntimeError, OSError) as error:
        raise SystemExit(f"morca evaluate: {error}") from None
    print("\n" + result.text)
    print(f"wrote {args.out}/table.md, table.csv, pareto.png, schedules.png and videos")
    return 0


if __name__ == "__main__":
    sys.exit(main())
