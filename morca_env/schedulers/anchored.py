"""The baseline from any state: a fixed schedule followed closed-loop, re-planned after each step that left it.

Why: a learned scheduler that improves on a baseline schedule (the best fixed schedule) leaves it at a few steps,
and after a step that left it the baseline's remaining plan has one reuse too many or too few for K. The plan's
rest is then moved as little as possible (`adjust_reuses`, the rule that fits a fixed schedule to a neighbouring
K), so "what the baseline does here" is defined in every state an episode can reach. The learned side of this
idea (the residual state, the critic-gated switch) lives in `agents.anchored`; this module is what plays without
a network: the baseline itself (`follow-best-fixed`) and the behaviour that collects data around it
(`best-fixed-deviations`).
"""

from __future__ import annotations

import numpy as np

from ..budget import BudgetSpec
from ..observation import Scalar
from .base import PrecomputedSchedule, feasible, step_index
from .fixed import StaticSchedule
from .registry import register
from .schedule import adjust_reuses


class BaselinePlan:
    """One episode's plan: the baseline's schedule, its rest re-planned after each executed action that differs."""

    def __init__(self, schedule, spec: BudgetSpec, budget: int):
        self.plan = [int(a) for a in schedule]
        if len(self.plan) != spec.num_steps or sum(self.plan) != budget:
            raise ValueError(f"a baseline plan of {len(self.plan)} steps with {sum(self.plan)} reuses does not fit "
                             f"an episode of {spec.num_steps} steps with K={budget}")
        self.spec, self.budget = spec, int(budget)
        self.departures = 0  # executed actions that differed from the plan

    def action(self, step: int) -> int:
        return self.plan[step]

    def record(self, step: int, action: int) -> None:
        """The action executed at `step`; a differing one re-plans steps after it to K."""
        if int(action) == self.plan[step]:
            return
        self.departures += 1
        self.plan[step] = int(action)
        try:
            self.plan = adjust_reuses(self.plan, self.spec, self.budget, first=step + 1)
        except ValueError:  # cannot happen for feasible actions (the mask keeps K reachable); the env projects
            pass


def baseline_actions(schedule, spec: BudgetSpec, actions) -> np.ndarray:
    """The baseline's action at each step of a recorded episode (K = its reuses), re-planned after each departure:
    what `FollowBaseline` would have proposed in each state of that episode."""
    actions = [int(a) for a in actions]
    plan = BaselinePlan(schedule, spec, sum(actions))
    proposed = np.empty(len(actions), dtype=np.int64)
    for step, action in enumerate(actions):
        proposed[step] = plan.action(step)
        plan.record(step, action)
    return proposed


class FollowBaseline:
    """Plays a precomputed baseline (the best fixed schedule) closed-loop: re-planned whenever the executed action
    differed from it (a subclass's or a wrapper's deviation). Alone it is the baseline exactly."""

    def __init__(self, baseline: PrecomputedSchedule):
        self.baseline = baseline

    def reset(self, obs, info) -> None:
        self.baseline.reset(obs, info)
        self.num_steps = int(info["num_steps"])
        self.plan = BaselinePlan(self.baseline.schedule, self.baseline.spec, int(info["budget"]))
        self.step, self._used = 0, 0

    def baseline_action(self, obs) -> int:
        """The baseline's action in this state (the executed actions so far are read off the observation's u_t)."""
        step = step_index(obs, self.num_steps)
        used = int(round(float(obs["scalars"][Scalar.u_t]) * self.num_steps))
        if step == self.step + 1:  # the previous step's executed action, whatever was asked
            self.plan.record(self.step, used - self._used)
        elif step != self.step:
            raise RuntimeError(f"{type(self).__name__} saw step {step} after step {self.step}: call it once per step")
        self.step, self._used = step, used
        return self.plan.action(step)

    def __call__(self, obs) -> int:
        return feasible(self.baseline_action(obs), obs)


@register("follow-best-fixed", needs_env=True)
def follow_best_fixed(env=None, path=None) -> FollowBaseline:
    """The best fixed schedule, closed-loop (the same actions as "best-fixed" when nothing else acts)."""
    return FollowBaseline(StaticSchedule.for_env(env, path))


