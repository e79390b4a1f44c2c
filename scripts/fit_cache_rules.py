"""`morca fit-rules` (morca_env/commands/fit_rules.py), kept as a script: `python scripts/fit_cache_rules.py --help`."""

import sys

from morca_env.commands.fit_rules import main

if __name__ == "__main__":
    sys.exit(main())
