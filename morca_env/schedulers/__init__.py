"""Schedulers: every way of deciding, step by step, whether a denoising step recomputes or reuses the cache.

    from morca_env.schedulers import make, names
    scheduler = make("teacache-exact", env)       # any registered name; names() lists them
    scheduler.reset(obs, info); action = scheduler(obs)

* `base`: the protocol and the precomputed-schedule base class;
* `registry`: one registry (`make`, `names`, `register`, method specs such as `label=path`);
* `schedule`: schedules as values (reaching a K, neighbours, keys);
* `fixed`: the fixed schedules (uniform, given, best fixed, random, searched, jittered, replayed);
* `rules/`: SeaCache and the caching rules of the literature, each in three forms;
* `behaviour`, `mixture`: the datasets' behaviour policies;
* `naive`: the floor of the scale (always recompute, always reuse, a coin flip), masked;
* `anchored`: the best fixed schedule followed from any state, and the behaviour that collects data around it.
Learned schedulers ("morca", "reinforce") are registered by the `agents` package.
"""

from . import anchored, behaviour, fixed, mixture, naive  # noqa: F401  (each registers its schedulers)
from .rules import seacache  # noqa: F401
from .base import PrecomputedSchedule, Scheduler, feasible, needs_exact_budget
from .registry import (Entry, checkpoint_paths, entry, from_spec, is_seeded, make, names, parse_method,
                       refuse_caller_only_options, register)
from .rules import rule_names

__all__ = ["Entry", "PrecomputedSchedule", "Scheduler", "checkpoint_paths", "entry", "feasible", "from_spec",
           "is_seeded", "make", "names", "needs_exact_budget", "parse_method", "refuse_caller_only_options", "register",
           "rule_names"]
