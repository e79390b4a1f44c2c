"""Table 4 ablation: the training paradigm at ~3x speedup, with comparable numbers of trajectories.

    python research/ablation_tiny/ablation_training.py --dataset morca/tiny/random-v0 --offline-epochs 20 \
        --rounds 4 --trajectories 50 --prompts 50
    python research/ablation_tiny/ablation_training.py --episodes 200 ...   # D = the dataset's first 200 episodes
    python research/ablation_tiny/ablation_training.py --features "" --n-step 50 ...   # the variant that learns on a CPU

Compares, on held-out prompts:
  * offline IQL            (the dataset's D trajectories)
  * offline-to-online IQL  (D offline + R x T online trajectories)
  * online IQL from scratch (R' x T trajectories, R' chosen so R' x T ~= D + R x T)
  * REINFORCE              (~D + R x T on-policy trajectories)
against the random feasible and behaviour policies at the same exact K, and SeaCache (global threshold).
Each stage is one of the training scripts, resumable; evaluation by morca evaluate.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from morca_env.commands import resume_flag, run_step as run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="morca/tiny/random-v0")
    p.add_argument("--episodes", type=int, help="use the dataset's first N episodes as D (default: all)")
    p.add_argument("--offline-epochs", type=int, default=200)
    p.add_argument("--max-steps-per-epoch", type=int)
    p.add_argument("--rounds", type=int, default=16)
    p.add_argument("--trajectories", type=int, default=100)
    p.add_argument("--warmup-epochs", type=int, default=5)
    p.add_argument("--joint-epochs", type=int, default=20)
    p.add_argument("--features", default="p3,mean,var", help="latent features of every IQL network")
    p.add_argument("--n-step", type=int, default=1, help="IQL return horizon (1: the paper; 50: Monte-Carlo)")
    p.add_argument("--prompts", type=int, default=200)
    p.add_argument("--skip-prompts", type=int, default=0, help="evaluate after the eval suite's first N prompts")
    p.add_argument("--targets", type=float, nargs="+", default=[3.0])
    p.add_argument("--out", type=Path, default=Path("runs/ablation_training"))
    args = p.parse_args(argv)
    import minari

    out = args.out.resolve()
    env = dict(os.environ)
    offline_size = args.episodes or minari.load_dataset(args.dataset).total_episodes
    subset = ["--episodes", str(offline_size)]
    total = offline_size + args.rounds * args.trajectories
    cap = ["--max-steps-per-epoch", str(args.max_steps_per_epoch)] if args.max_steps_per_epoch else []
    online_common = ["--trajectories", str(args.trajectories), "--warmup-epochs", str(args.warmup_epochs),
                     "--joint-epochs", str(args.joint_epochs), "--n-step", str(args.n_step), *cap]
    offline = out / "offline"
    if not (offline / "final.safetensors").exists():
        run("offline IQL", ["train", "--recipe", "paper", "--dataset", args.dataset, "--epochs", str(args.offline_epochs),
                            *subset, "--features", args.features, "--n-step", str(args.n_step),
                            "--run-dir", str(offline), *cap, *resume_flag(offline)], env)
    o2o = out / "offline_to_online"
    if not (o2o / "final.safetensors").exists():
        run("offline-to-online IQL", ["finetune", "--offline", str(offline / "final.safetensors"),
                                      "--dataset", args.dataset, *subset, "--rounds", str(args.rounds), *online_common,
                                      "--run-dir", str(o2o), *resume_flag(o2o)], env)
    scratch = out / "online_scratch"
    scratch_rounds = max(1, round(total / args.trajectories))
    if not (scratch / "final.safetensors").exists():
        run("online IQL from scratch", ["finetune", "--from-scratch", "--features", args.features,
                                        "--rounds", str(scratch_rounds), *online_common, "--run-dir", str(scratch),
                                        *resume_flag(scratch)], env)
    reinforce = out / "reinforce"
    if not (reinforce / "history.json").exists():
        run("REINFORCE", ["reinforce", "--episodes", str(total), "--features", args.features,
                          "--run-dir", str(reinforce),
                          *(["--resume"] if (reinforce / "reinforce.safetensors").exists() else [])], env)
    (out / "budgets.json").write_text(json.dumps({"offline": offline_size, "offline_to_online": total,
                                                  "online_scratch": scratch_rounds * args.trajectories,
                                                  "reinforce": total}, indent=1))
    run("evaluate", ["evaluate", "--prompts", str(args.prompts), "--skip-prompts", str(args.skip_prompts),
                     "--same-k", "--targets", *map(str, args.targets),
                     "--out", str(out / "eval"), "--videos", "0", "--methods", "random", "behaviour", "seacache-global",
                     f"reinforce={reinforce / 'reinforce.safetensors'}", f"morca-scratch={scratch / 'final.safetensors'}",
                     f"morca-offline={offline / 'final.safetensors'}", f"morca-online={o2o / 'final.safetensors'}"], env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