class BaselineDeviations(FollowBaseline):
    """Behaviour data around the baseline, in groups that share a prompt, seed and target speedup.

    Episode `index` belongs to group `index // group_size`; the group's first episode plays the baseline, the others
    leave it at each step with both actions feasible with probability `rate` (drawn per episode in `rate`'s range)
    and follow the re-planned baseline otherwise. A group's episodes differ only by where they left the baseline,
    so the difference of their returns is the effect of those departures, free of the prompt and noise sample
    (`agents.anchored` trains on it). `speedups`: the ranges target speedups are drawn from.

    `keep_k=True` leaves only where the re-planned baseline can still end on the group's K: collection runs
    budget-free (the observation's mask holds only forced steps), so a departure late in a run could not be
    repaid and the member ended on K +- 1, in another (prompt, seed, K) group than its leader. Measured on
    `anchored-v1` (collected with `keep_k=False`): 114 of its 200 groups were split that way.
    """

    def __init__(self, baseline: PrecomputedSchedule, env, group_size: int = 4, rate=(0.02, 0.1),
                 speedups=((1.8, 4.0),), seed: int | None = None, keep_k: bool = True):
        super().__init__(baseline)
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2:
            raise ValueError(f"group_size={group_size!r} must be an integer >= 2 (one baseline episode and others)")
        low, high = (rate, rate) if isinstance(rate, (int, float)) else tuple(rate)
        if not 0.0 <= low <= high <= 1.0:
            raise ValueError(f"rate={rate!r} must be a probability or a range (low, high) within [0, 1]")
        ranges = [tuple(float(x) for x in r) for r in speedups]
        if not ranges or any(len(r) != 2 or not 1.0 <= r[0] <= r[1] for r in ranges):
            raise ValueError(f"speedups={speedups!r} must be a list of ranges [low, high] with 1 <= low <= high")
        self.env, self.group_size, self.rate_range, self.speedups = env, group_size, (low, high), ranges
        self.seed = 0 if seed is None else int(seed)
        self.rng = np.random.default_rng(self.seed)
        self.rate, self.keep_k = 0.0, bool(keep_k)

    def episode_options(self, index: int) -> dict:
        """The group's prompt, seed and speedup (drawn from the group's own generator: every member draws the same)."""
        group, member = divmod(int(index), self.group_size)
        base = self.seed - int(index)  # collection seeds episode `index`'s behaviour with the recipe's seed + index
        if base < 0:
            raise ValueError(f"episode index {index} with behaviour seed {self.seed}: collection seeds it with the "
                             "recipe's seed + index, so the group's shared draws can be made from the recipe's seed")
        shared = np.random.default_rng([base, group])
        prompt, seed = self.env.unwrapped.suite.sample(shared)
        widths = np.array([r[1] - r[0] for r in self.speedups])
        pick = int(shared.choice(len(self.speedups), p=widths / widths.sum() if widths.sum() else None))
        low, high = self.speedups[pick]
        top = self.env.unwrapped.calibration.speedup_range[1]
        speedup = float(min(shared.uniform(low, high), top))
        self.rate = 0.0 if member == 0 else float(self.rng.uniform(*self.rate_range))
        return {"prompt": prompt, "seed": int(seed), "speedup": speedup}

    def __call__(self, obs) -> int:
        action = self.baseline_action(obs)
        if self.free(obs) and self.rate and self.rng.random() < self.rate:
            action = 1 - action
        return feasible(action, obs)

    def free(self, obs) -> bool:
        """Both actions allowed here: by the observation's mask, and with `keep_k` by the group's K too."""
        mask = obs["action_mask"]
        if not (mask[0] and mask[1]):
            return False
        return not self.keep_k or bool(self.plan.spec.action_mask(self.step, self._used, self.plan.budget).all())


@register("best-fixed-deviations", seeded=True, needs_env=True)
def best_fixed_deviations(env=None, path=None, group_size: int = 4, rate=(0.02, 0.1), speedups=((1.8, 4.0),),
                          seed: int | None = None, keep_k: bool = True) -> BaselineDeviations:
    """Groups of episodes on the best fixed schedule and around it (`BaselineDeviations`)."""
    if env is None:
        raise ValueError("scheduler 'best-fixed-deviations' draws its groups' prompts from the env: pass env=")
    return BaselineDeviations(StaticSchedule.for_env(env, path), env, group_size, rate, speedups, seed, keep_k)
