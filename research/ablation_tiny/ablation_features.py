"""Table 3 ablation: which latent features the scheduler state includes (offline IQL, ~3x speedup).

    python research/ablation_tiny/ablation_features.py --dataset morca/tiny/random-v0 --epochs 20 --prompts 50
    python research/ablation_tiny/ablation_features.py --dataset morca/tiny/quickstart-mixture-v0 --variants A0 A1 full --epochs 60 \
        --max-steps-per-epoch 80 --n-step 50 --suite 'tiny-train[11::132]' --prompts 40 --targets 2.5 3 --same-k

Trains offline IQL once per variant (A0: none ... all of P3, P2 mean, P2 variance)
with morca train and evaluates all variants together with
morca evaluate at the target speedups (on held-out prompts, or `--suite`), next to
the best fixed schedule and uniform spacing, paired against the first variant (A0,
no latent features, by default) and the best fixed schedule; `--same-k` compares them at the same K (quality
only, what the features buy the decisions), `--n-step` sets the value targets (1: the
paper's one-step TD; 50: the quickstart's Monte-Carlo returns). Resumable.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from morca_env.commands import resume_flag, run_step as run

from morca_env.cli import positive_int, speedup

VARIANTS = {"A0": "", "A1": "p3", "A2": "mean", "A3": "var", "A4": "p3,mean", "A5": "p3,var", "A6": "mean,var",
            "full": "p3,mean,var"}
BASELINES = ("best-fixed", "uniform")  # the rows a feature subset must beat, played on the same runs


def collected_in(dataset_id: str) -> str:
    """The env id a dataset records (its Minari env spec), so a MorcaScenes dataset is scored on MorcaScenes."""
    from morca_env.data.integrity import load_dataset

    spec = load_dataset(dataset_id).spec.env_spec
    if spec is None:
        raise SystemExit(f"{dataset_id} records no env; pass --env")
    return spec.id


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="morca/tiny/random-v0")
    p.add_argument("--env", default=None, help="the env the variants are scored on (default: the one the dataset "
                                               "was collected in)")
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--max-steps-per-epoch", type=int)
    p.add_argument("--prompts", type=int, default=200)
    p.add_argument("--suite", help="prompt suite to evaluate on (evaluate.py --suite; default: the held-out eval suite). "
                                   "Select features on a validation slice, e.g. 'tiny-train[11::132]'")
    p.add_argument("--targets", "--target", type=speedup, nargs="+", default=[3.0])
    p.add_argument("--out", type=Path, default=Path("runs/ablation_features"))
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--n-step", type=positive_int, default=1, help="value targets (train_offline.py --n-step)")
    p.add_argument("--seed", type=int, default=0, help="training seed of every variant (train_offline.py --seed)")
    p.add_argument("--same-k", action="store_true", help="evaluate every variant at the same K (evaluate.py --same-k)")
    args = p.parse_args(argv)
    out = args.out.resolve()
    env_id = args.env or collected_in(args.dataset)
    env = dict(os.environ)
    methods = []
    for name in args.variants:
        run_dir = out / name
        cap = ["--max-steps-per-epoch", str(args.max_steps_per_epoch)] if args.max_steps_per_epoch else []
        if not (run_dir / "final.safetensors").exists():
            run(f"train {name} ({VARIANTS[name] or 'no latent features'})",
                ["train", "--recipe", "paper", "--dataset", args.dataset, "--epochs", str(args.epochs),
                 "--features", VARIANTS[name], "--n-step", str(args.n_step), "--seed", str(args.seed), "--run-dir", str(run_dir), *cap,
                 *resume_flag(run_dir)], env)
        methods.append(f"morca-{name}={run_dir / 'final.safetensors'}")
    run("evaluate", ["evaluate", "--env", env_id, *(["--suite", args.suite] if args.suite else []),
                     "--prompts", str(args.prompts), "--targets", *map(str, args.targets),
                     "--out", str(out / "eval"), "--videos", "0", *(["--same-k"] if args.same_k else []),
                     "--methods", *methods, *BASELINES, "--baselines", methods[0].split("=")[0], BASELINES[0]], env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
