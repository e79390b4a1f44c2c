"""Quiet model loading: no per-component progress bars or info chatter inside env construction."""

from __future__ import annotations

import contextlib

from diffusers.utils import logging as diffusers_logging
from transformers.utils import logging as transformers_logging


@contextlib.contextmanager
def quiet_loading():
    d_level, t_level = diffusers_logging.get_verbosity(), transformers_logging.get_verbosity()
    d_bars, t_bars = diffusers_logging.is_progress_bar_enabled(), transformers_logging.is_progress_bar_enabled()
    diffusers_logging.set_verbosity_error()
    transformers_logging.set_verbosity_error()
    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        diffusers_logging.set_verbosity(d_level)
        transformers_logging.set_verbosity(t_level)
        if d_bars:
            diffusers_logging.enable_progress_bar()
        if t_bars:
            transformers_logging.enable_progress_bar()
