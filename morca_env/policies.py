"""Rule schedulers from the caching literature, as policies over MorcaEnv's observations.

Every policy follows one small protocol, also met by trained agents:

    policy.reset(obs, info)      # start of an episode (info from env.reset)
    action = policy(obs)         # 0 = recompute, 1 = reuse; always feasible under obs["action_mask"]

Step index, budget and accumulated distance are read from the observation's
scalars (t = remaining / N, K / N, D_t), so the policies work on any env id.
"""

from __future__ import annotations

import numpy as np

from .budget import BudgetSpec
from .signals import seacache_reuses

D_INDEX, T_INDEX, U_INDEX, K_INDEX = 1, 2, 4, 5


def step_index(obs, num_steps: int) -> int:
    return int(round(num_steps * (1.0 - float(obs["scalars"][T_INDEX]))))


def feasible(action: int, obs) -> int:
    """`action` if the mask allows it, else the other (feasible) one."""
    return int(action) if obs["action_mask"][int(action)] else 1 - int(action)


class _FixedSchedule:
    """Base for policies that fix the whole schedule at reset."""

    def reset(self, obs, info) -> None:
        self.num_steps = info["num_steps"]
        self.spec = BudgetSpec(self.num_steps, frozenset(info["forced_steps"]))
        self.schedule = self.plan(self.spec, info["budget"])

    def plan(self, spec: BudgetSpec, budget: int) -> list[int]:
        raise NotImplementedError

    def __call__(self, obs) -> int:
        return feasible(self.schedule[step_index(obs, self.num_steps)], obs)


class UniformInterval(_FixedSchedule):
    """K reuses spread as evenly as possible over the free (non-forced) steps."""

    def plan(self, spec, budget):
        free = [i for i in range(spec.num_steps) if i not in spec.forced]
        schedule = [0] * spec.num_steps
        if budget:
            # the K positions of an even grid over the free steps, keeping recomputes evenly spaced too
            picks = np.floor((np.arange(budget) + 0.5) * len(free) / budget).astype(int)
            for p in picks:
                schedule[free[p]] = 1
        return schedule


class RandomFeasible(_FixedSchedule):
    """A schedule drawn uniformly among those with exactly K reuses on free steps."""

    def __init__(self, seed: int | None = None):
        self.rng = np.random.default_rng(seed)

    def plan(self, spec, budget):
        free = [i for i in range(spec.num_steps) if i not in spec.forced]
        schedule = [0] * spec.num_steps
        for i in self.rng.choice(free, size=budget, replace=False):
            schedule[int(i)] = 1
        return schedule


class SeaCacheThreshold:
    """SeaCache's rule: reuse while the accumulated filtered distance D_t stays below `delta`.

    Under an exact budget the mask overrides the rule where it must (it then
    behaves like SeaCache clipped to K reuses). Paper Table 7 deltas for Wan2.1:
    0.28 / 0.47 / 0.7 at about 2.4x / 3.0x / 4.0x.
    """

    def __init__(self, delta: float):
        if not delta >= 0:
            raise ValueError(f"delta={delta!r} must be a non-negative threshold")
        self.delta = float(delta)

    def reset(self, obs, info) -> None:
        pass

    def __call__(self, obs) -> int:
        return feasible(int(seacache_reuses(float(obs["scalars"][D_INDEX]), self.delta)), obs)


def seacache_free_run(denoiser, kind: str, prompt: str, seed: int, delta: float, forced, stop_above: int | None = None):
    """Run SeaCache's plain threshold rule (no budget) and return its schedule.

    With `stop_above`, the run stops as soon as it has made more reuses than that
    (the returned schedule is then partial and has `stop_above + 1` reuses).
    """
    from .signals import StepDistanceTracker, signal_input_for_step

    tracker = StepDistanceTracker(kind=kind)
    denoiser.start(prompt=prompt, seed=seed)
    schedule: list[int] = []
    while not denoiser.done:
        i = denoiser.step_index
        tracker.observe(signal_input_for_step(kind, denoiser), denoiser.sigma(i))
        action = int(i not in forced and denoiser.cache_valid(i) and seacache_reuses(tracker.accumulated, delta))
        tracker.record(action)
        denoiser.step(reuse=bool(action))
        schedule.append(action)
        if stop_above is not None and sum(schedule) > stop_above:
            break
    return schedule


