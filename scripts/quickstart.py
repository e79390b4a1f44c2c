"""`morca quickstart` (agents/commands/quickstart.py), kept as a script: `python scripts/quickstart.py --help`."""

import sys

from agents.commands.quickstart import main

if __name__ == "__main__":
    sys.exit(main())
