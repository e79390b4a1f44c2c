"""The three forms every caching rule gets, and the run simulation they share.

A rule here (TeaCache, MagCache) decides from a signal that is known before the
run starts: TeaCache's depends only on the timesteps, MagCache's on fixed
per-step magnitude ratios. So for one setting the rule's schedule is a fixed mask,
computable without generating anything. A rule supplies one *gate* per CFG branch:

    gate.wants_reuse(step) -> bool   # accumulate this step's signal, the rule's own decision
    gate.commit(reused)              # what the step really did (a computed step resets the gate)

The env makes one decision per step for both branches, so a step reuses only when
every branch's gate wants to (a per-branch rule whose branches disagree computes
both). Steps the env forces (first, last, Wan2.2's expert switch) compute, and
the gates are told so, as the authors' code resets its accumulators on every
computed step.

The forms (registry names `<rule>`, `<rule>-global`, `<rule>-exact`):

* native (`NativeRule`): the rule at a threshold, as its authors run it, step by
  step; under an exact budget the mask overrides it where it must (like
  `seacache.SeaCacheThreshold`), and the gates follow what was executed.
* global threshold (`GlobalRule`): one threshold per target speedup, g(rho),
  fitted like `ThresholdMap`: K(threshold) converted to speedups with the env's
  calibration. K does not depend on the prompt here, so no training prompts are
  needed. Runs on its own K (a budget-free env).
* exact budget (`ExactRule`): the threshold that gives exactly K reuses, found by
  bisection on the computable mask (no replays). Where no threshold gives K (the
  count jumps, or a cap such as MagCache's K_max bounds it), the closest mask is
  played, the env's mask adjusts it to K, and `clipped` records (reached, wanted)
  with a warning.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from ...diffusion import wan_structure
from ...budget import BudgetSpec
from ...observation import Scalar, step_of
from ...speedup.files import ThresholdMap, threshold_map_from_counts
from ..base import PrecomputedSchedule, feasible


class Gate(Protocol):
    def wants_reuse(self, step: int) -> bool: ...

    def commit(self, reused: bool) -> None: ...


@dataclass
class RunContext:
    """What a rule needs to know about the run it schedules."""

    num_steps: int
    forced: frozenset
    branches: tuple[str, ...]
    timesteps: object = None  # the scheduler's timesteps (torch tensor), when a source is known
    step_models: list | None = None  # the transformer (expert) running each step
    calibration: object = None  # SpeedupCalibration for the global form
    model: str | None = None  # registered model name, for packaged constants
    view: object = None  # the live run, for rules that read run-time signals (`runtime.RunView`)


class Source:
    """Where a rule's run comes from: an env (`env=`), a stock pipeline (`pipe=`, for `accelerate`) or neither."""

    def __init__(self, env=None, pipe=None, branches: Sequence[str] | None = None, calibration=None):
        self.env = env.unwrapped if env is not None else None
        self.pipe = pipe if pipe is not None else (self.env.pipe if self.env is not None else None)
        if branches is not None:
            branches = tuple(branches)
            if not branches or any(b not in ("cond", "uncond") for b in branches) or len(set(branches)) != len(branches):
                raise ValueError(f"branches={branches!r}; valid: ('cond',) or ('cond', 'uncond')")
        self.branches = branches
        self.calibration = calibration

    @property
    def model(self) -> str | None:
        return self.env.preset.name if self.env is not None else None

    def context(self, info) -> RunContext:
        n = int(info["num_steps"])
        forced = frozenset(int(i) for i in info["forced_steps"]) | {0}
        if self.env is not None:
            den = self.env.denoiser
            return RunContext(n, forced, self.branches or den.branches, den.timesteps,
                              [den.expert(i) for i in range(n)], self._calibration(n, forced) or self.env.calibration,
                              self.model, info.get("run_view", self.env.run_view))
        if self.pipe is not None:
            timesteps = wan_structure.pipeline_timesteps(self.pipe, n)
            experts = wan_structure.experts(self.pipe)
            models = [experts[e] for e in wan_structure.expert_of_steps(self.pipe, timesteps)]
            return RunContext(n, forced, self.branches or ("cond", "uncond"), timesteps, models,
                              self._calibration(n, forced), view=info.get("run_view"))
        return RunContext(n, forced, self.branches or ("cond", "uncond"), calibration=self._calibration(n, forced))

    def _calibration(self, num_steps, forced):
        if self.calibration is None or not isinstance(self.calibration, str):
            return self.calibration
        from ...speedup.files import load_calibration

        return load_calibration(self.calibration, num_steps, BudgetSpec(num_steps, forced).max_budget)


