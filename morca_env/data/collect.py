"""Collecting a dataset: the behaviour policy plays the env budget-free, each episode is relabelled with its
realised K and staged as it finishes, on this process, local workers or Ray actors (the package docstring says how
a crash or a rerun is handled)."""

from __future__ import annotations

import functools
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from ..budget import BudgetSpec
from ..observation import FEATURE_KEYS, Scalar
from ..parallel.workers import WorkerDied, map_on_envs
from ..registration import register_envs
from ..utils.io import atomic_write_text, exclusive_lock
from . import integrity
from .build import build_minari_dataset, recover_leftovers
from .recipe import CollectionRecipe, make_behavior, minari_root, staging_root
from .staging import completed_indices, drop_damaged_episodes, write_episode

log = logging.getLogger(__name__)


def relabel(observations: dict[str, np.ndarray], actions: np.ndarray, spec: BudgetSpec) -> dict[str, np.ndarray]:
    """Set K to the realised reuse count and recompute every mask from (t, u_t, K, cache_valid)."""
    budget = int(actions.sum())
    n = spec.num_steps
    scalars = observations["scalars"].copy()
    masks = observations["action_mask"].copy()
    scalars[:, Scalar.K] = budget / n
    used = np.concatenate([[0], np.cumsum(actions)])
    for t in range(n):
        masks[t] = spec.action_mask(t, int(used[t]), budget, bool(scalars[t, Scalar.cache_valid] > 0.5))
        assert masks[t][actions[t]], f"relabelled mask forbids the recorded action at step {t}"
    return {**observations, "scalars": scalars, "action_mask": masks}


def record_episode(env, policy, index: int, recipe: CollectionRecipe) -> dict[str, Any]:
    """One behaviour episode, relabelled, as arrays ready for an episode file."""
    from ..rollout import rollout

    trajectory = rollout(env, policy, options=_episode_options(policy, index), seed=recipe.seed + index, record=True)
    return episode_record(trajectory, env.unwrapped.budget_spec, recipe)


def _episode_options(policy, index: int) -> dict | None:
    return policy.episode_options(index) if hasattr(policy, "episode_options") else None


def episode_record(trajectory, spec: BudgetSpec, recipe: CollectionRecipe) -> dict[str, Any]:
    """A recorded behaviour trajectory, relabelled, as arrays ready for an episode file."""
    info, actions = trajectory.info, trajectory.actions
    observations = relabel(trajectory.observations, actions, spec)
    dtype = np.float16 if recipe.feature_dtype == "float16" else np.float32
    for key in FEATURE_KEYS:
        if key in observations:  # the scalars track has no features
            observations[key] = observations[key].astype(dtype)
    meta = {"prompt": info["prompt"], "seed": info["seed"], "budget": int(actions.sum()),
            "target_speedup": info.get("target_speedup") or 0.0, "psnr": float(min(info["psnr"], 1e3)),
            "ssim": float(info["ssim"]), "speedup": float(info["speedup"]),
            "latency_s": float(info["latency_s"])}
    return {"observations": observations, "actions": actions, "rewards": trajectory.rewards, "meta": meta}


def collected_episode(recipe_dict: dict, env, index: int) -> tuple[int, dict]:
    """Episode `index` of the recipe, played in `env` (a worker's, through `workers.map_on_envs`): the same
    function runs in this process, in local workers and on Ray actors, so every path gives identical episodes."""
    recipe = CollectionRecipe(**recipe_dict)
    policy = make_behavior(recipe.behavior, env, seed=recipe.seed + index)
    return index, record_episode(env, policy, index, recipe)


