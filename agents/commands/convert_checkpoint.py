"""Rewrite a trusted legacy checkpoint (d3rlpy `.d3`, REINFORCE `.pt`) in the safe format (`.safetensors`).

    morca convert-checkpoint runs/offline/final.d3                 # -> runs/offline/final.safetensors
    morca convert-checkpoint old/reinforce.pt --out new/reinforce.safetensors

Legacy checkpoints are pickles: loading one runs whatever code its author put in it, so the project loads them
only when asked to trust them. Converting is that trust, given once: run it only on files whose source you trust
(your own runs). The file's sha256 sidecar is checked first; the new file gets its own, and the old one is kept.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import agents  # noqa: F401  (registers our classes with d3rlpy)
from agents.checkpoint import CheckpointError, convert
from morca_env.cli import output_file


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="morca convert-checkpoint", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="+", type=Path, help="legacy checkpoints (.d3 or .pt) you trust")
    p.add_argument("--out", type=output_file, help="where to write (one checkpoint only; default: beside it, .safetensors)")
    args = p.parse_args(argv)
    if args.out is not None and len(args.checkpoints) > 1:
        p.error(f"--out names one file, and {len(args.checkpoints)} checkpoints were given")
    failed = 0
    for path in args.checkpoints:
        try:
            print(f"{path} -> {convert(path, args.out)}")
        except (CheckpointError, OSError) as error:
            print(f"FAILED {error}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
