"""Schedule search: the best exact-K schedule for one prompt or for a set of prompts, with the env as simulator.

The method is first-improvement hill climbing with swap moves. Why this one:
an exact-K schedule is a K-subset of the free (non-forced) steps, and a swap
(one reuse moves to a recompute step) keeps K, so every candidate is feasible
and costs one episode. Moving one reuse by a step or two changes the PSNR
little, so most proposals shift an element of the sparser set (the reuses at
low K, the recomputes at high K) to a neighbouring slot, and a quarter are
far swaps to leave local optima. Greedy or beam construction would need
O(K x N) episodes before it had one complete schedule (~2000 at K = 40);
hill climbing has a complete, improving schedule after every episode, so any
evaluation budget gives an answer. It starts from uniform spacing, a strong
schedule, so the result is never worse than uniform.

Every evaluated schedule is appended to a JSON-lines log with its reward per
(prompt, seed), and a search whose log exists replays it: the proposals come
from a seeded RNG, so a resumed search retraces the same path through the log
at no cost and continues where it stopped. `search_many` runs independent
searches in worker processes (one env each, one torch thread each).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..budget import BudgetSpec
from ..parallel.executors import WorkerFailed
from ..utils.io import atomic_write_text, exclusive_lock, read_json_lines, repair_json_lines, writable_directory
from ..schedulers.schedule import propose, schedule_key
from ..parallel.workers import map_on_envs

log = logging.getLogger(__name__)

Pair = tuple[str, int]  # (prompt, generation seed)


@dataclass(frozen=True)
class SearchConfig:
    """Settings of one hill-climbing search.

    Args:
        evaluations: distinct schedules evaluated (the start counts); each costs one episode per prompt.
        max_shift: a near move shifts one element by 1 .. max_shift free steps.
        far_fraction: share of proposals that swap a random reuse with a random recompute step.
        seed: seed of the proposal RNG (the same seed retraces the same search).
        frozen_prefix: the first this many steps are never moved (they keep the start schedule's actions): a
            scheduler that picks a schedule after watching those steps of the run needs its choices to share them.
    """

    evaluations: int = 150
    max_shift: int = 3
    far_fraction: float = 0.25
    seed: int = 0
    frozen_prefix: int = 0

    def __post_init__(self):
        if isinstance(self.evaluations, bool) or not isinstance(self.evaluations, int) or self.evaluations < 1:
            raise ValueError(f"evaluations={self.evaluations!r} must be a positive integer")
        if isinstance(self.max_shift, bool) or not isinstance(self.max_shift, int) or self.max_shift < 1:
            raise ValueError(f"max_shift={self.max_shift!r} must be a positive integer")
        if not 0.0 <= self.far_fraction <= 1.0:
            raise ValueError(f"far_fraction={self.far_fraction!r} must be in [0, 1]")
        if isinstance(self.frozen_prefix, bool) or not isinstance(self.frozen_prefix, int) or self.frozen_prefix < 0:
            raise ValueError(f"frozen_prefix={self.frozen_prefix!r} must be a non-negative integer")


@dataclass
class SearchResult:
    schedule: list[int]
    value: float  # mean reward over the search's (prompt, seed) pairs
    start_value: float  # the uniform schedule's
    budget: int
    pairs: list[Pair]
    evaluations: int
    history: list[float] = field(default_factory=list)  # best value after each evaluation

    def to_dict(self) -> dict:
        return asdict(self)


class EvaluationLog:
    """Append-only JSON lines {prompt, seed, schedule, reward, psnr}; a torn last line (crash) is ignored."""

    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path is not None else None
        self.values: dict[tuple[str, int, str], float] = {}
        if self.path is not None:
            repair_json_lines(self.path)  # the next row starts a line of its own
            for row in read_json_lines(self.path, required=("prompt", "seed", "schedule", "reward")):
                self.values[(row["prompt"], int(row["seed"]), row["schedule"])] = float(row["reward"])

    def get(self, prompt: str, seed: int, key: str) -> float | None:
        return self.values.get((prompt, int(seed), key))

    def add(self, prompt: str, seed: int, key: str, reward: float, psnr: float) -> None:
        self.values[(prompt, int(seed), key)] = float(reward)
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"prompt": prompt, "seed": int(seed), "schedule": key, "reward": float(reward),
                           "psnr": float(psnr)})
        with open(self.path, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())


def play_schedule(env, schedule: Sequence[int], prompt: str, seed: int):
    """The trajectory of one fixed schedule for (prompt, seed), in an exact-budget env."""
    from ..schedulers.fixed import FixedSchedule
    from ..rollout import rollout

    trajectory = rollout(env, FixedSchedule(schedule), {"prompt": prompt, "seed": int(seed), "budget": int(sum(schedule))})
    if trajectory.schedule != [int(a) for a in schedule]:
        raise RuntimeError("the env changed a fixed schedule (projected actions): its forced steps differ")
    return trajectory


class SchedulePlayer:
    """The env's terminal reward of fixed schedules for one (prompt, seed), fast.

    It runs the env's own pipeline, denoiser, reference and reward (`play_schedule`
    gives the same numbers; a test checks equality), but skips the
    observation (a fixed schedule reads none: ~20% of an episode on MorcaTiny) and
    resumes each schedule from the denoiser state after the longest prefix it
    shares with the best schedule played so far (a swap changes nothing before its
    first step: about half the steps of a search's episodes are not re-run).
    Memory: one denoiser snapshot per step of two schedules.
    """

    def __init__(self, env, prompt: str, seed: int):
        self.env = env.unwrapped
        self.prompt, self.seed = prompt, int(seed)
        self.denoiser = self.env.side_run()
        self._anchor: tuple[list[int], list, float] | None = None  # (schedule, snapshots before each step, reward)
        self._reference = None

    def close(self) -> None:
        self.denoiser.close()

    def play(self, schedule: Sequence[int]) -> tuple[float, float]:
        """-> (reward, psnr) of `schedule` (exactly what the env's episode would end with)."""
        from ..diffusion.metrics import to_uint8, video_metrics

        schedule = [int(a) for a in schedule]
        env = self.env
        if len(schedule) != env.num_steps:
            raise ValueError(f"schedule has {len(schedule)} steps, the env {env.num_steps}")
        forced = sorted(i for i in env.budget_spec.forced if schedule[i])
        if forced:
            raise ValueError(f"the schedule reuses on forced steps {forced}")
        if self._reference is None:  # the reference exactly as the env's episodes get it (once per player)
            env.reset(options={"prompt": self.prompt, "seed": self.seed, "budget": 0})
            self._reference = env.reference_video
        reference = self._reference
        den = self.denoiser
        if self._anchor is None:
            den.start(prompt=self.prompt, seed=self.seed)
            shared, snapshots = 0, []
        else:
            anchor, anchor_snapshots, _ = self._anchor
            shared = next((i for i, (a, b) in enumerate(zip(schedule, anchor)) if a != b), env.num_steps - 1)
            snapshots = anchor_snapshots[:shared + 1]
            den.restore(snapshots[shared])
            snapshots = snapshots[:shared]
        for i in range(shared, env.num_steps):
            snapshots.append(den.snapshot())
            den.step(reuse=bool(schedule[i]))
        psnr = float(video_metrics(to_uint8(den.decode()), reference, None)["psnr"])
        reward = env.terminal_reward(psnr)
        if self._anchor is None or reward > self._anchor[2]:
            self._anchor = (schedule, snapshots, reward)
        return reward, psnr


def schedule_objective(env, pairs: Sequence[Pair], evaluation_log: EvaluationLog,
                       fast: bool = True) -> Callable[[list[int]], float]:
    """Mean terminal reward of a schedule over `pairs`, each episode played once and remembered in the log.

    `fast` plays through a `SchedulePlayer` per pair (same rewards, about 2x faster); False plays
    full env episodes (`play_schedule`)."""
    players: dict[Pair, SchedulePlayer] = {}

    def value(schedule: list[int]) -> float:
        key = schedule_key(schedule)
        rewards = []
        for prompt, seed in pairs:
            reward = evaluation_log.get(prompt, seed, key)
            if reward is None:
                if fast:
                    if (prompt, seed) not in players:
                        players[prompt, seed] = SchedulePlayer(env, prompt, seed)
                    reward, psnr = players[prompt, seed].play(schedule)
                else:
                    trajectory = play_schedule(env, schedule, prompt, seed)
                    reward, psnr = trajectory.reward, trajectory.info["psnr"]
                evaluation_log.add(prompt, seed, key, reward, psnr)
            rewards.append(reward)
        return float(np.mean(rewards))

    value.players = players
    return value


def validated_schedule(env, fitted: Sequence[int], pairs: Sequence[Pair], log_path: str | Path | None = None,
                       alternatives: dict[str, Sequence[int]] | None = None) -> tuple[list[int], dict]:
    """The fitted schedule, or whichever of uniform spacing and the named `alternatives` (at the same K) scores
    higher on held-apart validation `pairs`: a schedule fitted to a dozen prompts can lose to uniform on others
    (measured on MorcaTiny at K = 34: +0.6 dB on its 12 training prompts, -0.3 dB on 20 validation prompts), and
    to the schedule a file already served at that K (a neighbour's fit moved there: at K = 36, 0.38 dB better).
    -> (schedule, {"validation_psnr", "uniform_validation_psnr", "<name>_validation_psnr"..., "kept"}); ties keep
    the fitted one, then uniform; episodes logged at `log_path`."""
    from ..schedulers.fixed import UniformInterval

    fitted = [int(a) for a in fitted]
    env = env.unwrapped
    candidates = {"fitted": fitted, "uniform": [int(a) for a in UniformInterval().plan(env.budget_spec, sum(fitted))]}
    for name, schedule in (alternatives or {}).items():
        schedule = [int(a) for a in schedule]
        if name in candidates or len(schedule) != len(fitted) or sum(schedule) != sum(fitted):
            raise ValueError(f"alternative {name!r} must be a new name and a schedule of {len(fitted)} steps with "
                             f"K={sum(fitted)}")
        candidates[name] = schedule
    value = schedule_objective(env, pairs, EvaluationLog(log_path))
    try:
        psnr = {name: value(schedule) for name, schedule in candidates.items()}
    finally:
        for player in value.players.values():
            player.close()
    kept = max(psnr, key=lambda name: psnr[name])  # max keeps the first among equals: fitted, then uniform
    scores = {("validation_psnr" if name == "fitted" else f"{name}_validation_psnr"): v for name, v in psnr.items()}
    return candidates[kept], {**scores, "kept": kept}


def hill_climb(value: Callable[[list[int]], float], spec: BudgetSpec, budget: int, config: SearchConfig,
               start: list[int] | None = None, progress: Callable[[int, float], None] | None = None) -> SearchResult:
    """First-improvement hill climbing over exact-`budget` schedules (see the module docstring)."""
    from ..schedulers.fixed import UniformInterval

    spec.check_budget(budget)
    rng = np.random.default_rng(config.seed)
    current = list(start) if start is not None else UniformInterval().plan(spec, budget)
    if start is not None and (len(current) != spec.num_steps or sum(current) != budget
                              or any(current[i] for i in spec.forced)):
        raise ValueError(f"start schedule {schedule_key(current)} must have {spec.num_steps} steps, K = {budget} "
                         f"reuses (it has {sum(current)}) and none on the forced steps {sorted(spec.forced)}")
    best = start_value = value(current)
    seen = {schedule_key(current)}
    history = [best]
    misses = 0
    while len(seen) < config.evaluations and misses < 200 * config.evaluations:
        candidate = propose(current, spec, rng, config)
        if candidate is None or schedule_key(candidate) in seen:
            misses += 1
            continue
        seen.add(schedule_key(candidate))
        candidate_value = value(candidate)
        if candidate_value > best:
            current, best = candidate, candidate_value
        history.append(best)
        if progress is not None:
            progress(len(seen), best)
    return SearchResult(schedule=current, value=best, start_value=start_value, budget=budget, pairs=[],
                        evaluations=len(seen), history=history)


def search_schedule(env, pairs: Sequence[Pair], budget: int, config: SearchConfig = SearchConfig(),
                    log_path: str | Path | None = None, start: list[int] | None = None) -> SearchResult:
    """The best exact-`budget` schedule found for the mean reward over `pairs` (one pair: a per-prompt oracle)."""
    pairs = [(str(p), int(s)) for p, s in pairs]
    if not pairs:
        raise ValueError("search_schedule needs at least one (prompt, seed) pair")
    objective = schedule_objective(env, pairs, EvaluationLog(log_path))
    try:
        result = hill_climb(objective, env.unwrapped.budget_spec, budget, config, start=start)
    finally:
        for player in objective.players.values():
            player.close()
    result.pairs = pairs
    return result


def transfer_matrix(env, schedules: dict[str, Sequence[int]], pairs: Sequence[Pair],
                    log_path: str | Path | None = None, progress: bool = True) -> dict[str, list[float]]:
    """Each schedule's reward on each (prompt, seed) of `pairs`: whether a schedule searched for one pair is good
    for another (the same prompt under another seed, another prompt) says what an adaptive scheduler would have
    to know to reach the searched headroom. -> {name: [reward per pair]}; episodes logged at `log_path`."""
    from tqdm import tqdm

    lengths = {len(s) for s in schedules.values()} | {env.unwrapped.num_steps}
    budgets = {sum(int(a) for a in s) for s in schedules.values()}
    if len(lengths) != 1 or len(budgets) != 1:
        raise ValueError(f"transfer needs schedules of one K and the env's length; got K {sorted(budgets)}, "
                         f"lengths {sorted(lengths)}")
    log = EvaluationLog(log_path)
    rewards: dict[str, list[float]] = {name: [] for name in schedules}
    for pair in tqdm(pairs, desc="transfer", unit="pair", disable=not progress):
        value = schedule_objective(env, [pair], log)
        try:
            for name, schedule in schedules.items():
                rewards[name].append(value([int(a) for a in schedule]))
        finally:
            for player in value.players.values():
                player.close()
    return rewards


# ------------------------------------------------------------------ searched episodes as data
def searched_episodes(directories: Sequence[str | Path], per_search: int | None = None, seed: int = 0,
                      exclude: Sequence[str] = ()) -> list[dict]:
    """Every episode the searches under `directories` evaluated, as {prompt, seed, schedule, reward}.

    `per_search` keeps, per (log, prompt, seed), the best half of that many episodes and a random
    other half (a dataset of good schedules and of what they were compared with). A prompt in
    `exclude` (e.g. the evaluation suite's) is an error: evaluation prompts never become training data.
    """
    rng = np.random.default_rng(seed)
    banned = set(exclude)
    entries = []
    for directory in directories:
        for path in sorted(Path(directory).glob("*.jsonl")):
            groups: dict[tuple[str, int], list[dict]] = {}
            for row in read_json_lines(path, required=("prompt", "seed", "schedule", "reward")):
                groups.setdefault((row["prompt"], int(row["seed"])), []).append(row)
            for (prompt, gen_seed), rows in groups.items():
                if prompt in banned:
                    raise ValueError(f"{path} searched the held-out prompt {prompt!r}: not training data")
                if per_search is not None and len(rows) > per_search:
                    rows = sorted(rows, key=lambda r: -r["reward"])
                    best, rest = rows[:per_search // 2], rows[per_search // 2:]
                    picked = rng.choice(len(rest), size=per_search - len(best), replace=False)
                    rows = best + [rest[i] for i in sorted(picked)]
                entries += [{"prompt": prompt, "seed": gen_seed, "schedule": [int(c) for c in r["schedule"]],
                             "reward": float(r["reward"])} for r in rows]
    return entries


# ------------------------------------------------------------------ many searches, in parallel
@dataclass(frozen=True)
class SearchTask:
    """One search: a name (its files are <out>/<name>.jsonl and <name>.json), the pairs, the budget and the
    schedule it starts from (None: uniform spacing)."""

    name: str
    pairs: tuple[Pair, ...]
    budget: int
    start: tuple[int, ...] | None = None


def _search_task(env, job) -> dict:
    """One search on a worker's env -> its result, as read back from JSON (the driver writes it)."""
    task, config, out = job
    result = search_schedule(env, task.pairs, task.budget, config, Path(out) / f"{task.name}.jsonl",
                             start=None if task.start is None else list(task.start))
    return json.loads(json.dumps({"name": task.name, **result.to_dict(), "config": asdict(config)}))


def search_many(tasks: Sequence[SearchTask], env_id: str, env_kwargs: dict, out: str | Path,
                config: SearchConfig = SearchConfig(), workers: int = 1, threads: int = 1,
                progress: bool = True, executor=None) -> list[dict]:
    """Run `tasks` (resumable: finished ones are read back, unfinished ones replay their logs).

    `executor`: a `morca_env.parallel.executors.RayExecutor` runs the searches on Ray actors and writes each
    result here as it comes back (an actor's evaluation log stays on its own node's disk)."""
    from tqdm import tqdm

    out = writable_directory(out, "search output")
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise ValueError("search task names must be unique")
    with exclusive_lock(out / ".lock", f"schedule search {out}"):  # one writer: two would search twice, log twice
        results: dict[str, dict] = {}
        todo = []
        for task in tasks:
            done = out / f"{task.name}.json"
            if done.exists():
                results[task.name] = json.loads(done.read_text())
            else:
                todo.append(task)
        kwargs = {"lpips": False, "latent_features": False, **env_kwargs}
        bar = tqdm(total=len(tasks), initial=len(results), desc="schedule search", unit="search", disable=not progress)
        jobs = [(task, config, str(out)) for task in todo]
        try:
            for data in map_on_envs(_search_task, jobs, env_id, kwargs, workers, threads, executor):
                atomic_write_text(out / f"{data['name']}.json", json.dumps(data) + "\n")  # as it arrives: resumable
                results[data["name"]] = data
                bar.update()
        except WorkerFailed as error:
            raise RuntimeError(f"schedule search on {executor!r}: {error}; finished searches are kept in {out}: "
                               "rerun to continue") from error
        bar.close()
        return [results[name] for name in names]