class Rule:
    """Base of a caching rule: `prepare(context)` computes the run's signal, `gates(threshold)` one gate per branch."""

    name = "rule"

    def prepare(self, context: RunContext) -> None:
        self.context = context

    def gates(self, threshold: float) -> list[Gate]:
        raise NotImplementedError


def simulate(gates: Sequence[Gate], num_steps: int, forced=frozenset(), run_step=None, stop_above: int | None = None,
             can_reuse=None) -> list[int]:
    """The shared schedule of `gates` over a run with no budget: reuse iff every branch's gate wants to (and
    `can_reuse(step)`, when given). A run-time rule's free run passes `run_step(step, action)`, which runs the step
    before the gates are told (so a computed step's observations exist), and may stop once the schedule holds
    more than `stop_above` reuses."""
    schedule = []
    for step in range(num_steps):
        wants = [gate.wants_reuse(step) for gate in gates]  # every gate accumulates its step
        action = int(step not in forced and all(wants) and (can_reuse is None or can_reuse(step)))
        if run_step is not None:
            run_step(step, action)
        for gate in gates:
            gate.commit(bool(action))
        schedule.append(action)
        if stop_above is not None and sum(schedule) > stop_above:
            break
    return schedule


def branch_masks(rule: Rule, threshold: float) -> dict[str, list[int]]:
    """Each branch's own decisions, as a per-branch implementation (the authors', diffusers') makes them."""
    return {branch: simulate([gate], rule.context.num_steps)
            for branch, gate in zip(rule.context.branches, rule.gates(threshold))}


def reuses_at(rule: Rule, threshold: float) -> int:
    return sum(simulate(rule.gates(threshold), rule.context.num_steps, rule.context.forced))


def search_threshold(schedule_at, budget: int, iterations: int = 100, start: float = 1e-3, rtol: float = 1e-15):
    """Bisection on a threshold for a schedule with `budget` reuses: (threshold, schedule), the closest when none
    has K. `schedule_at(threshold)` is the rule's schedule without a budget; it may stop once it holds more than
    `budget` reuses (a run-time rule's free run does). The search ends after `iterations` halvings or when the
    bracket is narrower than `rtol` times its top (the count jumps there: no threshold gives K).

    The reuse count never falls as the threshold grows (a larger threshold only lets
    each accumulator run longer), so the search keeps the largest threshold below K and
    the smallest at or above it. Shared by every rule's exact-budget form.
    """
    seen = {}

    def count(threshold):
        if threshold not in seen:
            seen[threshold] = schedule_at(threshold)
        return sum(seen[threshold])

    lo, hi = 0.0, start
    while count(hi) < budget and hi < 1e12:
        lo, hi = hi, hi * 4
    for _ in range(iterations):
        if count(hi) == budget or hi - lo <= rtol * hi:
            break
        mid = (lo + hi) / 2
        if count(mid) < budget:
            lo = mid
        else:
            hi = mid
    if count(hi) == budget:  # found: no need to play lo (at 0, a full run without any reuse)
        return hi, seen[hi]
    candidates = [(abs(count(t) - budget), count(t) > budget, t) for t in (hi, lo)]
    _, _, threshold = min(candidates, key=lambda c: (c[0], c[1]))
    return threshold, seen[threshold]


def exact_threshold(rule: Rule, budget: int, iterations: int = 100) -> tuple[float, list[int]]:
    """`search_threshold` on a fixed-mask rule's computable mask (no replays)."""
    n, forced = rule.context.num_steps, rule.context.forced
    return search_threshold(lambda threshold: simulate(rule.gates(threshold), n, forced), budget, iterations)


def fitted_threshold_map(rule: Rule, calibration, grid=np.logspace(-5, 5, 401)) -> ThresholdMap:
    """g(rho) for the rule: each attainable K with the geometric middle of the thresholds giving it, at the
    speedup `calibration` predicts for that K. K(threshold) is prompt-independent for a fixed-mask rule."""
    counts = [reuses_at(rule, float(t)) for t in grid]
    return threshold_map_from_counts(rule.name, grid, counts, calibration, "K(threshold) and the env calibration")


