"""Where MORCA gym keeps what it makes on a machine: one root, `$MORCA_CACHE_DIR` or ~/.cache/morca.

    references/   no-cache reference videos (morca_env.diffusion.reference_videos)
    collect/      staged episodes of unfinished dataset builds (morca_env.data)
    calibration/  this machine's speedup calibrations, threshold maps and fitted schedules
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("MORCA_CACHE_DIR") or Path.home() / ".cache" / "morca")
