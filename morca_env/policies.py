"""Rule schedulers from the caching literature, as policies over MorcaEnv's observations.

Every policy follows one small protocol, also met by trained agents:

    policy.reset(obs, info)      # start of an episode (info from env.reset)
    action = policy(obs)         # 0 = recompute, 1 = reuse; always feasible under obs["action_mask"]

Step index, budget and accumulated distance are read from the observation's
scalars (t = remaining / N, K / N, D_t), so the policies work on any env id.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .budget import BudgetSpec
from .calibrate import ThresholdMap
from .observation import Scalar, step_of
from .signals import seacache_reuses

step_index = step_of  # the name the rule policies have always used


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


class FixedSchedule(_FixedSchedule):
    """Plays one given schedule (search candidates, replays of searched data); the episode's K must be its reuses."""

    def __init__(self, schedule):
        self.fixed = [int(a) for a in schedule]
        if any(a not in (0, 1) for a in self.fixed):
            raise ValueError(f"schedule={schedule!r} must hold only 0 (recompute) and 1 (reuse)")

    def plan(self, spec, budget):
        if len(self.fixed) != spec.num_steps or sum(self.fixed) != budget:
            raise ValueError(f"the fixed schedule has {len(self.fixed)} steps and {sum(self.fixed)} reuses; "
                             f"this episode has {spec.num_steps} steps and K={budget}")
        forced = sorted(i for i in spec.forced if self.fixed[i])
        if forced:
            raise ValueError(f"the fixed schedule reuses on forced steps {forced}")
        return list(self.fixed)


class StaticSchedule(_FixedSchedule):
    """The best fixed schedule: for each K, the one schedule with the highest mean PSNR over training prompts.

    `schedules` maps K to a schedule found by `morca_env.search` (`scripts/fit_fixed_schedule.py`).
    A K without its own entry takes the nearest fitted K's schedule and adds the
    missing reuses (or removes the extra ones) where they keep recomputes most
    evenly spaced, so every K is served.
    """

    def __init__(self, schedules: dict, source: str = "unspecified"):
        if not schedules:
            raise ValueError("StaticSchedule needs at least one fitted schedule")
        self.schedules = {int(k): [int(a) for a in v] for k, v in schedules.items()}
        for k, v in self.schedules.items():
            if sum(v) != k:
                raise ValueError(f"the schedule stored for K={k} has {sum(v)} reuses")
        self.source = source

    @classmethod
    def from_file(cls, path) -> "StaticSchedule":
        import json
        from pathlib import Path

        data = json.loads(Path(path).read_text())
        return cls({int(k): v for k, v in data["schedules"].items()}, data.get("source", str(path)))

    @classmethod
    def packaged(cls, model: str) -> "StaticSchedule":
        from .calibrate import find_calibration_file

        path = find_calibration_file(f"{model}_fixed_schedules.json")
        if path is None:
            raise FileNotFoundError(f"no fitted fixed schedules for {model!r}; run scripts/fit_fixed_schedule.py")
        return cls.from_file(path)

    def plan(self, spec, budget):
        nearest = min(self.schedules, key=lambda k: (abs(k - budget), k))
        schedule = list(self.schedules[nearest])
        if len(schedule) != spec.num_steps:
            raise ValueError(f"fixed schedules were fitted for {len(schedule)} steps, this env has {spec.num_steps}")
        return adjust_reuses(schedule, spec, budget)


def adjust_reuses(schedule, spec: BudgetSpec, budget: int, first: int = 0) -> list[int]:
    """`schedule` with reuses added or removed (on free steps from `first` on) until it has `budget`: a schedule
    fitted at a neighbouring K, moved as little as possible and keeping the recomputes evenly spaced."""
    schedule = [int(a) for a in schedule]
    free = [i for i in range(first, spec.num_steps) if i not in spec.forced]
    if not sum(schedule[i] for i in range(spec.num_steps) if i not in free) <= budget <= sum(schedule) + sum(
            1 for i in free if not schedule[i]):
        raise ValueError(f"K = {budget} cannot be reached by changing steps {first}.. of {schedule}")
    while sum(schedule) < budget:  # turn the recompute farthest from reuses (then most crowded) into a reuse
        schedule[max((i for i in free if not schedule[i]), key=lambda i: _spacing(schedule, i))] = 1
    while sum(schedule) > budget:  # and back: the reuse farthest from recomputes (then most crowded)
        schedule[max((i for i in free if schedule[i]), key=lambda i: _spacing(schedule, i))] = 0
    return schedule


