"""Gather the episodes that schedule searches evaluated into the schedules file of a searched dataset recipe.

    morca export-searched runs/fixed_schedule runs/search/train \\
        --per-search 20 --out searched-v0.schedules.json

Each entry is one evaluated episode (prompt, seed, schedule, its reward); the
`replay` behaviour of a searched dataset's recipe (the repository's `morca/tiny/searched-v0.json`) plays them again
with full observations. Prompts of `--exclude-suite` (default: every model's
evaluation suite) are refused: held-out prompts never become training data.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from morca_env.utils.io import atomic_write_text
from morca_env.prompts import evaluation_prompts, get_suite
from morca_env.evaluation.search import searched_episodes
from morca_env.cli import output_file, positive_int


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="morca export-searched", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("logs", type=Path, nargs="+", help="search output directories (*.jsonl logs)")
    p.add_argument("--per-search", type=positive_int, default=None, help="episodes kept per (search, prompt): best half + random")
    p.add_argument("--exclude-suite", help="a suite whose prompts are left out (default: every evaluation suite)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=output_file, required=True)
    args = p.parse_args(argv)
    if args.per_search is not None and args.per_search < 2:
        p.error(f"--per-search {args.per_search} must be >= 2 (a best half and a random half)")
    held_out = get_suite(args.exclude_suite).prompts if args.exclude_suite else evaluation_prompts()
    entries = searched_episodes(args.logs, args.per_search, args.seed, held_out)
    if not entries:
        raise SystemExit(f"no evaluated episodes under {', '.join(map(str, args.logs))}")
    atomic_write_text(args.out, json.dumps(entries, separators=(",", ":")) + "\n")
    prompts = len({(e["prompt"], e["seed"]) for e in entries})
    print(f"wrote {len(entries)} episodes of {prompts} (prompt, seed) pairs to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
