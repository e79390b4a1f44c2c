"""Online fine-tuning of an offline IQL scheduler (MORCA Algorithm 1(b); defaults from Table 6).

    morca finetune --offline runs/offline/final.safetensors --dataset morca/tiny/random-v0
    morca finetune --from-scratch --run-dir runs/online_scratch      # Table 4 ablation
    morca finetune ... --rounds 4 --trajectories 20 --max-steps-per-epoch 50   # CPU-sized
    morca finetune ... --resume

An offline checkpoint of the anchored recipe (`morca train`'s default, agents.anchored) is fine-tuned anchored:
rollouts come in groups of four sharing a prompt, seed and K, the first playing the best fixed schedule.

Per round: sample `--trajectories` episodes from the current stochastic masked
policy at random tiny-train prompts and target speedups, add them to the replay
buffer (which keeps the offline dataset), `--warmup-epochs` of critic-only
updates, then `--joint-epochs` of joint updates. Checkpoints every round.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import agents  # noqa: F401  (first: registers our classes and quiets d3rlpy's import)
import d3rlpy

import morca_env  # noqa: F401
from agents.anchored import anchor_of, anchored_buffer, baseline_of
from agents.checkpoint import CheckpointError, load_learnable
from agents.online import OnlineConfig, OnlineTrainer
from agents.training import FINAL
from morca_env.cli import (add_run_arguments, add_training_env_arguments, positive_int, record_run_arguments,
                           refuse_to_overwrite,
                           show_library_messages, make_training_env)
from morca_env.data import first_episodes, to_replay_buffer
from morca_env.data.integrity import load_dataset
from morca_env.utils.threads import configure_threads
from morca_env.vector import single_env


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="morca finetune", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--offline", type=Path, help="offline IQL checkpoint (.safetensors)")
    p.add_argument("--dataset", help="Minari dataset kept in the replay buffer (the offline data)")
    p.add_argument("--n-step", type=positive_int, default=1,
                   help="return horizon of the Q targets: 1 = one-step TD (the paper); 50 = Monte-Carlo returns, "
                        "which converge in far fewer updates (CPU budgets)")
    p.add_argument("--episodes", type=positive_int, help="keep only the dataset's first N episodes (default: all)")
    p.add_argument("--from-scratch", action="store_true", help="online IQL without offline weights or data")
    p.add_argument("--features", default="p3,mean,var",
                   help="latent features of the networks with --from-scratch (an offline checkpoint keeps its own)")
    add_training_env_arguments(p)
    p.add_argument("--rounds", type=positive_int, default=16)
    p.add_argument("--trajectories", type=positive_int, default=100, help="new trajectories per round")
    p.add_argument("--warmup-epochs", type=positive_int, default=5)
    p.add_argument("--joint-epochs", type=positive_int, default=20)
    p.add_argument("--actor-lr", type=float, default=4e-5)
    p.add_argument("--critic-lr", type=float, default=1e-4)
    p.add_argument("--beta", type=float, default=1.0)
    p.add_argument("--w-max", type=float, default=20.0)
    p.add_argument("--batch-size", type=positive_int, default=256)
    p.add_argument("--speedup-range", type=float, nargs=2,
                   help="per-episode target speedups (default: the model's data range, 1.5-3.5 for MorcaTiny)")
    p.add_argument("--max-steps-per-epoch", type=positive_int)
    add_run_arguments(p, "runs/online", resume="continue after the last finished round")
    return p.parse_args(argv)


def main(argv=None) -> int:
    show_library_messages()
    args = parse_args(argv)
    if not args.from_scratch and args.offline is None:
        raise SystemExit("pass --offline <checkpoint.safetensors> (and --dataset), or --from-scratch")
    configure_threads(args.threads)
    d3rlpy.seed(args.seed)
    refuse_to_overwrite(args.run_dir, "latest.json", args.resume)
    env = make_training_env(args)
    try:
        offline = None if args.from_scratch else load_learnable(args.offline, device=args.device)
    except (CheckpointError, OSError) as error:
        raise SystemExit(f"--offline: {error}") from None
    # an anchored offline checkpoint (agents.anchored) is fine-tuned anchored: its baseline, state and returns
    anchor = None if args.from_scratch else anchor_of(args.offline)
    buffer = None
    if args.dataset and not args.from_scratch:
        dataset = load_dataset(args.dataset)
        indices = first_episodes(dataset, args.episodes)
        buffer = to_replay_buffer(dataset, "tuple", episode_indices=indices)
        if anchor is not None:
            try:
                buffer, _ = anchored_buffer([dataset], buffer, indices, baseline=baseline_of(anchor["baseline"]))
            except ValueError as error:
                raise SystemExit(f"--dataset: {error}") from None
    config = OnlineConfig(rounds=args.rounds, trajectories_per_round=args.trajectories,
                          warmup_epochs=args.warmup_epochs, joint_epochs=args.joint_epochs,
                          actor_learning_rate=args.actor_lr, critic_learning_rate=args.critic_lr,
                          weight_temp=args.beta, max_weight=args.w_max, batch_size=args.batch_size,
                          speedup_range=tuple(args.speedup_range or single_env(env).preset.speedup_range),
                          max_steps_per_epoch=args.max_steps_per_epoch, n_step=args.n_step, features=args.features,
                          seed=args.seed)
    record_run_arguments(args.run_dir, args)
    trainer = OnlineTrainer(env, config, args.run_dir, offline_algo=offline, offline_buffer=buffer,
                            device=args.device, anchor=anchor)
    history = trainer.run()
    print(f"saved {args.run_dir / FINAL}; rollout PSNR by round: "
          + ", ".join(f"{h['rollout_psnr']:.2f}" for h in history))
    return 0


if __name__ == "__main__":
    sys.exit(main())
