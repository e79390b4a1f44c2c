"""REINFORCE baseline for the training-paradigm ablation (MORCA Table 4).

    morca reinforce --episodes 1600 --run-dir runs/reinforce
    morca reinforce ... --resume

Same policy network as MORCA, masked, on-policy; checkpoints after every update
(`<run-dir>/reinforce.pt`); load with `agents.reinforce.ReinforcePolicy.load(path)`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import gymnasium as gym

import morca_env  # noqa: F401
from morca_env.cli import json_dict, positive_int, show_library_messages
from morca_env.threads import configure_threads
from agents.reinforce import Reinforce, ReinforceConfig


def main(argv=None) -> int:
    show_library_messages()
    p = argparse.ArgumentParser(prog="morca reinforce", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="MorcaTiny-v0")
    p.add_argument("--env-kwargs", type=json_dict, default={})
    p.add_argument("--prompts", help="training prompt suite (default for MorcaTiny-v0: tiny-train:250, the "
                                     "dataset's prompts, whose references are cached)")
    p.add_argument("--episodes", type=positive_int, default=1600)
    p.add_argument("--episodes-per-update", type=positive_int, default=8)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--features", default="p3,mean,var")
    p.add_argument("--speedup-range", type=float, nargs=2,
                   help="per-episode target speedups (default: the model's data range, 1.5-3.5 for MorcaTiny)")
    p.add_argument("--run-dir", type=Path, default=Path("runs/reinforce"))
    p.add_argument("--resume", action="store_true")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch threads (default: chosen from the free cores, see morca_env.threads)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    configure_threads(args.threads)
    if (args.run_dir / "reinforce.pt").exists() and not args.resume:
        raise SystemExit(f"{args.run_dir} already holds a run; pass --resume or use another --run-dir")
    env_kwargs = dict(args.env_kwargs)
    prompts = args.prompts or ("tiny-train:250" if args.env == "MorcaTiny-v0" else None)
    if prompts:
        env_kwargs["prompts"] = prompts
    env = gym.make(args.env, lpips=False, **env_kwargs)
    config = ReinforceConfig(learning_rate=args.lr, episodes_per_update=args.episodes_per_update,
                             total_episodes=args.episodes, features=args.features,
                             speedup_range=tuple(args.speedup_range or env.unwrapped.preset.speedup_range), seed=args.seed)
    trainer = Reinforce(env, config, args.run_dir)
    history = trainer.train()
    print(f"saved {trainer.checkpoint_path}; last rollout PSNR {history[-1]['rollout_psnr']:.2f} dB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
