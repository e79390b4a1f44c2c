"""Choose an anchored scheduler's margin on validation runs, and write the scheduler that plays it.

    morca anchor runs/offline/final.safetensors --out runs/offline/anchored.safetensors
    morca anchor CHECKPOINT --prompts 'tiny-train[7::44]' --pairs 24 --targets 2 2.5 3 --out ...

The checkpoint is one of the anchored recipe (`morca train`'s default; agents.anchored). The best fixed schedule is
played on every validation (prompt, seed) at every target with the critic reading each free step; each candidate
margin (the gains the critic gives 20 / 10 / 5 / 2 / 1% of those steps) is then played where it would leave the
baseline. The margin kept is the one with the highest mean paired gain over the best fixed schedule whose 95% lower
bound is above zero; when none is, the scheduler is the best fixed schedule (margin: never). The output checkpoint
holds the margin and every candidate's numbers (also in `<out>.json`); `morca_env.schedulers.make("morca",
path=<out>)` plays it. Validation prompts must be disjoint from the training and evaluation prompts: the default,
tiny-train[7::44], is disjoint from the anchored data's tiny-train[5::22], the best fixed schedule's fitting and
selection prompts and tiny-eval.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import agents  # noqa: F401  (first: registers our classes and quiets d3rlpy's import)
import gymnasium as gym

from agents.anchored import LEAVE_RATES, anchor_of, baseline_of, choose_margin, with_margin
from agents.checkpoint import CheckpointError, load_learnable
from morca_env.cli import env_id, json_dict, output_file, positive_int, show_library_messages, speedup, thread_count
from morca_env.utils.io import atomic_write_text
from morca_env.models.presets import preset_for_env
from morca_env.prompts import get_suite
from morca_env.registration import register_envs
from morca_env.schedulers.fixed import StaticSchedule
from morca_env.utils.threads import configure_threads
from morca_env.parallel.workers import default_num_envs


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="morca anchor", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", type=Path, help="an anchored checkpoint (morca train / finetune, --recipe anchored)")
    p.add_argument("--out", type=output_file, required=True, help="where the scheduler with its margin is written")
    p.add_argument("--env", type=env_id, default="MorcaTiny-v0")
    p.add_argument("--env-kwargs", type=json_dict, default={}, help="JSON dict of env kwargs")
    p.add_argument("--prompts", help="validation prompt suite, each with its fixed seed (default: the model's, e.g. "
                                     "tiny-train[7::44])")
    p.add_argument("--pairs", type=positive_int, default=24, help="validation (prompt, seed) pairs: the suite's first N")
    p.add_argument("--targets", type=speedup, nargs="+", default=[2.0, 2.5, 3.0])
    p.add_argument("--baseline", default="checkpoint",
                   help="the fixed schedules the scheduler is anchored to: 'checkpoint' (the ones it was trained "
                        "around), 'packaged' (the model's best fixed schedule as shipped now: re-anchor a "
                        "checkpoint after a refit) or a schedules file (morca fit-fixed writes them)")
    p.add_argument("--num-envs", type=positive_int, default=None, help="episodes played as one batch")
    p.add_argument("--threads", type=thread_count, default=None)
    args = p.parse_args(argv)
    if args.prompts is None:
        args.prompts = preset_for_env(args.env).prompts.anchor
    return args


def baseline_named(name: str, anchor: dict, env_id: str) -> StaticSchedule:
    """--baseline: the checkpoint's own schedules, the model's packaged best fixed schedule, or a schedules file."""
    if name == "checkpoint":
        return baseline_of(anchor["baseline"])
    if name == "packaged":
        return StaticSchedule.packaged(gym.spec(env_id).kwargs["model"])
    try:
        return StaticSchedule.from_file(name)
    except (OSError, ValueError) as error:
        raise SystemExit(f"--baseline {name!r} is not 'checkpoint', 'packaged' or a schedules file: {error}") from None


def main(argv=None) -> int:
    show_library_messages()
    args = parse_args(argv)
    configure_threads(args.threads)
    try:
        anchor = anchor_of(args.checkpoint)
        if anchor is None:
            raise SystemExit(f"{args.checkpoint} is not an anchored checkpoint (train it with --recipe anchored)")
        algo = load_learnable(args.checkpoint)
    except (CheckpointError, OSError) as error:
        raise SystemExit(f"checkpoint: {error}") from None
    register_envs()
    baseline = baseline_named(args.baseline, anchor, args.env)
    pairs = get_suite(args.prompts).pairs()
    if args.pairs > len(pairs):
        raise SystemExit(f"--pairs {args.pairs}: the suite {args.prompts!r} has {len(pairs)} pairs")
    options = [{"prompt": prompt, "seed": seed, "speedup": target}
               for prompt, seed in pairs[:args.pairs] for target in args.targets]
    features = bool(algo.config.actor_encoder_factory.features)
    kwargs = {"lpips": False, "prompts": args.prompts, "latent_features": features, **args.env_kwargs}
    num_envs = args.num_envs or default_num_envs(args.env, kwargs)
    env = (gym.make(args.env, **kwargs) if num_envs == 1
           else gym.make_vec(args.env, num_envs=num_envs, vectorization_mode="vector_entry_point", **kwargs))
    margin, record = choose_margin(env, algo, baseline, options, LEAVE_RATES)
    record.update(prompts=args.prompts, pairs=args.pairs, targets=list(args.targets), checkpoint=str(args.checkpoint),
                  baseline=baseline.source)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with_margin(args.checkpoint, args.out, margin, record, baseline)
    atomic_write_text(args.out.with_suffix(".json"), json.dumps(record, indent=1) + "\n")
    for row in record["candidates"]:
        print(f"margin {row['margin']:.3f} dB: {row['gain_db']:+.3f} +- {row['ci95_db']:.3f} dB vs best fixed, "
              f"leaves on {row['runs_leaving']:.0%} of runs, {row['steps_leaving']:.1%} of free steps")
    print(f"chosen: {'never leave (the best fixed schedule)' if record['chosen'] is None else f'{margin:.3f} dB'}; "
          f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
