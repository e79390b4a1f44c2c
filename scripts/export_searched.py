"""`morca export-searched` (morca_env/commands/export_searched.py), kept as a script: `python scripts/export_searched.py --help`."""

import sys

from morca_env.commands.export_searched import main

if __name__ == "__main__":
    sys.exit(main())