class NativeRule:
    """The rule at one threshold, step by step, its gates following the executed actions (see the module docstring).
    It spends its own K, as its authors run it: evaluation gives it a budget-free env; `accelerate`'s mask holds it
    to K (the mask overrides it where it must)."""

    exact_budget = False

    def __init__(self, rule: Rule, threshold: float, source: Source):
        if not (isinstance(threshold, (int, float)) and not isinstance(threshold, bool) and threshold >= 0
                and math.isfinite(threshold)):
            raise ValueError(f"{rule.name}: threshold={threshold!r} must be a finite number >= 0")
        self.rule, self.threshold, self.source = rule, float(threshold), source

    def reset(self, obs, info) -> None:
        self.rule.prepare(self.source.context(info))
        self.threshold = self.episode_threshold(info)
        self._gates = self.rule.gates(self.threshold)
        self._used, self._step, self._last = 0, 0, None

    def episode_threshold(self, info) -> float:
        return self.threshold

    def __call__(self, obs) -> int:
        context = self.rule.context
        step = step_of(obs, context.num_steps)
        used = int(round(float(obs["scalars"][Scalar.u_t]) * context.num_steps))
        if step == self._step - 1 and self._last is not None:  # asked again at the same step: same decision
            return feasible(self._last, obs)
        if step != self._step:
            raise RuntimeError(f"{self.rule.name}: asked at step {step}, expected step {self._step}: call the policy "
                               "once per step, in order, after reset()")
        if step > 0:  # what the previous step executed (the mask may have overridden the rule)
            for gate in self._gates:
                gate.commit(used > self._used)
        self._used, self._step = used, step + 1
        wants = [gate.wants_reuse(step) for gate in self._gates]
        self._last = int(step not in context.forced and all(wants))
        return feasible(self._last, obs)


class GlobalRule(NativeRule):
    """One threshold per target speedup, g(rho), from the rule's own K(threshold) (see `fitted_threshold_map`)."""

    def __init__(self, rule: Rule, source: Source, threshold_map: ThresholdMap | None = None):
        super().__init__(rule, 0.0, source)
        self.threshold_map = threshold_map
        self._fitted_for = None

    def episode_threshold(self, info) -> float:
        if not info.get("target_speedup"):
            raise ValueError(f"{self.rule.name}-global needs a target speedup (reset with options={{'speedup': ...}}, "
                             "or accelerate(..., speedup=...))")
        key = (self.rule.context.num_steps, self.rule.context.forced, id(self.rule.context.calibration))
        if self.threshold_map is None or (self._fitted_for is not None and self._fitted_for != key):
            if self.rule.context.calibration is None:
                raise ValueError(f"{self.rule.name}-global needs a speedup calibration: pass env= or calibration=")
            self.threshold_map, self._fitted_for = fitted_threshold_map(self.rule, self.rule.context.calibration), key
        return self.threshold_map(float(info["target_speedup"]))


class ExactRule(PrecomputedSchedule):
    """The rule at the threshold that spends exactly the episode's K (bisection on the computable mask)."""

    def __init__(self, rule: Rule, source: Source):
        self.rule, self.source = rule, source
        self.last_threshold: float | None = None
        self.clipped: tuple[int, int] | None = None  # (reuses the closest threshold gives, K) when none gives K

    def reset(self, obs, info) -> None:
        self.rule.prepare(self.source.context(info))
        super().reset(obs, info)

    def plan(self, spec, budget):
        self.last_threshold, schedule = exact_threshold(self.rule, budget)
        self.clipped = clipping(self.rule.name, schedule, budget, spec.num_steps, self.last_threshold)
        return schedule


def clipping(name: str, schedule, budget: int, num_steps: int, threshold: float) -> tuple[int, int] | None:
    """(reached, wanted) when no threshold of rule `name` gives exactly `budget` reuses (warned), else None:
    the exact forms then play the closest schedule and the env's mask adjusts it."""
    if sum(schedule) == budget:
        return None
    warnings.warn(f"{name}-exact: no threshold gives exactly K={budget} reuses in {num_steps} steps "
                  f"(closest: {sum(schedule)} at {threshold:.4g}); the budget mask adjusts the closest schedule",
                  stacklevel=3)
    return sum(schedule), budget


def packaged_constants(rule: str, model: str | None) -> dict | None:
    """The constants `morca fit-rules` fitted for `model` (a user file first, then the packaged one)."""
    if model is None:
        return None
    from ...speedup.files import find_calibration_file

    path = find_calibration_file(f"{model}_{rule}.json")
    return None if path is None else json.loads(path.read_text())


def make_form(rule: Rule, form: str, threshold, source: Source, threshold_map=None):
    if isinstance(threshold_map, dict):  # as a JSON recipe gives it
        threshold_map = ThresholdMap.from_dict(threshold_map)
    if form == "native":
        return NativeRule(rule, threshold, source)
    if form == "global":
        return GlobalRule(rule, source, threshold_map)
    if form == "exact":
        return ExactRule(rule, source)
    raise ValueError(f"form={form!r}; valid: 'native', 'global', 'exact'")
