"""Keep d3rlpy's import and training quiet: no legacy-gym notice, no info-level structlog lines.

d3rlpy 2.8 imports the unmaintained `gym` package, which prints a multi-line
"unmaintained since 2022" notice to stderr on every import (this project uses
gymnasium), and logs every fit and build at info level through structlog.
Warnings and errors still show, except one: a fit that continues an algorithm's training logs
"Skip building models" at warning level, and the trainers continue training on purpose (learning-curve
chunks, online rounds). Both happen at import, so this must run first:
`import morca_env` (or `agents`) before d3rlpy or stable-baselines3 does it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys

_NOTICE = "Gym has been unmaintained"
_EXPECTED_D3RLPY_WARNINGS = frozenset({"Skip building models since they're already built."})


def quiet_legacy_gym() -> None:
    """Import the legacy `gym` (if installed) with its notice filtered out, so that later imports of it
    by d3rlpy or stable-baselines3 print nothing; import morca_env before them. Costs ~0.1 s once."""
    if "gym" not in sys.modules:
        captured = io.StringIO()
        with contextlib.redirect_stderr(captured):
            with contextlib.suppress(ImportError):
                import gym  # noqa: F401
        text = captured.getvalue()
        if text and _NOTICE not in text:  # anything else gym printed is not ours to hide
            sys.stderr.write(text)


def quiet_d3rlpy(feature: str = "this feature") -> None:
    """Import d3rlpy without gym's notice and raise its structlog threshold to WARNING (idempotent);
    without d3rlpy, `MissingExtra` names the `[agents]` extra that installs it for `feature`."""
    from .extras import require

    quiet_legacy_gym()
    require("d3rlpy", feature)  # configures structlog on import; reconfigure after it
    import structlog

    processors = structlog.get_config()["processors"]
    if _drop_expected_warnings not in processors:
        processors = [_drop_expected_warnings, *processors]
    structlog.configure(processors=processors,
                        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def _drop_expected_warnings(logger, method_name, event_dict):
    """A structlog processor: drop d3rlpy's warnings about what the trainers do on purpose."""
    import structlog

    if event_dict.get("event") in _EXPECTED_D3RLPY_WARNINGS:
        raise structlog.DropEvent
    return event_dict
