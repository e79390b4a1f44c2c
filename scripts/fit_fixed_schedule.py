"""`morca fit-fixed` (morca_env/commands/fit_fixed.py), kept as a script: `python scripts/fit_fixed_schedule.py --help`."""

import sys

from morca_env.commands.fit_fixed import main

if __name__ == "__main__":
    sys.exit(main())
