"""A schedule library and a selector that picks one member per run after watching its first steps.

Why: a schedule searched for one (prompt, seed) is worth +1.7 dB over the best fixed schedule on that run and
nothing on the same prompt under another seed (docs/results/scheduler_tiny.md), yet the best of a few
schedules searched for *other* runs reaches +1.2 dB: the per-run optimum lies in a few schedule families. So a
scheduler can play a shared prefix (the best fixed schedule's first steps), read the run's state there, and
switch to the library member it predicts best. Every member shares the prefix (searched with
`SearchConfig.frozen_prefix`), so the switch is free and the whole run still spends exactly K.

Here: greedy library selection from a reward matrix, the run's features at the switch step, playing a set
of schedules on many runs in worker processes (resumable through the evaluation log), and a ridge selector.
Measured on MorcaTiny at K = 35 (docs/results/scheduler_tiny.md): a perfect choice among 5 members is worth
+0.8 dB over the best fixed schedule, the ridge selectors learned from 200 or 781 runs nothing, so no
library is shipped; the tools stay for other models, features and data sizes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from morca_env.budget import BudgetSpec
from morca_env.speedup.files import find_calibration_file
from morca_env.schedulers import register
from morca_env.schedulers.base import feasible, step_index
from morca_env.schedulers.fixed import StaticSchedule
from morca_env.schedulers.schedule import adjust_reuses, schedule_key
from morca_env.evaluation.search import EvaluationLog, Pair, SchedulePlayer
from morca_env.parallel.workers import map_on_envs


# ------------------------------------------------------------------ the library
def greedy_library(rewards: dict[str, Sequence[float]], size: int, first: str,
                   own: dict[str, int] | None = None) -> list[str]:
    """Members chosen one at a time to raise the mean over runs of the best member's reward (a coverage
    objective, so each new member is the one that wins most where the others are weak).

    `rewards[name][b]`: reward of schedule `name` on run b; `first` starts the library (the default choice);
    `own[name] = b` (or a list of runs) leaves a schedule out of run b's maximum (a schedule searched for run b
    would otherwise cover it with its own, overfitted, value)."""
    if first not in rewards:
        raise ValueError(f"first member {first!r} is not among the schedules {sorted(rewards)}")
    if size < 1:
        raise ValueError(f"library size {size} must be >= 1")
    own = own or {}
    names = list(rewards)
    grid = np.array([rewards[n] for n in names], dtype=float)
    for row, name in enumerate(names):
        if name in own:
            grid[row, np.atleast_1d(own[name])] = -np.inf
    chosen = [names.index(first)]
    while len(chosen) < min(size, len(names)):
        best = grid[chosen].max(axis=0)
        gains = [np.maximum(best, grid[r]).mean() if r not in chosen else -np.inf for r in range(len(names))]
        if max(gains) <= best.mean():
            break  # no schedule left wins anywhere: a smaller library
        chosen.append(int(np.argmax(gains)))
    return [names[r] for r in chosen]


# ------------------------------------------------------------------ what the run shows at the switch step
FEATURE_NAMES = (
    [f"x0 mean c{c}" for c in range(3)] + [f"x0 std c{c}" for c in range(3)]
    + [f"x0 temporal std c{c}" for c in range(3)]
    + ["x0 frame change", "x0 spatial gradient", "x0 saturated", "x0 moved since step 0", "velocity norm",
       "x0 step-0 temporal std", "x0 step-0 frame change"])


def _summary(x0: torch.Tensor, x0_first: torch.Tensor, velocity: torch.Tensor) -> np.ndarray:
    x = x0.float()  # (C, F, H, W)
    channels = x.shape[0]
    per_channel = x.reshape(channels, -1)
    temporal_std = x.std(dim=1).reshape(channels, -1).mean(dim=1)
    frame_change = (x[:, 1:] - x[:, :-1]).abs().mean() if x.shape[1] > 1 else x.new_zeros(())
    gradient = (x[..., 1:] - x[..., :-1]).abs().mean() + (x[..., 1:, :] - x[..., :-1, :]).abs().mean()
    first = x0_first.float()
    first_change = (first[:, 1:] - first[:, :-1]).abs().mean() if first.shape[1] > 1 else first.new_zeros(())
    values = [*per_channel.mean(dim=1)[:3], *per_channel.std(dim=1)[:3], *temporal_std[:3], frame_change, gradient,
              (x.abs() > 1).float().mean(), (x - first).norm() / first.norm().clamp_min(1e-8),
              velocity.float().norm() / velocity.numel() ** 0.5, first.std(dim=1).mean(), first_change]
    return np.array([float(v) for v in values], dtype=np.float64)


class SwitchReader:
    """What a selector reads at the switch step, gathered while the prefix plays: the predicted clean video
    x0 = x_t - sigma_t v_t (flow matching) at the prefix's first and last compute steps.

    `add(latents, sigma, velocity)` after each compute step with the latents it started from; `read()` ->
    {"summary": FEATURE_NAMES values, "pooled": the last x0 average-pooled to the latent-feature grid}."""

    def __init__(self):
        self.first = self.last = self.velocity = None

    def add(self, latents: torch.Tensor, sigma: float, velocity: torch.Tensor) -> None:
        with torch.no_grad():
            self.last, self.velocity = (latents - sigma * velocity)[0], velocity
        self.first = self.last if self.first is None else self.first

    def read(self) -> dict[str, np.ndarray]:
        from morca_env.diffusion.features import latent_features

        if self.last is None:
            raise ValueError("the prefix has no compute step: nothing to read")
        return {"summary": _summary(self.last, self.first, self.velocity),
                "pooled": latent_features(self.last).pooled.flatten().cpu().numpy().astype(np.float64)}


FEATURE_KINDS = ("summary", "pooled", "both")


def feature_vector(features: dict[str, np.ndarray], kind: str) -> np.ndarray:
    """The selector's input of one kind from `SwitchReader.read()` (or those stacked over runs): the one place
    that says what "both" is, so a saved selector reads what it was trained on."""
    if kind not in FEATURE_KINDS:
        raise ValueError(f"feature kind {kind!r} is not one of {FEATURE_KINDS}")
    if kind == "both":
        return np.concatenate([features["summary"], features["pooled"]], axis=-1)
    return features[kind]


def switch_features(denoiser, prefix: Sequence[int], prompt: str, seed: int) -> dict[str, np.ndarray]:
    """Play `prefix` from the start of (prompt, seed) and read the run at the switch step (`SwitchReader`)."""
    denoiser.start(prompt=prompt, seed=int(seed))
    reader = SwitchReader()
    with torch.no_grad():
        for i, action in enumerate(prefix):
            latents = denoiser.latents
            denoiser.step(reuse=bool(action))
            if not action:
                reader.add(latents, denoiser.sigma(i), denoiser.last_velocity)
    return reader.read()


def no_cache_profile(denoiser, prompt: str, seed: int) -> np.ndarray:
    """Not causal, an upper bound's features: over the whole run without reuse, the relative change of the
    model output and of the predicted clean video at every step (2 (N - 1) values): where this run's
    trajectory moves fast, which a reuse error depends on, known in advance."""
    denoiser.start(prompt=prompt, seed=int(seed))
    velocities, predictions = [], []
    with torch.no_grad():
        for i in range(denoiser.num_steps):
            latents = denoiser.latents
            denoiser.step(reuse=False)
            velocities.append(denoiser.last_velocity)
            predictions.append(latents - denoiser.sigma(i) * denoiser.last_velocity)
        scale = predictions[-1].norm().clamp_min(1e-8)
        return np.array([float((b - a).norm() / a.norm().clamp_min(1e-8)) for a, b in zip(velocities, velocities[1:])]
                        + [float((b - a).norm() / scale) for a, b in zip(predictions, predictions[1:])])


# ------------------------------------------------------------------ schedules on many runs, in workers
def _play_job(env, job) -> tuple[int, list[float], dict[str, np.ndarray]]:
    index, (prompt, seed), schedules, prefix, profile, log_path = job
    log = EvaluationLog(log_path)
    player = None
    rewards = []
    try:
        for schedule in schedules:
            key = schedule_key(schedule)
            reward = log.get(prompt, seed, key)
            if reward is None:
                player = player or SchedulePlayer(env, prompt, seed)
                reward, psnr = player.play(schedule)
                log.add(prompt, seed, key, reward, psnr)
            rewards.append(reward)
        features = {}
        if prefix or profile:
            denoiser = env.unwrapped.side_run()
            try:
                if prefix:
                    features.update(switch_features(denoiser, prefix, prompt, seed))
                if profile:
                    features["profile"] = no_cache_profile(denoiser, prompt, seed)
            finally:
                denoiser.close()
    finally:
        if player is not None:
            player.close()
    return index, rewards, features


def play_on_runs(env_id: str, env_kwargs: dict, schedules: dict[str, Sequence[int]], pairs: Sequence[Pair],
                 log_path: str | Path, prefix: Sequence[int] = (), profile: bool = False, workers: int = 1,
                 threads: int = 1, desc: str = "runs") -> tuple[dict[str, list[float]], dict[str, np.ndarray]]:
    """Every schedule's reward on every run (resumable: episodes in `log_path` are read, not replayed) and,
    with a `prefix`, each run's switch features, with `profile` its `no_cache_profile`. -> ({name: [reward per
    run]}, {"summary": (runs, n), "pooled": (runs, m), "profile": (runs, 2 (N - 1))})."""
    from tqdm import tqdm


    names = list(schedules)
    lists = [[int(a) for a in schedules[n]] for n in names]
    kwargs = {"lpips": False, "latent_features": False, **env_kwargs}
    jobs = [(b, (str(p), int(s)), lists, list(prefix), bool(profile), str(log_path)) for b, (p, s) in enumerate(pairs)]
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    results: dict[int, tuple] = {}
    bar = tqdm(total=len(jobs), desc=desc, unit="run")
    for index, rewards, features in map_on_envs(_play_job, jobs, env_id, kwargs, workers, threads):
        results[index] = (rewards, features)
        bar.update()
    bar.close()
    rewards = {n: [results[b][0][k] for b in range(len(jobs))] for k, n in enumerate(names)}
    features = {key: np.stack([results[b][1][key] for b in range(len(jobs))]) for key in (results[0][1] if jobs else {})}
    return rewards, features


# ------------------------------------------------------------------ the selector
class RidgeSelector:
    """Predicts each member's reward gain over member 0 (the default) from standardized features with one
    ridge regression per member, and picks the member with the largest predicted gain (member 0 when none is
    predicted above `margin` dB)."""

    def __init__(self, alpha: float = 10.0, margin: float = 0.0):
        self.alpha, self.margin = float(alpha), float(margin)

    def fit(self, features: np.ndarray, rewards: np.ndarray) -> "RidgeSelector":
        """features (runs, n); rewards (runs, members), column 0 the default member."""
        x = np.asarray(features, dtype=float)
        gains = np.asarray(rewards, dtype=float)[:, 1:] - np.asarray(rewards, dtype=float)[:, :1]
        self.mean, self.scale = x.mean(axis=0), x.std(axis=0) + 1e-8
        z = (x - self.mean) / self.scale
        self.bias = gains.mean(axis=0)
        a = z.T @ z + self.alpha * len(z) * np.eye(z.shape[1])
        self.weights = np.linalg.solve(a, z.T @ (gains - self.bias))
        return self

    def to_dict(self) -> dict:
        return {"alpha": self.alpha, "margin": self.margin, "mean": self.mean.tolist(), "scale": self.scale.tolist(),
                "bias": self.bias.tolist(), "weights": self.weights.tolist()}

    @classmethod
    def from_dict(cls, data: dict) -> "RidgeSelector":
        selector = cls(data["alpha"], data["margin"])
        for key in ("mean", "scale", "bias", "weights"):
            setattr(selector, key, np.asarray(data[key], dtype=float))
        return selector

    def predicted_gains(self, features: np.ndarray) -> np.ndarray:
        z = (np.asarray(features, dtype=float) - self.mean) / self.scale
        return z @ self.weights + self.bias

    def choose(self, features: np.ndarray) -> np.ndarray:
        """-> the chosen member per run (0 .. members - 1)."""
        predicted = self.predicted_gains(features)
        best = predicted.argmax(axis=1)
        return np.where(predicted.max(axis=1) > self.margin, best + 1, 0)


def realised(rewards: np.ndarray, choice: np.ndarray) -> np.ndarray:
    """The reward each run gets from the member chosen for it."""
    return np.asarray(rewards)[np.arange(len(choice)), choice]


def cross_validated_choice(features: np.ndarray, rewards: np.ndarray, alpha: float, folds: int = 5,
                           seed: int = 0, margin: float = 0.0) -> np.ndarray:
    """Each run's choice by a selector fitted on the other folds (choosing alpha without a held-apart set)."""
    order = np.random.default_rng(seed).permutation(len(features))
    choice = np.zeros(len(features), dtype=int)
    for fold in np.array_split(order, folds):
        train = np.setdiff1d(order, fold)
        selector = RidgeSelector(alpha, margin).fit(features[train], rewards[train])
        choice[fold] = selector.choose(features[fold])
    return choice


