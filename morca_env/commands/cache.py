"""Show or clear the cache of no-cache reference videos (what every episode's PSNR is measured against).

    morca cache                       # where it is, how many files, how big, and its size bound
    morca cache --clear               # delete every cached reference (they are generated again when needed)
    morca cache --trim                # delete the least recently used ones down to the bound

The bound is $MORCA_REFERENCE_CACHE_MB (MiB, default 8192); the env trims to it as it writes. The cache lives in
$MORCA_CACHE_DIR/references (default ~/.cache/morca/references) unless an env is given reference_cache_dir=.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from morca_env.diffusion.reference_videos import cache_files, cache_limit_bytes, default_cache_dir, trim_cache


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="morca cache", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", type=Path, default=None, help="a reference cache directory (default: the user one)")
    action = p.add_mutually_exclusive_group()
    action.add_argument("--clear", action="store_true", help="delete every cached reference")
    action.add_argument("--trim", action="store_true", help="delete the least recently used down to the bound")
    args = p.parse_args(argv)
    try:
        limit = cache_limit_bytes()
    except ValueError as error:
        p.error(str(error))
    directory = args.dir or default_cache_dir()
    if directory.exists() and not directory.is_dir():
        p.error(f"--dir {directory} is a file, not a reference cache directory")
    if args.clear or args.trim:
        removed = trim_cache(directory, 0 if args.clear else limit)
        print(f"deleted {removed} reference(s) from {directory}")
    files = cache_files(directory) if directory.is_dir() else []
    size = sum(f.stat().st_size for f in files)
    print(f"{directory}: {len(files)} reference(s), {size / 2**20:.1f} MiB (bound {limit / 2**20:.0f} MiB, "
          "$MORCA_REFERENCE_CACHE_MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
