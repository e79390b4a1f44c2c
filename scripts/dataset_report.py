"""`morca dataset-report` (morca_env/commands/dataset_report.py), kept as a script: `python scripts/dataset_report.py --help`."""

import sys

from morca_env.commands.dataset_report import main

if __name__ == "__main__":
    sys.exit(main())
