"""Optional dependencies: which extra installs each, and one error that names it.

The core install (`pip install morca-gym`) runs the env, the cache rules, fixed
schedules, datasets and evaluation on any gymnasium 1.x; learned agents (d3rlpy,
which pins gymnasium 1.0), stable-baselines3, LPIPS, Ray and the leaderboard's
statistics come as extras, imported only where used.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from gymnasium.error import DependencyNotInstalled

EXTRA_OF = {"d3rlpy": "agents", "tensorboard": "agents", "stable_baselines3": "sb3", "sb3_contrib": "sb3",
            "lpips": "lpips", "torchvision": "lpips", "ray": "ray", "rliable": "benchmark"}


class MissingExtra(DependencyNotInstalled, ImportError):
    """An optional dependency is not installed (also an ImportError, for code that catches those)."""


def install_hint(extra: str) -> str:
    return f"pip install 'morca-gym[{extra}]' (in a checkout: pip install -e '.[{extra}]')"


def require(module: str, feature: str) -> ModuleType:
    """Import `module` for `feature`, or raise `MissingExtra` naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        extra = EXTRA_OF[module.split(".")[0]]
        raise MissingExtra(f"{feature} needs {module.split('.')[0]}, which is not installed: "
                           f"{install_hint(extra)}") from error
