"""Offline discrete IQL on a MORCA Minari dataset (paper Sec. 3.3; defaults from Table 6).

    morca train --dataset morca/tiny/random-v0
    morca train --dataset morca/tiny/random-v0 --epochs 20 --max-steps-per-epoch 100
    morca train ... --resume            # continue after the last finished epoch

Writes `<run-dir>/checkpoints/NNNN.d3` every epoch (with `latest.json`),
TensorBoard logs in `<run-dir>/tb`, and `<run-dir>/final.d3`. Load with
`agents.checkpoint.load_learnable(path)` (verifies the file's sha256 sidecar), or
`agents.MorcaPolicy.load(path)`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import agents  # noqa: F401  (first: registers our classes and quiets d3rlpy's import)
import d3rlpy
import minari
from torch.utils.tensorboard import SummaryWriter

from agents.checkpoint import load_learnable, save_learnable
from agents.iql import DiscreteIQLConfig
from agents.networks import MorcaEncoderFactory
from agents.training import CheckpointDir, batch_source, run_updates, steps_per_epoch
from morca_env.cli import positive_int, show_library_messages
from morca_env.data import first_episodes, to_replay_buffer
from morca_env.threads import configure_threads


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="morca train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", nargs="+", default=["morca/tiny/random-v0"],
                   help="Minari dataset id(s); several are trained on together (--episodes limits the first)")
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
    p.add_argument("--max-steps-per-epoch", type=positive_int, help="cap the updates per epoch (default: a full pass)")
    p.add_argument("--run-dir", type=Path, default=Path("runs/offline"))
    p.add_argument("--resume", action="store_true")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch threads (default: chosen from the free cores, see morca_env.threads)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv=None) -> int:
    show_library_messages()
    args = parse_args(argv)
    configure_threads(args.threads)
    stored = args.run_dir / "args.json"
    if args.resume and stored.exists():  # a run on other data would be "resumed" past its last epoch, silently
        before = json.loads(stored.read_text()).get("dataset")
        if before not in (str(args.dataset), args.dataset[0] if len(args.dataset) == 1 else None):
            raise SystemExit(f"--resume: {args.run_dir} holds a run on dataset {before}, not {args.dataset}; "
                             "use another --run-dir (or remove this one) to train on the new data")
    d3rlpy.seed(args.seed)
    datasets = [minari.load_dataset(name) for name in args.dataset]
    dataset = datasets[0]
    buffer = to_replay_buffer(datasets, "tuple", episode_indices=first_episodes(dataset, args.episodes),
                              n_step=args.n_step)
    encoder = MorcaEncoderFactory(features=args.features)
    algo = DiscreteIQLConfig(actor_learning_rate=args.lr, critic_learning_rate=args.lr, batch_size=args.batch_size,
                             weight_temp=args.beta, max_weight=args.w_max, expectile=args.expectile,
                             actor_encoder_factory=encoder, critic_encoder_factory=encoder,
                             value_encoder_factory=encoder).create(device=args.device)
    algo.build_with_dataset(buffer)
    checkpoints = CheckpointDir(args.run_dir)
    start = 0
    if args.resume and (found := checkpoints.latest()) is not None:
        path, state = found
        algo = load_learnable(path, device=args.device)
        start = state["index"] + 1
        print(f"resumed from {path} (epoch {start})")
    (args.run_dir / "args.json").write_text(json.dumps({k: str(v) for k, v in vars(args).items()}, indent=1))
    epoch_steps = steps_per_epoch(buffer, args.batch_size, args.max_steps_per_epoch)
    print(f"{' + '.join(args.dataset)}: {buffer.size()} of {sum(d.total_episodes for d in datasets)} episodes, {buffer.transition_count} transitions; "
          f"{epoch_steps} updates per epoch, epochs {start + 1}..{args.epochs}")
    writer = SummaryWriter(str(args.run_dir / "tb"))
    batches = batch_source(buffer, algo)
    for epoch in range(start, args.epochs):
        t0 = time.perf_counter()
        metrics = run_updates(algo, batches, epoch_steps, writer, "offline", f"epoch {epoch + 1}/{args.epochs}")
        seconds = time.perf_counter() - t0
        checkpoints.save(algo, epoch, {"metrics": metrics})
        print(f"epoch {epoch + 1}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()) +
              f" | {epoch_steps * args.batch_size / seconds:.0f} transitions/s, {epoch_steps / seconds:.2f} updates/s")
    writer.close()
    final = args.run_dir / "final.d3"
    save_learnable(algo, final)
    print(f"saved {final}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
