"""`morca finetune` (agents/commands/finetune.py), kept as a script: `python scripts/finetune_online.py --help`."""

import sys

from agents.commands.finetune import main

if __name__ == "__main__":
    sys.exit(main())