def _spacing(schedule: list[int], i: int) -> tuple[int, int, int]:
    """(distance to the nearest step of the other kind, minus the distance to the nearest of the same, -i)."""
    def nearest(value):
        left = next((i - j for j in range(i - 1, -1, -1) if schedule[j] == value), len(schedule))
        right = next((j - i for j in range(i + 1, len(schedule)) if schedule[j] == value), len(schedule))
        return min(left, right)

    return nearest(1 - schedule[i]), -nearest(schedule[i]), -i


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
        return feasible(int(seacache_reuses(float(obs["scalars"][Scalar.D_t]), float(self.curve[i]))), obs)


class GlobalSeaCache(SeaCacheThreshold):
    """SeaCache with one threshold per target speedup, g(rho) (as the paper tunes it on training prompts).

    Its K varies per video, so it runs in a budget-free env (`exact_budget = False`).
    """

    exact_budget = False

    def __init__(self, threshold_map: ThresholdMap):
        super().__init__(1.0)
        self.g = threshold_map

    def reset(self, obs, info) -> None:
        if not info.get("target_speedup"):
            raise ValueError("seacache-global needs a target speedup (reset with options={'speedup': ...})")
        self.delta = self.g(info["target_speedup"])


class SearchedSchedules(_FixedSchedule):
    """The per-prompt oracle: plays the schedule `morca_env.search` found for this (prompt, seed, K).

    Reads the `<name>.json` results of `scripts/search_schedules.py`; an episode
    without a search result is an error, never a silent fallback.
    """

    def __init__(self, directory):
        import json
        from pathlib import Path

        self.found: dict[tuple[str, int, int], list[int]] = {}
        for path in sorted(Path(directory).glob("*.json")):
            data = json.loads(path.read_text())
            if len(data.get("pairs", [])) == 1:
                (prompt, seed), = data["pairs"]
                self.found[(prompt, int(seed), int(data["budget"]))] = data["schedule"]
        if not self.found:
            raise FileNotFoundError(f"no per-prompt search results (*.json) in {directory}")

    def reset(self, obs, info) -> None:
        self.key = (info["prompt"], int(info["seed"]), int(info["budget"]))
        super().reset(obs, info)

    def plan(self, spec, budget):
        if self.key not in self.found:
            raise KeyError(f"no searched schedule for prompt {self.key[0]!r}, seed {self.key[1]}, K={self.key[2]}; "
                           "run scripts/search_schedules.py for it")
        return list(self.found[self.key])


class Jittered(_FixedSchedule):
    """A fixed schedule (uniform spacing, the best fixed schedule) moved by `moves` random swaps of nearby steps:
    behaviour data near a good schedule, so offline RL sees which small deviations pay on which prompts."""

    def __init__(self, base: _FixedSchedule, moves: int = 4, max_shift: int = 2, seed: int | None = None):
        if isinstance(moves, bool) or not isinstance(moves, int) or moves < 0:
            raise ValueError(f"moves={moves!r} must be a non-negative integer")
        if isinstance(max_shift, bool) or not isinstance(max_shift, int) or max_shift < 1:
            raise ValueError(f"max_shift={max_shift!r} must be an integer >= 1")
        self.base, self.moves, self.max_shift = base, moves, max_shift
        self.rng = np.random.default_rng(seed)

    def plan(self, spec, budget):
        from .search import SearchConfig, propose

        schedule = self.base.plan(spec, budget)
        config = SearchConfig(max_shift=self.max_shift, far_fraction=0.0)
        for _ in range(self.moves):  # each move is one near swap; a proposal that falls on its own kind is redrawn
            moved = next((m for m in (propose(schedule, spec, self.rng, config) for _ in range(100)) if m is not None),
                         None)
            schedule = moved if moved is not None else schedule  # None: K = 0 or K_max, nothing can move
        return schedule