def seacache_exact_schedule(denoiser, kind: str, prompt: str, seed: int, spec: BudgetSpec, budget: int,
                            iterations: int = 12) -> tuple[list[int], float, int]:
    """Bisection on SeaCache's threshold for the schedule with `budget` reuses: (schedule, delta, replays).

    When no threshold gives exactly `budget` (the count can jump), the closest
    schedule is returned; playing it in an exact-budget env lets the mask fix the rest.
    """
    if budget == 0:
        return [0] * spec.num_steps, 0.0, 0
    best: tuple[int, float, list[int]] | None = None
    replays = 0

    def reuses_at(delta: float) -> int:
        nonlocal best, replays
        replays += 1
        schedule = seacache_free_run(denoiser, kind, prompt, seed, delta, spec.forced, stop_above=budget)
        count = sum(schedule)
        if best is None or abs(count - budget) < best[0]:
            best = (abs(count - budget), delta, schedule)
        return count

    lo, hi = 0.0, 0.05
    while reuses_at(hi) < budget and hi < 1e6:
        lo, hi = hi, hi * 4
    for _ in range(iterations):
        if best[0] == 0:
            break
        mid = (lo + hi) / 2
        if reuses_at(mid) < budget:
            lo = mid
        else:
            hi = mid
    _, delta, schedule = best
    return (schedule + [0] * spec.num_steps)[:spec.num_steps], delta, replays


class SeaCacheExactBudget(_FixedSchedule):
    """SeaCache with the per-episode threshold that yields exactly K reuses (bisection on replays).

    A fairer baseline than one global threshold: each video gets the delta that
    spends its budget exactly. Replays run on the env's own pipeline (a second
    denoiser sharing its cache hooks) before the episode's first step. When no
    delta gives exactly K (the reuse count can jump), the closest schedule is
    played and the mask adjusts it to K. Costs up to `iterations` generations per episode.
    """

    def __init__(self, env, iterations: int = 12):
        self.env = env.unwrapped
        self.iterations = iterations
        self._denoiser = None
        self.last_delta: float | None = None
        self.replays = 0

    def reset(self, obs, info) -> None:
        from .denoiser import StepwiseDenoiser

        if self._denoiser is None:
            self._denoiser = StepwiseDenoiser(self.env.pipe, self.env.config, device=self.env.device)
        self.prompt, self.seed = info["prompt"], info["seed"]
        super().reset(obs, info)

    def plan(self, spec, budget):
        schedule, self.last_delta, replays = seacache_exact_schedule(
            self._denoiser, self.env.signal_kind, self.prompt, self.seed, spec, budget, self.iterations)
        self.replays += replays
        return schedule

    def close(self) -> None:
        if self._denoiser is not None:
            self._denoiser.close()
            self._denoiser = None


class ThresholdMap:
    """g(rho): the global SeaCache threshold whose mean realised speedup is rho (interpolated in log delta).

    Built from (speedup, threshold) pairs measured by `scripts/calibrate.py --thresholds`
    (or, for Wan2.1 / Wan2.2, the paper's Table 7 settings).
    """

    def __init__(self, speedups, thresholds, source: str = "unspecified"):
        order = np.argsort(speedups)
        self.speedups = np.asarray(speedups, dtype=float)[order]
        self.thresholds = np.asarray(thresholds, dtype=float)[order]
        if len(self.speedups) < 2 or np.any(self.thresholds <= 0) or np.any(np.diff(self.speedups) <= 0):
            raise ValueError("a threshold map needs >= 2 points with distinct speedups and positive thresholds")
        self.source = source

    def __call__(self, speedup: float) -> float:
        log_delta = np.log(self.thresholds)
        x, y = self.speedups, log_delta
        if speedup <= x[0]:
            slope = (y[1] - y[0]) / (x[1] - x[0])
            return float(np.exp(y[0] + slope * (speedup - x[0])))
        if speedup >= x[-1]:
            slope = (y[-1] - y[-2]) / (x[-1] - x[-2])
            return float(np.exp(y[-1] + slope * (speedup - x[-1])))
        return float(np.exp(np.interp(speedup, x, y)))

    def recalibrated(self, old, new) -> "ThresholdMap":
        """The same thresholds with speedups re-read through a newer calibration.

        The map's speedups are mean realised budgets K converted with the calibration
        of the time (`old`); a threshold's K does not depend on the machine, so reading
        `old` backwards and `new` forwards gives today's speedup.
        """
        speedups = np.array([new.speedup_of_budget(old.budget_at(rho)) for rho in self.speedups])
        keep = np.isfinite(speedups)
        return ThresholdMap(speedups[keep], self.thresholds[keep], source=f"{self.source}, recalibrated: {new.source}")

    def to_dict(self) -> dict:
        return {"speedups": self.speedups.tolist(), "thresholds": self.thresholds.tolist(), "source": self.source}

    @classmethod
    def from_dict(cls, data: dict) -> "ThresholdMap":
        return cls(data["speedups"], data["thresholds"], data.get("source", "unspecified"))