def fit_by_cv(features: np.ndarray, rewards: np.ndarray, alphas: Sequence[float], folds: int = 5
              ) -> tuple[float, np.ndarray, RidgeSelector]:
    """The ridge selector whose alpha gives the highest mean reward under `folds`-fold cross-validation on
    these runs only, fitted on all of them. -> (alpha, each run's cross-validated gain over member 0, selector)."""
    rewards = np.asarray(rewards, dtype=float)
    gains = {a: realised(rewards, cross_validated_choice(features, rewards, a, folds)) - rewards[:, 0] for a in alphas}
    alpha = max(gains, key=lambda a: gains[a].mean())
    return alpha, gains[alpha], RidgeSelector(alpha).fit(features, rewards)


# ------------------------------------------------------------------ the scheduler
class LibraryScheduler:
    """Plays the library's shared prefix, reads the run at the switch step (`SwitchReader`: the env's own
    latents and velocities, no extra model call) and plays the member the selector predicts best for it.

    `libraries` maps K to {"prefix": int, "members": [schedule, ...], "feature": "summary" | "pooled" | "both",
    "selector": RidgeSelector.to_dict()}; member 0 is the default (the best fixed schedule). A K without a
    library takes the library of a K at most `reach` away with its members' reuses added or removed after the
    prefix (`schedulers.schedule.adjust_reuses`); farther, it plays `fallback` (the best fixed schedule), so every K is
    served. The choice per episode is kept
    in `last_choice` (None at a K without a library), what it read in `last_features`.
    """

    def __init__(self, env, libraries: dict, fallback=None, source: str = "unspecified", reach: int = 1):
        self.env = env.unwrapped
        self.reach = int(reach)
        self.libraries = {int(k): dict(v) for k, v in libraries.items()}
        for k, library in self.libraries.items():
            bad = [m for m in library["members"] if sum(m) != k or m[:library["prefix"]] != library["members"][0][:library["prefix"]]]
            if bad:
                raise ValueError(f"the library for K={k} has members with another K or prefix: {bad[0]}")
            library["selector"] = RidgeSelector.from_dict(library["selector"])
        self._fallback = fallback
        self.source = source
        self.last_choice: int | None = None

    @property
    def fallback(self):
        """The best fixed schedule, loaded when a K first needs it (an env without one can still use the library)."""
        if self._fallback is None:
            self._fallback = StaticSchedule.packaged(self.env.preset.name)
        return self._fallback

    @classmethod
    def from_file(cls, path, env, fallback=None) -> "LibraryScheduler":
        import json

        data = json.loads(Path(path).read_text())
        return cls(env, data["libraries"], fallback, data.get("source", str(path)))

    @classmethod
    def packaged(cls, env) -> "LibraryScheduler":
        name = env.unwrapped.preset.name
        path = find_calibration_file(f"{name}_library.json")
        if path is None:
            raise FileNotFoundError(f"no schedule library for {name!r}; run research/headroom/headroom_selector.py --save")
        return cls.from_file(path, env)

    def reset(self, obs, info) -> None:
        self.num_steps = info["num_steps"]
        budget = int(info["budget"])
        self.last_choice = None
        nearest = min(self.libraries, key=lambda k: (abs(k - budget), k), default=None)
        if nearest is None or abs(nearest - budget) > self.reach:
            self.library = None
            self.fallback.reset(obs, info)
            return
        self.library = dict(self.libraries[nearest])
        spec = BudgetSpec(self.num_steps, frozenset(info["forced_steps"]))
        if len(self.library["members"][0]) != spec.num_steps:
            raise ValueError(f"the library has {len(self.library['members'][0])}-step schedules, the env "
                             f"{spec.num_steps} steps")
        if nearest != budget:  # a neighbouring K's members, reuses added or removed after the shared prefix
            self.library["members"] = [adjust_reuses(m, spec, budget, first=self.library["prefix"])
                                       for m in self.library["members"]]
        self.schedule = list(self.library["members"][0])
        self.reader, self._latents = SwitchReader(), None

    def __call__(self, obs) -> int:
        if self.library is None:
            return self.fallback(obs)
        i = step_index(obs, self.num_steps)
        prefix = self.library["prefix"]
        denoiser = self.env.denoiser
        if 0 < i <= prefix and not self.schedule[i - 1]:  # step i - 1 computed: its velocity is the env's last
            self.reader.add(self._latents, denoiser.sigma(i - 1), denoiser.last_velocity)
        self._latents = denoiser.latents
        if i == prefix:
            x = feature_vector(self.reader.read(), self.library["feature"])
            self.last_features = x
            self.last_choice = int(self.library["selector"].choose(x[None])[0])
            self.schedule = list(self.library["members"][self.last_choice])
        return feasible(self.schedule[i], obs)


@register("library", needs_env=True)
def library(env=None, path=None) -> LibraryScheduler:
    """A schedule library with its selector: the shipped one for the env, or `path`'s."""
    if env is None:
        raise ValueError("scheduler 'library' reads the run from the env: make('library', env=env)")
    return LibraryScheduler.from_file(path, env) if path is not None else LibraryScheduler.packaged(env)
