"""`morca reinforce` (agents/commands/reinforce.py), kept as a script: `python scripts/train_reinforce.py --help`."""

import sys

from agents.commands.reinforce import main

if __name__ == "__main__":
    sys.exit(main())