def JitteredUniform(moves: int = 4, max_shift: int = 2, seed: int | None = None) -> Jittered:
    """Uniform spacing moved by `moves` random near swaps (the name recipes and older code use)."""
    return Jittered(UniformInterval(), moves, max_shift, seed)


class ReplaySchedules(_FixedSchedule):
    """Replays stored (prompt, seed, schedule) episodes, the i-th collected episode playing entry i (cyclically).

    The entries file (JSON list of {"prompt", "seed", "schedule"}) is what a
    searched dataset's recipe points to, e.g. `datasets/morca/tiny/searched-v0.schedules.json`.
    """

    def __init__(self, path):
        import json
        from pathlib import Path

        self.entries = json.loads(Path(path).read_text())
        if not self.entries:
            raise ValueError(f"{path} holds no schedules")
        self.entry = self.entries[0]

    def episode_options(self, index: int) -> dict:
        self.entry = self.entries[index % len(self.entries)]
        return {"prompt": self.entry["prompt"], "seed": int(self.entry["seed"]), "budget": int(sum(self.entry["schedule"]))}

    def plan(self, spec, budget):
        return FixedSchedule(self.entry["schedule"]).plan(spec, budget)


class Mixture:
    """A behaviour mixture: each episode plays one component, drawn with the given weights.

    `components` are registry specs with a weight, e.g.
    [{"name": "threshold-curve", "weight": 0.5}, {"name": "jittered-uniform", "weight": 0.25}, ...];
    the draw and each component's own randomness come from `seed` (the recipe's per-episode seed).
    """

    def __init__(self, components, env=None, seed: int | None = None):
        if not components:
            raise ValueError("a mixture needs at least one component")
        weights = np.array([float(c.get("weight", 1.0)) for c in components])
        if np.any(weights < 0) or weights.sum() <= 0:
            raise ValueError(f"mixture weights {weights.tolist()} must be >= 0 with a positive sum")
        rng = np.random.default_rng(seed)
        chosen = components[int(rng.choice(len(components), p=weights / weights.sum()))]
        options = {k: v for k, v in chosen.items() if k not in ("name", "weight")}
        if chosen["name"] in SEEDED:
            options["seed"] = int(rng.integers(2**31))
        self.name = chosen["name"]
        self.policy = make(chosen["name"], env, **options)

    def episode_options(self, index: int):
        getter = getattr(self.policy, "episode_options", None)
        return getter(index) if getter is not None else None

    def reset(self, obs, info) -> None:
        self.policy.reset(obs, info)

    def __call__(self, obs) -> int:
        return self.policy(obs)


# ------------------------------------------------------------------ the registry
def _model_of(env, name: str) -> str:
    if env is None:
        raise ValueError(f"scheduler {name!r} reads the env's packaged calibration files: pass env=")
    return env.unwrapped.preset.name


def _threshold_map(env, name, threshold_map=None):
    if threshold_map is not None:
        return threshold_map
    from .calibrate import load_threshold_map

    return load_threshold_map(_model_of(env, name))


def _library(env, path):
    """A schedule library with its selector (`morca_env.library`): the shipped one for the env, or `path`'s."""
    from .library import LibraryScheduler

    if env is None:
        raise ValueError("scheduler 'library' reads the run from the env: make('library', env=env)")
    return LibraryScheduler.from_file(path, env) if path is not None else LibraryScheduler.packaged(env)


def checkpoint_paths(path) -> list[str]:
    """A checkpoint, a list of them, or a comma-separated string of them (an ensemble, e.g. one per training seed)."""
    parts = [str(p) for p in ([path] if isinstance(path, (str, Path)) else path)]
    paths = [p.strip() for part in parts for p in part.split(",")]  # "a.d3, b.d3" names b.d3, not " b.d3"
    if not paths or any(not p for p in paths):
        raise ValueError(f"checkpoint path(s) {path!r}: give one path, or several separated by commas")
    return paths


def _learned(kind: str):
    def build(env=None, path=None, **kwargs):
        if path is None:
            raise ValueError(f"scheduler {kind!r} needs a checkpoint: make({kind!r}, path=...)")
        if kind == "reinforce":
            from agents.reinforce import ReinforcePolicy

            return ReinforcePolicy.load(path, **kwargs)
        from agents import MorcaEnsemble, MorcaPolicy

        paths = checkpoint_paths(path)
        return MorcaPolicy.load(paths[0], **kwargs) if len(paths) == 1 else MorcaEnsemble.load(paths, **kwargs)

    return build


