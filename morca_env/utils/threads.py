"""Torch thread counts that cannot oversubscribe the cores this process may use.

Measured on the project's 2-core VM: offline IQL with 2 torch threads next to one
other busy process ran 20-75x slower (two threads fighting over one free core,
each waiting at every barrier for the other); with 1 thread it ran at about half
speed. So the default is the cores this process may run on, minus the ones other
processes keep busy now (sampled from /proc/stat), shared among the workers we
start, and never less than 1. The project's contention benchmark measures it.
"""

from __future__ import annotations

import logging
import math
import os
import time

log = logging.getLogger(__name__)


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity; cgroup quotas are not read)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all cores from /proc/stat's first line."""
    fields = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_cores(window_s: float = 0.3) -> int:
    """Cores other processes keep busy right now, rounded to the nearest core.

    Sampled from /proc/stat over `window_s` (the 1-minute load average lags a job that
    just started by up to a minute, exactly when a new job must not take its core);
    the load average where /proc/stat is missing; 0 where neither is known.
    """
    try:
        busy0, total0 = _cpu_times()
        time.sleep(window_s)
        busy1, total1 = _cpu_times()
        if total1 > total0:
            return int(round((busy1 - busy0) / (total1 - total0) * available_cores()))
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(math.floor(os.getloadavg()[0]))
    except (AttributeError, OSError):
        return 0


def choose_threads(requested: int | None = None, workers: int = 1) -> tuple[int, str]:
    """-> (torch threads per worker, why). `requested` wins when given (a warning if it oversubscribes)."""
    cores = available_cores()
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers={workers!r} must be a positive integer")
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
            raise ValueError(f"threads={requested!r} must be a positive integer (this machine has {cores} cores)")
        if requested * workers > cores:
            log.warning("%d thread(s) x %d worker(s) > %d cores: oversubscribed torch threads can run 20x slower",
                        requested, workers, cores)
        return requested, f"{requested} torch thread(s) per worker (requested; {cores} cores, {workers} worker(s))"
    busy = min(busy_cores(), cores - 1)
    threads = max(1, (cores - busy) // workers)
    return threads, (f"{threads} torch thread(s) per worker: {cores} cores, {busy} busy with other work now, "
                     f"{workers} worker(s) (--threads N to choose)")


def configure_threads(requested: int | None = None, workers: int = 1, quiet: bool = False) -> int:
    """Set torch's thread count for this process (`choose_threads`), say so, and return it."""
    import torch

    threads, why = choose_threads(requested, workers)
    torch.set_num_threads(threads)
    if not quiet:
        log.info(why)
    return threads
