"""Check a MORCA Minari dataset against the per-episode checksums recorded when it was built.

    morca verify-dataset morca/tiny/random-v0            # exit 0: every episode intact
    morca verify-dataset morca/tiny/random-v0 other-v0   # several at once

Minari keeps no checksum of its own; our loaders (`to_replay_buffer`, training, the leaderboard) check each
episode as they read it, and this checks a whole dataset for a plain `minari.load_dataset` user
(`morca_env.data.integrity.verify_dataset` from Python). Exit 1 names the file and episode that fail.
"""

from __future__ import annotations

import argparse
import sys

from morca_env.data.integrity import DatasetIntegrityError, verify_dataset


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="morca verify-dataset", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("datasets", nargs="+", help="Minari dataset ids")
    args = p.parse_args(argv)
    failed = 0
    for dataset_id in args.datasets:
        try:
            count = verify_dataset(dataset_id)
        except DatasetIntegrityError as error:
            print(f"FAILED {error}", file=sys.stderr)
            failed += 1
            continue
        print(f"ok {dataset_id}: {count} episodes match their checksums" if count else
              f"unverified {dataset_id}: no checksums recorded (built by an older version)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
