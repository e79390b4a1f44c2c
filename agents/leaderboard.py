"""Moved: the leaderboard is a `morca` command, `agents.commands.leaderboard`. This path keeps working for one
release, with a DeprecationWarning."""

import warnings

from agents.commands import leaderboard as _moved


def __getattr__(name):
    warnings.warn("agents.leaderboard moved to agents.commands.leaderboard (the `morca leaderboard` command); "
                  "import it from there", DeprecationWarning, stacklevel=2)
    return getattr(_moved, name)
