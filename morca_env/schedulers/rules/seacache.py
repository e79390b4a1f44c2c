"""SeaCache (the paper's baseline and the MDP's own signal) in its three forms: a threshold on D_t, one threshold
per target speedup g(rho), and the per-episode threshold that spends exactly K.

Its native and global forms read D_t from the observation (the env and `accelerate`
compute it for every scheduler), so they are policies over observations like any
agent. The exact form finds its threshold on free runs of the episode with the shared
run-time rule code (`rules.runtime.ExactRuntimeRule`: one threshold bisection, one
free run for every rule), through `SeaCacheRule`, whose gate is SeaCache's accumulator.
"""

from __future__ import annotations

from ...speedup.files import ThresholdMap, load_threshold_map
from ...observation import Scalar
from ...diffusion.signals import StepDistanceTracker, seacache_reuses, signal_input_for_step
from ..base import feasible
from ..registry import register
from . import forms, runtime


class SeaCacheThreshold:
    """SeaCache's rule: reuse while the accumulated filtered distance D_t stays below `delta`.

    It spends its own K, so evaluation runs it in a budget-free env (`exact_budget = False`);
    under `accelerate`'s exact budget the mask overrides the rule where it must (it then
    behaves like SeaCache clipped to K reuses). Paper Table 7 deltas for Wan2.1:
    0.28 / 0.47 / 0.7 at about 2.4x / 3.0x / 4.0x.
    """

    exact_budget = False

    def __init__(self, delta: float):
        if not delta >= 0:
            raise ValueError(f"delta={delta!r} must be a non-negative threshold")
        self.delta = float(delta)

    def reset(self, obs, info) -> None:
        pass

    def __call__(self, obs) -> int:
        return feasible(int(seacache_reuses(float(obs["scalars"][Scalar.D_t]), self.delta)), obs)


class GlobalSeaCache(SeaCacheThreshold):
    """SeaCache with one threshold per target speedup, g(rho) (as the paper tunes it on training prompts).

    Its K varies per video, so it runs in a budget-free env (`exact_budget = False`).
    """

    def __init__(self, threshold_map: ThresholdMap):
        super().__init__(1.0)
        self.g = threshold_map

    def reset(self, obs, info) -> None:
        if not info.get("target_speedup"):
            raise ValueError("seacache-global needs a target speedup (reset with options={'speedup': ...})")
        self.delta = self.g(info["target_speedup"])


class SeaCacheGate:
    """SeaCache's accumulator over a live run: D_t of the step's signal input, reset by every computed step."""

    def __init__(self, view, kind: str, delta: float):
        self.view, self.kind, self.delta = view, kind, delta
        self.tracker = StepDistanceTracker(kind=kind)

    def wants_reuse(self, step: int) -> bool:
        self.tracker.observe(signal_input_for_step(self.kind, self.view), self.view.sigma(step))
        return seacache_reuses(self.tracker.accumulated, self.delta)

    def commit(self, reused: bool) -> None:
        self.tracker.record(int(reused))


class SeaCacheRule(runtime.RuntimeRule):
    """SeaCache as a run-time rule: one gate for both branches (D_t is one distance per step)."""

    name = "seacache"
    keeps_head = False  # reads the step's input latents, not block 0
    threshold_start = 0.05  # first bracket of the bisection: D_t thresholds of a few hundredths are typical
    threshold_rtol = 1e-15  # no early stop: the reuse count of a threshold on D_t rarely jumps

    def __init__(self, kind: str = "official"):
        self.kind = kind

    def signals(self, view) -> list:
        return [view]

    def gate(self, signal, threshold: float) -> SeaCacheGate:
        return SeaCacheGate(signal, self.kind, threshold)


def threshold_map_for(env, name: str, threshold_map=None) -> ThresholdMap:
    """`threshold_map` (a ThresholdMap, or its dict as a JSON recipe gives it), else `env`'s packaged g(rho)."""
    if isinstance(threshold_map, dict):
        return ThresholdMap.from_dict(threshold_map)
    if threshold_map is not None:
        return threshold_map
    if env is None:
        raise ValueError(f"scheduler {name!r} reads the env's packaged calibration files: pass env=")
    return load_threshold_map(env.unwrapped.preset.name)


def exact_schedule(denoiser, kind: str, prompt: str, seed: int, spec, budget: int,
                   iterations: int = 12) -> tuple[list[int], float]:
    """(schedule, delta): SeaCache's schedule with `budget` reuses for (prompt, seed) on `denoiser`, found on free
    runs (the closest schedule when no threshold gives exactly K)."""
    rule = SeaCacheRule(kind)
    if budget == 0:
        return [0] * spec.num_steps, 0.0

    def schedule_at(delta):
        return runtime.free_run(rule, denoiser, {"prompt": prompt, "seed": seed}, delta, spec.forced,
                                stop_above=budget)

    delta, schedule = forms.search_threshold(schedule_at, budget, iterations, start=rule.threshold_start,
                                             rtol=rule.threshold_rtol)
    return (schedule + [0] * spec.num_steps)[:spec.num_steps], delta


@register("seacache", form="native")
def native(delta: float | None = None) -> SeaCacheThreshold:
    if delta is None:
        raise ValueError("scheduler 'seacache' needs a threshold: make('seacache', delta=0.3)")
    return SeaCacheThreshold(delta)


@register("seacache-global", needs_env=True, form="global")
def global_threshold(env=None, threshold_map=None) -> GlobalSeaCache:
    return GlobalSeaCache(threshold_map_for(env, "seacache-global", threshold_map))


@register("seacache-exact", needs_env=True, form="exact")
def exact(env=None, pipe=None, iterations: int = 12, signal_kind: str | None = None) -> runtime.ExactRuntimeRule:
    """Per episode, the threshold that yields exactly K reuses (bisection on free runs of the episode, before its
    first step; not counted in latency); when none does, the closest schedule is played and the mask adjusts it."""
    kind = signal_kind or (env.unwrapped.signal_kind if env is not None else "official")
    return runtime.ExactRuntimeRule(SeaCacheRule(kind), forms.Source(env, pipe), iterations)
