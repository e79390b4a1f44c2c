"""Short MorcaTiny variants for research on prompt following (the model card's direction table).

    python research/morca_tiny/pilot_tiny.py --out /tmp/d16 --world direction      # MorcaTiny's own shape, ~12 min, one core
    python research/morca_tiny/pilot_tiny.py --world full --hw 32 --patch 8 2 2 --out /tmp/p32   # the first v0's shape

Trains a variant with `morca train-testbed --model tiny` (same objective, optimiser and EMA), then
reports which prompt words it reads (`tiny_probe.prompt_sensitivity`) and how
often its samples show the prompt's colour and direction of motion, with the
direction confusion counts. Variants: frame size (`--hw`, object sizes and speeds
scale with it), patch size, heads, layers; `--world direction` trains on the
four prompts "a red circle moving <direction> on a black background" only, to
see whether a variant can learn the direction at all when nothing else varies.

It works by changing `tiny_data`'s frame size and `tiny.TRANSFORMER_CONFIG` /
`tiny.GENERATION` inside this process only; the packaged model is never touched
(`--out` must not be the packaged weights directory).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import numpy as np
import torch

from morca_env.models import tiny, tiny_data
from morca_env.prompts import get_suite

DIRECTION_WORLD = dict(colour="red", shape="circle", background="black", size="", speed="")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="weights directory of the variant (and <out>_run for logs)")
    p.add_argument("--world", choices=("full", "direction"), default="full")
    p.add_argument("--hw", type=int, default=tiny_data.WIDTH, help="frame height = width in pixels")
    p.add_argument("--patch", type=int, nargs=3, default=list(tiny.TRANSFORMER_CONFIG["patch_size"]),
                   metavar=("T", "H", "W"))
    p.add_argument("--heads", type=int, default=tiny.TRANSFORMER_CONFIG["num_attention_heads"])
    p.add_argument("--head-dim", type=int, default=tiny.TRANSFORMER_CONFIG["attention_head_dim"])
    p.add_argument("--layers", type=int, default=tiny.TRANSFORMER_CONFIG["num_layers"])
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--samples", type=int, default=32, help="samples for the prompt-following count")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--eval-only", action="store_true", help="skip training: measure the weights already in --out")
    p.add_argument("train_args", nargs="*", help="passed to morca train-testbed after `--`, e.g. -- --high-noise-fraction 0.5")
    args = p.parse_args(argv)
    t, h, w = args.patch
    if args.hw < 8 or args.hw % h or args.hw % w or tiny_data.FRAMES % t:
        p.error(f"--hw {args.hw} must be >= 8 and divisible by the patch's H and W ({h}, {w}); "
                f"the patch's T ({t}) must divide {tiny_data.FRAMES} frames")
    if args.out.resolve() == tiny.weights_dir().resolve():
        p.error(f"--out {args.out} is the packaged weights directory; pick another")
    if args.samples < 4:
        p.error(f"--samples {args.samples} must be >= 4 (one per direction)")
    return args


def configure(args) -> None:
    """Switch this process's MorcaTiny definition to the variant."""
    scale = args.hw / tiny_data.WIDTH
    tiny_data.HEIGHT = tiny_data.WIDTH = args.hw
    tiny_data.SIZES = {k: v * scale for k, v in tiny_data.SIZES.items()}
    tiny_data.SPEEDS = {k: v * scale for k, v in tiny_data.SPEEDS.items()}
    tiny.TRANSFORMER_CONFIG.update(patch_size=tuple(args.patch), num_attention_heads=args.heads,
                                   attention_head_dim=args.head_dim, num_layers=args.layers)
    tiny.GENERATION.update(height=args.hw, width=args.hw)
    if args.world == "direction":
        every_scene = tiny_data.all_scenes
        tiny_data.all_scenes = lambda: [s for s in every_scene()
                                        if all(getattr(s, k) == v for k, v in DIRECTION_WORLD.items())]


def sample_pairs(args) -> list[tuple[str, int]]:
    if args.world == "direction":
        scenes = tiny_data.all_scenes()
        return [(scenes[i % len(scenes)].prompt, 1000 + i) for i in range(args.samples)]
    pairs = get_suite("tiny-eval").pairs()
    return pairs[:: max(1, len(pairs) // args.samples)][: args.samples]


def main(argv=None) -> int:
    args = parse_args(argv)
    configure(args)
    if not args.eval_only:
        from morca_env.commands import train_testbed  # reads tiny_data's attributes when called: the patched ones

        train_testbed.main(["--model", "tiny", "--steps", str(args.steps), "--threads", str(args.threads), "--out", str(args.out),
                         "--run-dir", f"{args.out}_run", "--resume", *args.train_args])
    from morca_env.diffusion.denoiser import DenoiserConfig, StepwiseDenoiser
    from tiny_probe import prompt_sensitivity

    torch.set_num_threads(args.threads)
    pipe = tiny.load_morca_tiny(directory=args.out)
    report = {"variant": {k: v for k, v in vars(args).items() if k not in ("out", "eval_only")},
              "prompt_sensitivity": {str(k): v for k, v in prompt_sensitivity(pipe, sigmas=(0.98, 0.9, 0.7)).items()}}
    den = StepwiseDenoiser(pipe, DenoiserConfig(**tiny.GENERATION))
    colour, direction, moves, confusion = [], [], [], collections.Counter()
    for prompt, seed in sample_pairs(args):
        scene, video = tiny_data.parse_prompt(prompt), den.generate(prompt=prompt, seed=seed)
        fg = tiny_data.foreground_stats(video)
        seen = tiny_data.classify_direction(fg.centroids)
        colour.append(tiny_data.classify_colour(fg.colour, fg.background) == scene.colour)
        direction.append(seen == scene.direction)
        confusion[f"{scene.direction}->{seen}"] += 1
        moves.append(np.nan_to_num(np.abs(fg.centroids[-1] - fg.centroids[0])).sum())
    den.close()
    report["samples"] = {"count": len(colour), "colour": float(np.mean(colour)), "direction": float(np.mean(direction)),
                         "mean_centroid_travel_px": float(np.mean(moves)), "direction_confusion": dict(sorted(confusion.items()))}
    (Path(f"{args.out}_run") / "pilot.json").parent.mkdir(parents=True, exist_ok=True)
    (Path(f"{args.out}_run") / "pilot.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
