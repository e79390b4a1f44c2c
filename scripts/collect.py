"""`morca collect` (morca_env/commands/collect.py), kept as a script: `python scripts/collect.py --help`."""

import sys

from morca_env.commands.collect import main

if __name__ == "__main__":
    sys.exit(main())
