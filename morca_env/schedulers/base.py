"""What every scheduler is: the protocol the env, `accelerate` and the agents share, and the precomputed-schedule base.

    scheduler.reset(obs, info)    # start of an episode (info from env.reset)
    action = scheduler(obs)       # 0 = recompute, 1 = reuse; always feasible under obs["action_mask"]

Step index, budget and accumulated distance are read from the observation's
scalars (t = remaining / N, K / N, D_t), so schedulers work on any env id.
Optional properties a scheduler may declare (read with `getattr`, defaults below):
`exact_budget` (True: it spends exactly the episode's K; False: it runs on its own K,
in a budget-free env) and `close()` (it holds a private run to release).
"""

from __future__ import annotations

from typing import Protocol

from ..budget import BudgetSpec
from ..observation import step_of

step_index = step_of  # the name the schedulers have always used


class Scheduler(Protocol):
    def reset(self, obs, info) -> None: ...

    def __call__(self, obs) -> int: ...


def feasible(action: int, obs) -> int:
    """`action` if the mask allows it, else the other (feasible) one."""
    return int(action) if obs["action_mask"][int(action)] else 1 - int(action)


def needs_exact_budget(scheduler) -> bool:
    """False for rules that run on their own K (e.g. SeaCache with a global threshold): a budget-free env."""
    return getattr(scheduler, "exact_budget", True)


class PrecomputedSchedule:
    """Base for schedulers that fix the whole schedule at reset: subclasses say how in `plan(spec, budget)`."""

    def reset(self, obs, info) -> None:
        self.num_steps = info["num_steps"]
        self.spec = BudgetSpec(self.num_steps, frozenset(info["forced_steps"]))
        self.schedule = self.plan(self.spec, info["budget"])

    def plan(self, spec: BudgetSpec, budget: int) -> list[int]:
        raise NotImplementedError

    def __call__(self, obs) -> int:
        return feasible(self.schedule[step_index(obs, self.num_steps)], obs)
