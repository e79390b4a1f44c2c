"""`morca search` (morca_env/commands/search.py), kept as a script: `python scripts/search_schedules.py --help`."""

import sys

from morca_env.commands.search import main

if __name__ == "__main__":
    sys.exit(main())
