"""Fixed schedules: each episode's whole schedule is known at reset (uniform, given, best fixed, random, searched,
jittered, replayed). They read nothing of the run, so they are the references every learned scheduler is held to:
the best fixed schedule is the bar (`morca_env.evaluation.benchmark`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..speedup.files import find_calibration_file
from ..utils.io import read_json
from .base import PrecomputedSchedule
from .registry import register
from .schedule import Moves, adjust_reuses, propose


@register("uniform")
class UniformInterval(PrecomputedSchedule):
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


@register("fixed")
class FixedSchedule(PrecomputedSchedule):
    """Plays one given schedule (search candidates, replays of searched data); the episode's K must be its reuses."""

    def __init__(self, schedule=None):
        if schedule is None:
            raise ValueError("scheduler 'fixed' needs a schedule: make('fixed', schedule=[0, 1, ...])")
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


class StaticSchedule(PrecomputedSchedule):
    """The best fixed schedule: for each K, the one schedule with the highest mean PSNR over training prompts.

    `schedules` maps K to a schedule found by `morca_env.evaluation.search` (`morca fit-fixed`).
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
        data = read_json(path, "fixed schedules file")
        try:
            return cls({int(k): v for k, v in data["schedules"].items()}, data.get("source", str(path)))
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ValueError(f"fixed schedules file {path} is not one ({type(error).__name__}: {error}); it needs "
                             "{\"schedules\": {\"<K>\": [0 or 1 per step], ...}} (morca fit-fixed writes it)") from None

    @classmethod
    def packaged(cls, model: str) -> "StaticSchedule":
        path = find_calibration_file(f"{model}_fixed_schedules.json")
        if path is None:
            raise FileNotFoundError(f"no fitted fixed schedules for {model!r}; run morca fit-fixed --env <its env id>")
        return cls.from_file(path)

    @classmethod
    def for_env(cls, env=None, path=None) -> "StaticSchedule":
        """`path`'s schedules, else the ones fitted for `env`'s model (a user file first, then the packaged one)."""
        if path is not None:
            return cls.from_file(path)
        return cls.packaged(model_of(env, "best-fixed"))

    def plan(self, spec, budget):
        nearest = min(self.schedules, key=lambda k: (abs(k - budget), k))
        schedule = list(self.schedules[nearest])
        if len(schedule) != spec.num_steps:
            raise ValueError(f"fixed schedules were fitted for {len(schedule)} steps, this env has {spec.num_steps}")
        return adjust_reuses(schedule, spec, budget)


register("best-fixed", aliases=("static",), needs_env=True)(StaticSchedule.for_env)


def model_of(env, name: str) -> str:
    """The registered model of `env`, for schedulers that read its packaged files (a clear error without one)."""
    if env is None:
        raise ValueError(f"scheduler {name!r} reads the env's packaged calibration files: pass env=")
    return env.unwrapped.preset.name


@register("random", seeded=True)
class RandomFeasible(PrecomputedSchedule):
    """A schedule drawn uniformly among those with exactly K reuses on free steps."""

    def __init__(self, seed: int | None = None):
        self.rng = np.random.default_rng(seed)

    def plan(self, spec, budget):
        free = [i for i in range(spec.num_steps) if i not in spec.forced]
        schedule = [0] * spec.num_steps
        for i in self.rng.choice(free, size=budget, replace=False):
            schedule[int(i)] = 1
        return schedule


@register("searched")
class SearchedSchedules(PrecomputedSchedule):
    """The per-prompt oracle: plays the schedule `morca_env.evaluation.search` found for this (prompt, seed, K).

    Reads the `<name>.json` results of `morca search` in `path`; an episode
    without a search result is an error, never a silent fallback.
    """

    def __init__(self, path=None):
        if path is None:
            raise ValueError("scheduler 'searched' needs the search results' directory: make('searched', path=...)")
        self.found: dict[tuple[str, int, int], list[int]] = {}
        for file in sorted(Path(path).glob("*.json")):
            data = read_json(file, "search result")
            if isinstance(data, dict) and len(data.get("pairs", [])) == 1:
                (prompt, seed), = data["pairs"]
                self.found[(prompt, int(seed), int(data["budget"]))] = data["schedule"]
        if not self.found:
            raise FileNotFoundError(f"no per-prompt search results (*.json) in {path}")

    def reset(self, obs, info) -> None:
        self.key = (info["prompt"], int(info["seed"]), int(info["budget"]))
        super().reset(obs, info)

    def plan(self, spec, budget):
        if self.key not in self.found:
            raise KeyError(f"no searched schedule for prompt {self.key[0]!r}, seed {self.key[1]}, K={self.key[2]}; "
                           "run morca search for it")
        return list(self.found[self.key])


class Jittered(PrecomputedSchedule):
    """A fixed schedule (uniform spacing, the best fixed schedule) moved by `moves` random swaps of nearby steps:
    behaviour data near a good schedule, so offline RL sees which small deviations pay on which prompts."""

    def __init__(self, base: PrecomputedSchedule, moves: int = 4, max_shift: int = 2, seed: int | None = None):
        if isinstance(moves, bool) or not isinstance(moves, int) or moves < 0:
            raise ValueError(f"moves={moves!r} must be a non-negative integer")
        if isinstance(max_shift, bool) or not isinstance(max_shift, int) or max_shift < 1:
            raise ValueError(f"max_shift={max_shift!r} must be an integer >= 1")
        self.base, self.moves, self.max_shift = base, moves, max_shift
        self.rng = np.random.default_rng(seed)

    def plan(self, spec, budget):
        schedule = self.base.plan(spec, budget)
        near = Moves(max_shift=self.max_shift)
        for _ in range(self.moves):  # each move is one near swap; a proposal that falls on its own kind is redrawn
            moved = next((m for m in (propose(schedule, spec, self.rng, near) for _ in range(100)) if m is not None),
                         None)
            schedule = moved if moved is not None else schedule  # None: K = 0 or K_max, nothing can move
        return schedule


@register("jittered-uniform", seeded=True)
def JitteredUniform(moves: int = 4, max_shift: int = 2, seed: int | None = None) -> Jittered:
    """Uniform spacing moved by `moves` random near swaps (the name recipes and older code use)."""
    return Jittered(UniformInterval(), moves, max_shift, seed)


@register("jittered-best-fixed", seeded=True, needs_env=True)
def jittered_best_fixed(env=None, path=None, moves: int = 4, max_shift: int = 2, seed: int | None = None) -> Jittered:
    """The best fixed schedule moved by `moves` random near swaps."""
    return Jittered(StaticSchedule.for_env(env, path), moves, max_shift, seed)


@register("replay")
class ReplaySchedules(PrecomputedSchedule):
    """Replays stored (prompt, seed, schedule) episodes, the i-th collected episode playing entry i (cyclically).

    The entries file `path` (JSON list of {"prompt", "seed", "schedule"}) is what a
    searched dataset's recipe points to (`morca export-searched` writes one).
    """

    def __init__(self, path=None):
        if path is None:
            raise ValueError("scheduler 'replay' needs an entries file: make('replay', path=...)")
        self.entries = read_json(path, "replay entries file")
        if not isinstance(self.entries, list) or not self.entries:
            raise ValueError(f"replay entries file {path} holds no schedules (a JSON list of "
                             "{\"prompt\", \"seed\", \"schedule\"} is expected)")
        for index, entry in enumerate(self.entries):
            schedule = entry.get("schedule") if isinstance(entry, dict) else None
            if (not isinstance(entry, dict) or not isinstance(entry.get("prompt"), str)
                    or isinstance(entry.get("seed"), bool) or not isinstance(entry.get("seed"), int)
                    or not isinstance(schedule, list) or any(a not in (0, 1) or isinstance(a, bool) for a in schedule)):
                raise ValueError(f"replay entries file {path}, entry {index}: {entry!r} must be {{\"prompt\": <text>, "
                                 "\"seed\": <integer>, \"schedule\": [0 or 1 per step]}")
        self.entry = self.entries[0]

    def episode_options(self, index: int) -> dict:
        self.entry = self.entries[index % len(self.entries)]
        return {"prompt": self.entry["prompt"], "seed": int(self.entry["seed"]), "budget": int(sum(self.entry["schedule"]))}

    def plan(self, spec, budget):
        return FixedSchedule(self.entry["schedule"]).plan(spec, budget)
