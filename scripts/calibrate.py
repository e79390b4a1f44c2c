"""`morca calibrate` (morca_env/commands/calibrate.py), kept as a script: `python scripts/calibrate.py --help`."""

import sys

from morca_env.commands.calibrate import main

if __name__ == "__main__":
    sys.exit(main())