def collected_episodes(recipe_dict: dict, envs, indices: list[int]) -> list[tuple[int, dict]]:
    """Episodes `indices` of the recipe, played together in a worker's `MorcaVectorEnv` (one per sub-env, each
    with the seed and behaviour policy it has unbatched)."""
    from ..rollout import rollout_many

    recipe = CollectionRecipe(**recipe_dict)
    policies = [make_behavior(recipe.behavior, envs.env, seed=recipe.seed + index) for index in indices]
    trajectories = rollout_many(envs, policies, [_episode_options(p, i) for p, i in zip(policies, indices)],
                                seeds=[recipe.seed + index for index in indices], record=True)
    return [(index, episode_record(trajectory, envs.budget_spec, recipe))
            for index, trajectory in zip(indices, trajectories)]


def _run_workers(recipe: CollectionRecipe, staging: Path, todo: list[int], workers: int, threads: int,
                 env_overrides: dict, progress: bool, already: int, executor=None, num_envs: int = 1) -> None:
    """The pending episodes on `workers` envs (`map_on_envs`; batches of `num_envs` episodes each in a
    `MorcaVectorEnv` when > 1), each written here atomically as it arrives, so a crash or a kill keeps every
    finished episode and duplicates none."""
    from tqdm import tqdm

    from ..parallel.executors import WorkerFailed

    # Dict observations while collecting (relabelling reads the scalars and rewrites the mask); a flat recipe's
    # episodes are flattened when the dataset is built
    kwargs = {**recipe.env_kwargs, **env_overrides, "enforce_budget": False, "flat": False}
    if num_envs == 1:
        play, jobs = functools.partial(collected_episode, recipe.__dict__), todo
    else:
        play = functools.partial(collected_episodes, recipe.__dict__)
        jobs = [todo[i:i + num_envs] for i in range(0, len(todo), num_envs)]
    with tqdm(total=recipe.num_episodes, initial=already, desc=f"collect {recipe.dataset_id}", unit="episode",
              disable=not progress) as bar:
        try:
            for result in map_on_envs(play, jobs, recipe.env_id, kwargs, workers, threads, executor,
                                      num_envs=num_envs):
                for index, episode in ([result] if num_envs == 1 else result):
                    write_episode(staging, index, episode)
                    bar.update()
        except Exception as error:  # a worker's own error (its traceback is the cause), a dead worker, Ray's
            where = f" on {executor!r}" if executor is not None else ""
            what = str(error) if isinstance(error, (WorkerFailed, WorkerDied)) else f"{type(error).__name__}: {error}"
            raise RuntimeError(f"collection{where} failed: {what}; the {bar.n - already} episodes finished in this run "
                               "are kept: rerun with resume=True (`morca collect`: --resume, the default) to "
                               "continue") from error


def _copy(value, default):
    """A dict argument copied (None: `default`); anything else is left for the recipe to refuse."""
    if value is None:
        return dict(default)
    return dict(value) if isinstance(value, dict) else value


