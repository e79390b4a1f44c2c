"""`morca references` (morca_env/commands/references.py), kept as a script: `python scripts/benchmark_references.py --help`."""

import sys

from morca_env.commands.references import main

if __name__ == "__main__":
    sys.exit(main())
