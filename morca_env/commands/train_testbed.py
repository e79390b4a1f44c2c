"""Train a CPU testbed's model (MorcaTiny or MorcaScenes) from scratch: the packaged weights' remake command.

    morca train-testbed --model scenes                 # the shipped MorcaScenes weights (CPU: see the model card)
    morca train-testbed --model tiny                   # the shipped MorcaTiny weights (~25 min on 2 CPU cores)
    morca train-testbed --model scenes --steps 50 --out /tmp/scenes --run-dir /tmp/run   # a smoke run
    morca train-testbed --model scenes --resume        # continue an interrupted run (Ctrl-C saves first)

The same command trains on a GPU with --device cuda. See morca_env.models.training.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from morca_env.cli import output_directory, positive_int, thread_count, torch_device

# each model's settings as shipped (the flags override them)
MODELS = {
    "tiny": dict(steps=4000),
    "scenes": dict(steps=8000),
}


def world_of(name: str):
    """(the model, its grammar module) for a testbed name."""
    if name == "tiny":
        from morca_env.models import tiny, tiny_data

        return tiny.MODEL, tiny_data
    from morca_env.models import scenes, scenes_data

    return scenes.MODEL, scenes_data


def parse_args(argv=None, default_model: str | None = None):
    p = argparse.ArgumentParser(prog="morca train-testbed", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(MODELS), default=default_model, required=default_model is None)
    p.add_argument("--steps", type=positive_int, default=None, help="default: the shipped model's")
    p.add_argument("--batch-size", type=positive_int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--shift", type=float, default=3.0)
    p.add_argument("--high-noise-fraction", type=float, default=0.0,
                   help="share of each batch with sigma drawn from U(--high-noise-min, 1): the sampler's first steps, "
                        "where the prompt alone must fix what x_t cannot yet show (e.g. the direction of motion)")
    p.add_argument("--high-noise-min", type=float, default=0.95)
    p.add_argument("--prompt-dropout", type=float, default=0.1)
    p.add_argument("--ema", type=float, default=0.999)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=thread_count, default=2)
    p.add_argument("--device", type=torch_device, default="cpu")
    p.add_argument("--init", type=Path, help="start from these weights (a weights directory) instead of scratch")
    p.add_argument("--run-dir", type=output_directory, default=None, help="checkpoint and loss log (default: runs/train_<model>)")
    p.add_argument("--out", type=output_directory, default=None, help="weights directory (default: the packaged weights)")
    p.add_argument("--checkpoint-every", type=positive_int, default=250)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (logs still go to the run dir)")
    args = p.parse_args(argv)
    if not 0.0 <= args.high_noise_fraction <= 1.0:
        p.error(f"--high-noise-fraction {args.high_noise_fraction} must be in [0, 1]")
    if not 0.0 <= args.high_noise_min < 1.0:
        p.error(f"--high-noise-min {args.high_noise_min} must be in [0, 1)")
    if args.device != "cpu" and not torch.cuda.is_available():
        p.error(f"--device {args.device}: no CUDA device here; valid: cpu")
    args.steps = args.steps or MODELS[args.model]["steps"]
    args.run_dir = args.run_dir or Path(f"runs/train_{args.model}")
    return args


def main(argv=None, default_model: str | None = None) -> int:
    from morca_env.models.training import TrainConfig, train

    args = parse_args(argv, default_model)
    torch.set_num_threads(args.threads)
    model, world = world_of(args.model)
    try:
        config = TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr, warmup=args.warmup,
                             shift=args.shift, high_noise_fraction=args.high_noise_fraction,
                             high_noise_min=args.high_noise_min, prompt_dropout=args.prompt_dropout, ema=args.ema,
                             seed=args.seed, checkpoint_every=args.checkpoint_every)
        out = args.out or model.weights_dir()
        info = train(model, world, config, args.run_dir, out, resume=args.resume, init=args.init, device=args.device,
                     progress=not args.no_progress)
    except (ValueError, FileExistsError) as error:
        print(f"morca train-testbed: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    print(f"saved {model.title} weights to {out} after {info['train_minutes']} min "
          f"(loss over the last 100 steps {info['final_loss_mean_last_100']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
