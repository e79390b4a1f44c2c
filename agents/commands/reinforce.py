"""REINFORCE baseline for the training-paradigm ablation (MORCA Table 4).

    morca reinforce --episodes 1600 --run-dir runs/reinforce
    morca reinforce ... --resume

Same policy network as MORCA, masked, on-policy; checkpoints after every update
(`<run-dir>/reinforce.safetensors`); load with `agents.reinforce.ReinforcePolicy.load(path)`.
"""

from __future__ import annotations

import argparse
import sys


import morca_env  # noqa: F401
from morca_env.cli import (add_run_arguments, add_training_env_arguments, positive_int, refuse_to_overwrite,
                           show_library_messages, make_training_env)
from morca_env.utils.threads import configure_threads
from morca_env.vector import single_env
from agents.reinforce import Reinforce, ReinforceConfig


def main(argv=None) -> int:
    show_library_messages()
    p = argparse.ArgumentParser(prog="morca reinforce", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_training_env_arguments(p)
    p.add_argument("--episodes", type=positive_int, default=1600)
    p.add_argument("--episodes-per-update", type=positive_int, default=8)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--features", default="p3,mean,var")
    p.add_argument("--speedup-range", type=float, nargs=2,
                   help="per-episode target speedups (default: the model's data range, 1.5-3.5 for MorcaTiny)")
    add_run_arguments(p, "runs/reinforce", device=False)
    args = p.parse_args(argv)
    if args.speedup_range is not None:
        low, high = args.speedup_range
        if not (1.0 <= low <= high < float("inf")):
            p.error(f"--speedup-range {low:g} {high:g}: give LOW HIGH with 1 <= LOW <= HIGH (e.g. 1.5 3.5)")
    configure_threads(args.threads)
    refuse_to_overwrite(args.run_dir, "reinforce.safetensors", args.resume)
    env = make_training_env(args)
    config = ReinforceConfig(learning_rate=args.lr, episodes_per_update=args.episodes_per_update,
                             total_episodes=args.episodes, features=args.features,
                             speedup_range=tuple(args.speedup_range or single_env(env).preset.speedup_range), seed=args.seed)
    trainer = Reinforce(env, config, args.run_dir)
    history = trainer.train()
    print(f"saved {trainer.checkpoint_path}; last rollout PSNR {history[-1]['rollout_psnr']:.2f} dB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