def smoothstep_curve(num_steps: int, positions, values) -> np.ndarray:
    """Piecewise cubic smoothstep (3s^2 - 2s^3) through (position, value) knots, flat outside them."""
    positions, values = np.asarray(positions, dtype=float), np.asarray(values, dtype=float)
    steps = np.arange(num_steps, dtype=float)
    curve = np.empty(num_steps)
    curve[steps <= positions[0]] = values[0]
    curve[steps >= positions[-1]] = values[-1]
    for (p0, v0), (p1, v1) in zip(zip(positions[:-1], values[:-1]), zip(positions[1:], values[1:])):
        inside = (steps >= p0) & (steps <= p1)
        s = (steps[inside] - p0) / (p1 - p0)
        curve[inside] = v0 + (v1 - v0) * (3 * s**2 - 2 * s**3)
    return curve


class ThresholdCurve:
    """The paper's behaviour policy (App. B.3): SeaCache with a random smooth threshold curve.

    Per episode: the mean level mu = g(rho*) from the episode's target speedup
    (info["target_speedup"], or one drawn from `speedup_range`); an amplitude
    A ~ U(amplitude); 2-5 random reference steps with relative values in [-1, 1]
    joined by cubic smoothstep; delta_i = mu (1 + A shape_i), then clipped to
    [min_ratio mu, max_ratio mu] and to a per-step change of at most
    max_step_change mu. Reuse while D_t < delta_i; the mask always wins.
    """

    def __init__(self, threshold_map: ThresholdMap, speedup_range=(1.5, 4.5), amplitude=(0.0, 0.9),
                 num_references=(2, 5), min_ratio=0.1, max_ratio=3.0, max_step_change=0.25, seed=None):
        self.g = threshold_map
        self.speedup_range = speedup_range
        self.amplitude = amplitude
        self.num_references = num_references
        self.min_ratio, self.max_ratio, self.max_step_change = min_ratio, max_ratio, max_step_change
        self.rng = np.random.default_rng(seed)
        self.curve: np.ndarray | None = None

    def sample_curve(self, num_steps: int, speedup: float) -> np.ndarray:
        mu = self.g(speedup)
        amplitude = self.rng.uniform(*self.amplitude)
        count = int(self.rng.integers(self.num_references[0], self.num_references[1] + 1))
        positions = np.sort(self.rng.choice(num_steps, size=min(count, num_steps), replace=False))
        values = self.rng.uniform(-1, 1, size=len(positions))
        curve = mu * (1 + amplitude * smoothstep_curve(num_steps, positions, values))
        curve = np.clip(curve, self.min_ratio * mu, self.max_ratio * mu)
        limit = self.max_step_change * mu  # smoothness: bounded change per step, applied forward
        for i in range(1, num_steps):
            curve[i] = np.clip(curve[i], curve[i - 1] - limit, curve[i - 1] + limit)
        return curve

    def reset(self, obs, info) -> None:
        self.num_steps = info["num_steps"]
        speedup = info.get("target_speedup") or float(self.rng.uniform(*self.speedup_range))
        self.speedup = speedup
        self.curve = self.sample_curve(self.num_steps, speedup)

    def __call__(self, obs) -> int:
        i = min(step_index(obs, self.num_steps), self.num_steps - 1)
        return feasible(int(seacache_reuses(float(obs["scalars"][D_INDEX]), float(self.curve[i]))), obs)
