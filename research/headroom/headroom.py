"""The adaptive-headroom measurement on MorcaTiny (docs/results/scheduler_tiny.md), step by step.

    python research/headroom/headroom.py --morca morca-offline=runs/quickstart/offline/final.safetensors \\
                               --morca morca-online=runs/quickstart/online/final.safetensors

1. morca fit-fixed  the best fixed schedule per K on 12 tiny-train prompts (skipped when
                                  --fixed names a fitted file; the packaged one by default)
2. morca search    the per-prompt oracle on the first --oracle-prompts held-out prompts
3. morca evaluate --same-k   every method at the same K on --prompts held-out tiny-eval prompts
4. morca evaluate            the oracle subset: searched, best-fixed and uniform on the same prompts
5. morca evaluate --feedback equal measured speedup (calibrated next to the episodes; no oracle)

Held-out prompts are the first --prompts of tiny-eval: no fit, search or training step reads them
(the oracle searches them, by definition). Everything goes under --out and resumes.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from morca_env.commands import run_step as run
from morca_env.cli import positive_int, speedup

RULES = ["random", "uniform", "seacache-global", "seacache-exact"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("runs/headroom"))
    p.add_argument("--prompts", type=positive_int, default=60)
    p.add_argument("--oracle-prompts", type=positive_int, default=10)
    p.add_argument("--oracle-evaluations", type=positive_int, default=80)
    p.add_argument("--targets", type=speedup, nargs="+", default=[2.0, 2.5, 3.0])
    p.add_argument("--fixed", default=None, help="a fitted StaticSchedule file (default: the installed one)")
    p.add_argument("--morca", action="append", default=[], metavar="LABEL=CHECKPOINT",
                   help="learned schedulers to compare (repeatable)")
    p.add_argument("--workers", type=positive_int, default=2)
    p.add_argument("--latent-features", action="store_true",
                   help="run the env with latent features (schedulers whose networks read them); default: the "
                        "lean env, for rules and scalar-state schedulers")
    p.add_argument("--skip-speedup", action="store_true", help="skip step 5 (equal measured speedup)")
    args = p.parse_args(argv)
    out = args.out.resolve()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    targets = [str(t) for t in args.targets]
    fixed = [f"best-fixed={args.fixed}"] if args.fixed else ["best-fixed"]
    run("oracle search", ["search", "--prompts", "tiny-eval", "--count", str(args.oracle_prompts),
                          "--targets", *targets, "--evaluations", str(args.oracle_evaluations),
                          "--workers", str(args.workers), "--out", str(out / "oracle")], env)
    lean = [] if args.latent_features else ["--env-kwargs", '{"latent_features": false}']
    run("same K, held-out prompts", ["evaluate", "--prompts", str(args.prompts), "--targets", *targets,
                                     "--same-k", "--videos", "0", "--out", str(out / "same_k"), *lean,
                                     "--baselines", "best-fixed", "uniform", "seacache-exact", "seacache-global",
                                     "--methods", *RULES, *fixed, *args.morca], env)
    run("same K, oracle subset", ["evaluate", "--prompts", str(args.oracle_prompts), "--targets", *targets,
                                  "--same-k", "--videos", "1", "--out", str(out / "oracle_eval"), *lean,
                                  "--baselines", "best-fixed", "uniform",
                                  "--methods", "uniform", *fixed, *args.morca, f"searched={out / 'oracle'}"], env)
    if not args.skip_speedup:
        run("equal measured speedup", ["evaluate", "--prompts", str(args.prompts), "--targets", *targets,
                                       "--feedback", "--calibrate", "6", "--timing-repeats", "2", "--videos", "0",
                                       "--out", str(out / "speedup"), *lean,
                                       "--baselines", "best-fixed", "seacache-global",
                                       "--methods", "uniform", "seacache-global", *fixed, *args.morca], env)
    print(f"\ntables: {out}/same_k/table.md, {out}/oracle_eval/table.md, {out}/speedup/table.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
