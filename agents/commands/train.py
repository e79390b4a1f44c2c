"""Offline discrete IQL on a MORCA Minari dataset (paper Sec. 3.3; defaults from Table 6).

    morca train --dataset morca/tiny/anchored-v2                        # the default recipe (agents.anchored)
    morca train --recipe paper --dataset morca/tiny/random-v0           # the paper's
    morca train --dataset morca/tiny/random-v0 --epochs 20 --max-steps-per-epoch 100
    morca train ... --resume            # continue after the last finished epoch

Writes `<run-dir>/checkpoints/NNNN.safetensors` every epoch (with `latest.json`),
TensorBoard logs in `<run-dir>/tb`, and `<run-dir>/final.safetensors`. Load with
`agents.checkpoint.load_learnable(path)` (verifies the file's sha256 sidecar), or
`agents.MorcaPolicy.load(path)`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import agents  # noqa: F401  (first: registers our classes and quiets d3rlpy's import)
import d3rlpy

from agents.anchored import anchored_buffer
from agents.offline import OfflineConfig, OfflineTrainer
from agents.training import FINAL
from morca_env.cli import (add_run_arguments, check_run_arguments, positive_int, record_run_arguments,
                           refuse_to_overwrite, show_library_messages)
from morca_env.data import first_episodes, to_replay_buffer
from morca_env.data.integrity import load_dataset
from morca_env.schedulers.fixed import StaticSchedule
from morca_env.utils.threads import configure_threads


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="morca train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", choices=("anchored", "paper"), default="anchored",
                   help="anchored (default): IQL on the residual of the best fixed schedule, from grouped data such "
                        "as the dataset morca/tiny/anchored-v2 (agents.anchored); paper: the paper's state and "
                        "return, on any MORCA dataset")
    p.add_argument("--dataset", nargs="+", default=["morca/tiny/anchored-v2"],
                   help="Minari dataset id(s); several are trained on together (--episodes limits the first)")
    p.add_argument("--baseline", type=Path, default=None,
                   help="anchored: the fixed schedules file the data was collected around (default: the packaged "
                        "best fixed schedule of the dataset's model; morca fit-fixed writes such files)")
    p.add_argument("--epochs", type=positive_int, default=200)
    p.add_argument("--lr", type=float, default=1e-4, help="learning rate of all networks")
    p.add_argument("--batch-size", type=positive_int, default=256)
    p.add_argument("--beta", type=float, default=1.5, help="advantage-weighting coefficient")
    p.add_argument("--w-max", type=float, default=30.0, help="policy weight cap")
    p.add_argument("--expectile", type=float, default=0.7)
    p.add_argument("--n-step", type=positive_int, default=1,
                   help="return horizon of the Q targets: 1 = one-step TD (the paper); 50 = Monte-Carlo returns, "
                        "which converge in far fewer updates (CPU budgets)")
    p.add_argument("--episodes", type=positive_int, help="train on the dataset's first N episodes (default: all)")
    p.add_argument("--features", default="p3,mean,var", help="latent features in the state (Table 3 ablation)")
    p.add_argument("--shared-critic-encoder", action="store_true",
                   help="the twin Q networks and V read one encoder (about half the update cost on a CPU; the "
                        "paper trains four separate networks)")
    p.add_argument("--max-steps-per-epoch", type=positive_int, help="cap the updates per epoch (default: a full pass)")
    add_run_arguments(p, "runs/offline", resume="continue after the last finished epoch")
    return p.parse_args(argv)


def main(argv=None) -> int:
    show_library_messages()
    args = parse_args(argv)
    configure_threads(args.threads)
    check_run_arguments(args.run_dir, args)  # a resume with other data or hyperparameters is refused first
    for marker in ("latest.json", FINAL):  # a new run never replaces a finished or checkpointed one silently
        refuse_to_overwrite(args.run_dir, marker, args.resume)
    d3rlpy.seed(args.seed)
    datasets = [load_dataset(name) for name in args.dataset]
    indices = first_episodes(datasets[0], args.episodes)
    buffer = to_replay_buffer(datasets, "tuple", episode_indices=indices, n_step=args.n_step)
    anchor = None
    if args.recipe == "anchored":
        try:
            baseline = None if args.baseline is None else StaticSchedule.from_file(args.baseline)
            buffer, anchor = anchored_buffer(datasets, buffer, indices, args.n_step, baseline)
        except (ValueError, OSError) as error:
            raise SystemExit(f"--recipe anchored: {error}") from None
    config = OfflineConfig(epochs=args.epochs, learning_rate=args.lr, batch_size=args.batch_size, beta=args.beta,
                           max_weight=args.w_max, expectile=args.expectile, features=args.features,
                           max_steps_per_epoch=args.max_steps_per_epoch,
                           shared_critic_encoder=args.shared_critic_encoder, device=args.device)
    trainer = OfflineTrainer(buffer, config, args.run_dir, anchor=anchor)
    record_run_arguments(args.run_dir, args)  # once the data loaded: a failing call keeps the old record
    if args.resume:
        trainer.resume()
    print(f"{' + '.join(args.dataset)}: {buffer.size()} of {sum(d.total_episodes for d in datasets)} episodes")
    trainer.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
