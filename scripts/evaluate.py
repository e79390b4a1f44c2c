"""`morca evaluate` (morca_env/commands/evaluate.py), kept as a script: `python scripts/evaluate.py --help`."""

import sys

from morca_env.commands.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