def _rule(module: str, form: str):
    """A rule of `morca_env.rules.<module>` in one of its three forms (native, global, exact)."""
    def build(env=None, **kwargs):
        from importlib import import_module

        return import_module(f"morca_env.rules.{module}").build(form, env, **kwargs)

    return build


SCHEDULERS = {
    "uniform": lambda env=None: UniformInterval(),
    "random": lambda env=None, seed=None: RandomFeasible(seed=seed),
    "fixed": lambda env=None, schedule=None: FixedSchedule(schedule),
    "best-fixed": lambda env=None, path=None: (StaticSchedule.from_file(path) if path is not None
                                               else StaticSchedule.packaged(_model_of(env, "best-fixed"))),
    "searched": lambda env=None, path=None: SearchedSchedules(path),
    "library": lambda env=None, path=None: _library(env, path),
    "seacache": lambda env=None, delta=None: SeaCacheThreshold(delta),
    "seacache-global": lambda env=None, threshold_map=None: GlobalSeaCache(_threshold_map(env, "seacache-global",
                                                                                        threshold_map)),
    "seacache-exact": lambda env=None, iterations=12: SeaCacheExactBudget(env, iterations),
    "threshold-curve": lambda env=None, threshold_map=None, **options: ThresholdCurve(
        _threshold_map(env, "threshold-curve", threshold_map),
        **{k: tuple(v) if k in ("speedup_range", "amplitude", "num_references") else v for k, v in options.items()}),
    "jittered-uniform": lambda env=None, **options: JitteredUniform(**options),
    "jittered-best-fixed": lambda env=None, path=None, **options: Jittered(SCHEDULERS["best-fixed"](env, path), **options),
    "replay": lambda env=None, path=None: ReplaySchedules(path),
    "mixture": lambda env=None, components=(), seed=None: Mixture(components, env, seed),
    "morca": _learned("morca"),
    "reinforce": _learned("reinforce"),
}
def _rule_modules() -> list[str]:
    """The cache rules of `morca_env.rules`: every module but the shared `forms` and `runtime` (listed, not imported),
    so adding a rule touches its module and its test only."""
    import pkgutil

    from . import rules

    return sorted(m.name for m in pkgutil.iter_modules(rules.__path__) if m.name not in ("forms", "runtime"))


def rule_names() -> list[str]:
    """The cache rules' native-form registry names (module `first_block_cache`: "first-block-cache")."""
    return [module.replace("_", "-") for module in _rule_modules()]


for _module in _rule_modules():  # "<rule>", "<rule>-global", "<rule>-exact" (first_block_cache: first-block-cache)
    for _form, _suffix in (("native", ""), ("global", "-global"), ("exact", "-exact")):
        SCHEDULERS[_module.replace("_", "-") + _suffix] = _rule(_module, _form)
del _module, _form, _suffix

ALIASES = {"behaviour": "threshold-curve", "behavior": "threshold-curve", "static": "best-fixed"}
SEEDED = ("random", "threshold-curve", "behaviour", "behavior", "jittered-uniform", "jittered-best-fixed", "mixture")  # names whose constructors take a seed


def make(name: str, env=None, **kwargs):
    """A scheduler by name (`SCHEDULERS`): the names collection recipes, `scripts/evaluate.py`,
    `accelerate` users and the quickstart share. `env` is needed by schedulers that read the env's
    packaged files (threshold maps, fitted schedules) or replay on its pipeline (seacache-exact)."""
    key = ALIASES.get(name, name)
    if key not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {name!r}; valid: {', '.join(sorted(SCHEDULERS) + sorted(ALIASES))}")
    try:
        return SCHEDULERS[key](env=env, **kwargs)
    except TypeError as error:
        raise TypeError(f"scheduler {name!r}: {error}") from None


def needs_exact_budget(policy) -> bool:
    """False for rules that run on their own K (e.g. SeaCache with a global threshold): a budget-free env."""
    return getattr(policy, "exact_budget", True)