def collect_dataset(
    dataset_id: str,
    env_id: str,
    num_episodes: int,
    env_kwargs: dict | None = None,
    behavior: dict | str | None = None,
    *,
    resume: bool = True,
    overwrite: bool = False,
    workers: int = 1,
    threads: int = 1,
    seed: int = 0,
    feature_dtype: str = "float16",
    description: str = "",
    author: str = "MORCA gym",
    code_permalink: str = "morca-gym repository, morca collect (morca_env/data.py)",
    env_overrides: dict | None = None,
    progress: bool = True,
    recipe: CollectionRecipe | None = None,
    executor=None,
    num_envs: int = 1,
):
    """Collect `num_episodes` behaviour episodes of `env_id` into the Minari dataset `dataset_id`.

    `env_overrides` are machine-local env kwargs (e.g. `reference_cache_dir`) that
    are not part of the recipe. `executor`: None runs `workers` local processes (one in this
    process when `workers=1`); a `morca_env.parallel.executors.RayExecutor` runs them as Ray actors, which
    return each episode to this process to be written, as the local path does. `num_envs` > 1: each worker plays
    batches of that many episodes in a `MorcaVectorEnv` (one transformer call per step for the batch; each episode
    equals its unbatched self up to float32 rounding, so a threshold behaviour may decide a step differently;
    the project's vector benchmark measures the gain). Returns the
    `minari.MinariDataset`. One writer per dataset id: a second `collect_dataset` of an id being collected
    fails at once naming the first one's pid (an OS lock), so two runs never mix their episodes.
    """
    if recipe is None:
        recipe = CollectionRecipe(dataset_id=dataset_id, env_id=env_id, num_episodes=num_episodes,
                                  env_kwargs=_copy(env_kwargs, {}),
                                  behavior=_copy(behavior, {"name": "threshold-curve"}),
                                  seed=seed, feature_dtype=feature_dtype, description=description, author=author,
                                  code_permalink=code_permalink)
    for name, count in (("workers", workers), ("threads", threads), ("num_envs", num_envs)):
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"{name}={count!r} must be a positive integer")
    register_envs()

    if recipe.env_id not in gym.registry:
        raise ValueError(f"env_id={recipe.env_id!r} is not registered; valid: "
                         f"{', '.join(k for k in gym.registry if k.startswith('Morca'))}")
    with exclusive_lock(staging_root() / f"{recipe.dataset_id}.lock", f"dataset {recipe.dataset_id!r}"):
        recover_leftovers(recipe.dataset_id)
        return _collect_locked(recipe, resume, overwrite, workers, threads, env_overrides, progress, executor,
                               num_envs)


def _collect_locked(recipe, resume, overwrite, workers, threads, env_overrides, progress, executor, num_envs):
    """`collect_dataset` while holding the id's lock: nobody else stages, builds or replaces this id."""
    final = minari_root() / recipe.dataset_id
    if (final / "data").exists() and not overwrite:
        existing = integrity.load_dataset(recipe.dataset_id)
        if resume and existing.total_episodes == recipe.num_episodes and \
                existing.storage.metadata.get("morca_recipe_identity") == json.dumps(recipe.identity(), sort_keys=True):
            integrity.verify_dataset(existing)  # a damaged or truncated dataset is not "already collected"
            return existing
        raise FileExistsError(f"dataset {recipe.dataset_id!r} already exists at {final} "
                              f"({existing.total_episodes} episodes); pass overwrite=True to rebuild it")
    staging = staging_root() / recipe.dataset_id
    identity_file = staging / "recipe_identity.json"
    # not the episode count: episode i is a function of the recipe and i (seed + i), so a larger collection of
    # the same recipe rightly continues a smaller one; the staging root already separates dataset roots
    identity = json.dumps(recipe.identity(), sort_keys=True)
    if staging.exists() and not resume:
        shutil.rmtree(staging)
    if identity_file.exists() and identity_file.read_text() != identity and \
            completed_indices(staging, recipe.num_episodes):
        raise ValueError(f"staging dir {staging} holds episodes of a different recipe; "
                         "use resume=False (morca collect --no-resume) to discard them or another dataset_id")
    (staging / "episodes").mkdir(parents=True, exist_ok=True)
    for leftover in (staging / "episodes").glob(".*.tmp*"):  # writes interrupted by a crash
        leftover.unlink(missing_ok=True)
    atomic_write_text(identity_file, identity)

    drop_damaged_episodes(staging)
    done = completed_indices(staging, recipe.num_episodes)
    todo = [i for i in range(recipe.num_episodes) if i not in done]
    t0 = time.perf_counter()
    if todo:
        _run_workers(recipe, staging, todo, workers, threads, dict(env_overrides or {}), progress, len(done),
                     executor, num_envs)
    elapsed = time.perf_counter() - t0
    if todo and progress:
        log.info("collected %d episodes in %.1f s: %.1f episodes/min (%d worker%s%s, %d episode%s a batch)", len(todo),
                 elapsed, 60 * len(todo) / elapsed, workers, "s" if workers > 1 else "",
                 " on Ray" if executor is not None else "", num_envs, "s" if num_envs > 1 else "")
    return build_minari_dataset(recipe, staging, overwrite=overwrite)
