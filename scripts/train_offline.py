"""`morca train` (agents/commands/train.py), kept as a script: `python scripts/train_offline.py --help`."""

import sys

from agents.commands.train import main

if __name__ == "__main__":
    sys.exit(main())
