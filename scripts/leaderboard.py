"""`morca leaderboard` (agents/leaderboard.py), kept as a script: `python scripts/leaderboard.py --help`."""

import sys

from agents.leaderboard import main

if __name__ == "__main__":
    sys.exit(main())
