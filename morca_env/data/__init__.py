"""Offline trajectories: crash-safe collection into Minari datasets, and Minari -> d3rlpy conversion.

Collection runs the env in budget-free mode (`enforce_budget=False`) with a
behaviour policy (the paper's random threshold curves by default), then relabels
every episode with its realised reuse count K, so that each recorded `K`, `u_t`
and `action_mask` is consistent with the recorded actions (paper App. B.3).

Crash safety: each finished episode is committed as its own file in a staging
directory (atomic write), keyed by episode index; `resume=True` skips the
indices already there. Only when all episodes exist is the Minari dataset built,
in a hidden directory that is then renamed into place. A `kill -9` therefore
loses at most the episodes in flight, and a finished dataset is replaced only
with `overwrite=True`. Episode i always uses env seed `seed + i` and the same
behaviour RNG, so the data do not depend on the number of workers, nor on where
they run: this process, local worker processes or Ray actors (`morca_env.parallel.workers.map_on_envs`;
`executor=RayExecutor(...)`), which send each finished episode back to be written here.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import time
import uuid
import zipfile
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from ..budget import BudgetSpec
from ..utils.io import atomic_path, atomic_write_text, exclusive_lock
from ..utils.paths import cache_root
from ..observation import FEATURE_KEYS, Scalar, as_flat, as_tuple
from . import integrity
from .. import schedulers
from ..utils.quiet import quiet_d3rlpy
from ..registration import register_envs
from ..parallel.workers import WorkerDied, map_on_envs

log = logging.getLogger(__name__)

SPEC_EXCLUDED_KWARGS = ("reference_cache_dir", "pipeline", "device")


# ------------------------------------------------------------------ recipes
@dataclass
class CollectionRecipe:
    """Everything that defines a dataset; stored in its metadata and checked on resume."""

    dataset_id: str
    env_id: str
    num_episodes: int
    env_kwargs: dict = field(default_factory=dict)
    behavior: dict = field(default_factory=lambda: {"name": "threshold-curve"})
    seed: int = 0
    feature_dtype: str = "float16"
    description: str = ""
    author: str = "MORCA gym"
    code_permalink: str = "morca-gym repository, morca collect (morca_env/data.py)"
    algorithm_name: str = "threshold-curve SeaCache (MORCA App. B.3)"

    def __post_init__(self):
        check_dataset_id(self.dataset_id)
        if isinstance(self.behavior, str):
            self.behavior = {"name": self.behavior}
        valid = schedulers.names(aliases=True)  # any scheduler of the registry
        if not isinstance(self.behavior, dict) or self.behavior.get("name") not in valid:
            raise ValueError(f"behavior={self.behavior!r}; valid: a behaviour name ({', '.join(valid)}) or a "
                             "dict {'name': <name>, **options}")
        for spec in _nested_specs(self.behavior):  # a mixture's components too
            schedulers.refuse_caller_only_options(spec, f"recipe {self.dataset_id!r}: behaviour {spec!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed={self.seed!r} must be a non-negative integer")
        if isinstance(self.num_episodes, bool) or not isinstance(self.num_episodes, int) or self.num_episodes < 1:
            raise ValueError(f"num_episodes={self.num_episodes!r} must be a positive integer")
        if not isinstance(self.env_kwargs, dict):
            raise ValueError(f"env_kwargs={self.env_kwargs!r} must be a dict of MorcaEnv arguments")
        if self.feature_dtype not in ("float16", "float32"):
            raise ValueError(f"feature_dtype={self.feature_dtype!r}; valid: float16, float32")

    @classmethod
    def from_file(cls, path: str | Path) -> "CollectionRecipe":
        return cls(**json.loads(Path(path).read_text()))

    def identity(self) -> dict:
        """The fields that must match for a resumed collection to continue the same data."""
        return {"env_id": self.env_id, "env_kwargs": self.env_kwargs, "behavior": self.behavior, "seed": self.seed,
                "feature_dtype": self.feature_dtype}


def check_dataset_id(dataset_id) -> str:
    """Refuse an id Minari cannot build before any episode is collected for it."""
    from minari.utils import parse_dataset_id

    try:
        _, name, version = parse_dataset_id(dataset_id)
    except Exception:  # minari raises ValueError or TypeError on malformed ids
        name = version = None
    if not isinstance(dataset_id, str) or name is None or version is None:
        raise ValueError(f"dataset_id={dataset_id!r} is not a Minari dataset id; valid: "
                         "'<namespace>/<name>-v<version>', e.g. 'morca/tiny/random-v0'")
    return dataset_id


def staging_root() -> Path:
    """Where collections stage their episodes: one folder per Minari datasets root, so two roots (two
    MINARI_DATASETS_PATH values) never share staged episodes of the same dataset id."""
    import hashlib

    root = str(minari_root())
    return cache_root() / "collect" / hashlib.sha256(root.encode()).hexdigest()[:12]


def minari_root() -> Path:
    """Minari's datasets directory, absolute: a relative MINARI_DATASETS_PATH is joined twice by minari when it
    sizes a new dataset's files, which failed the build after every episode was collected."""
    from minari.storage.datasets_root_dir import get_dataset_path

    return Path(get_dataset_path()).resolve()


# ------------------------------------------------------------------ behaviour
def _nested_specs(value):
    """Every JSON object inside a behaviour spec, itself included."""
    if isinstance(value, dict):
        yield value
        for inner in value.values():
            yield from _nested_specs(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _nested_specs(inner)


def make_behavior(spec: dict, env, seed: int):
    """The behaviour policy of a recipe entry {"name": <scheduler name>, **options} (`schedulers.from_spec`)."""
    return schedulers.from_spec(spec, env, seed=seed)


# ------------------------------------------------------------------ one episode
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


def run_episode(env, policy, index: int, recipe: CollectionRecipe) -> dict[str, Any]:
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
        observations[key] = observations[key].astype(dtype)
    meta = {"prompt": info["prompt"], "seed": info["seed"], "budget": int(actions.sum()),
            "target_speedup": info.get("target_speedup") or 0.0, "psnr": float(min(info["psnr"], 1e3)),
            "ssim": float(info["ssim"]), "speedup": float(info["speedup"]),
            "latency_s": float(info["latency_s"])}
    return {"observations": observations, "actions": actions, "rewards": trajectory.rewards, "meta": meta}


def _episode_path(staging: Path, index: int) -> Path:
    return staging / "episodes" / f"ep_{index:06d}.npz"


def write_episode(staging: Path, index: int, episode: dict) -> None:
    arrays = {f"obs/{k}": v for k, v in episode["observations"].items()}
    arrays.update(actions=episode["actions"], rewards=episode["rewards"],
                  meta=np.frombuffer(json.dumps(episode["meta"]).encode(), dtype=np.uint8))
    path = _episode_path(staging, index)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)


def read_episode(path: Path) -> dict:
    """A staged episode; a damaged file (a zip member's CRC, a truncation) raises naming it."""
    try:
        with np.load(path) as data:
            obs = {k.split("/", 1)[1]: data[k] for k in data.files if k.startswith("obs/")}
            return {"observations": obs, "actions": data["actions"], "rewards": data["rewards"],
                    "meta": json.loads(data["meta"].tobytes().decode())}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
        raise ValueError(f"staged episode {path} is damaged ({type(error).__name__}: {error})") from error


def drop_damaged_episodes(staging: Path) -> None:
    """Remove staged episode files that do not read back whole, so that resuming collects them again. Every
    staged file is read (zip CRCs), a few ms each."""
    for path in sorted((staging / "episodes").glob("ep_*.npz")):
        try:
            read_episode(path)
        except ValueError as error:
            log.warning("%s; it is collected again", error)
            path.unlink(missing_ok=True)


def completed_indices(staging: Path, num_episodes: int) -> set[int]:
    done = set()
    for path in (staging / "episodes").glob("ep_*.npz"):
        try:
            index = int(path.stem[3:])
        except ValueError:
            continue
        if index < num_episodes:
            done.add(index)
    return done


# ------------------------------------------------------------------ workers
def collected_episode(recipe_dict: dict, env, index: int) -> tuple[int, dict]:
    """Episode `index` of the recipe, played in `env` (a worker's, through `workers.map_on_envs`): the same
    function runs in this process, in local workers and on Ray actors, so every path gives identical episodes."""
    recipe = CollectionRecipe(**recipe_dict)
    policy = make_behavior(recipe.behavior, env, seed=recipe.seed + index)
    return index, run_episode(env, policy, index, recipe)


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

    kwargs = {**recipe.env_kwargs, **env_overrides, "enforce_budget": False}
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


def _build_prefix(dataset_id: str) -> str:
    return f".morca-build-{dataset_id.replace('/', '__')}-"


def recover_leftovers(dataset_id: str) -> None:
    """What a killed build of this id left behind (call with the id's lock held): its build directories are
    removed, and a dataset moved aside for replacement (`.<name>.old-*`) comes back if no new one took its place."""
    root = minari_root()
    for build in root.glob(_build_prefix(dataset_id) + "*"):
        shutil.rmtree(build, ignore_errors=True)
    final = root / dataset_id
    olds = sorted(final.parent.glob(f".{final.name}.old-*"), key=lambda p: p.stat().st_mtime)
    if olds and not final.exists():
        olds.pop().rename(final)  # the kill came between moving the old dataset aside and renaming the new one in
        log.warning("restored dataset %r from an interrupted rebuild", dataset_id)
    for old in olds:
        shutil.rmtree(old, ignore_errors=True)


def build_minari_dataset(recipe: CollectionRecipe, staging: Path, overwrite: bool = False):
    """Build the Minari dataset from the staged episode files (atomically renamed into place)."""
    import minari
    from minari.data_collector.episode_buffer import EpisodeBuffer
    from minari.namespace import create_namespace, list_local_namespaces

    missing = sorted(set(range(recipe.num_episodes)) - completed_indices(staging, recipe.num_episodes))
    if missing:
        raise RuntimeError(f"{len(missing)} episodes are not collected yet (first: {missing[:5]}); resume collection")
    register_envs()

    base_spec = gym.spec(recipe.env_id)
    spec_kwargs = {k: v for k, v in recipe.env_kwargs.items() if k not in SPEC_EXCLUDED_KWARGS}
    # both specs hold agents to their budget (the data were collected budget-free and relabelled, which the
    # recipe records) and give observations in the dataset's own dtypes: recover_environment()'s observation
    # space is the dataset's
    env_spec = replace(base_spec, kwargs={**base_spec.kwargs, **spec_kwargs, "enforce_budget": True,
                                          "feature_dtype": recipe.feature_dtype})
    eval_spec = env_spec
    probe = gym.make(env_spec, **({} if "reference_cache_dir" not in recipe.env_kwargs else
                                  {"reference_cache_dir": recipe.env_kwargs["reference_cache_dir"]}))
    observation_space, action_space = probe.observation_space, probe.action_space  # the dataset's dtypes
    r_max = probe.unwrapped.r_max
    probe.close()

    buffers = []
    for index in range(recipe.num_episodes):
        ep = read_episode(_episode_path(staging, index))
        n = len(ep["actions"])
        terminations = np.zeros(n, dtype=bool)
        terminations[-1] = True
        buffers.append(EpisodeBuffer(
            id=index, seed=recipe.seed + index, options=ep["meta"], observations=ep["observations"],
            actions=ep["actions"], rewards=ep["rewards"], terminations=terminations,
            truncations=np.zeros(n, dtype=bool)))

    root = minari_root()
    build_root = root / f"{_build_prefix(recipe.dataset_id)}{uuid.uuid4().hex[:8]}"
    previous = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(build_root)
    try:
        _create_dataset(recipe, buffers, env_spec, eval_spec, observation_space, action_space, build_root, r_max)
    except BaseException:
        shutil.rmtree(build_root, ignore_errors=True)
        raise
    finally:
        if previous is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = previous
    final = root / recipe.dataset_id
    final.parent.mkdir(parents=True, exist_ok=True)
    namespace = minari.utils.parse_dataset_id(recipe.dataset_id)[0]
    if namespace is not None and namespace not in list_local_namespaces():
        create_namespace(namespace)
    old = None
    if final.exists():
        if not overwrite:
            shutil.rmtree(build_root)
            raise FileExistsError(f"dataset {recipe.dataset_id!r} already exists at {final}; pass overwrite=True")
        old = final.with_name(f".{final.name}.old-{uuid.uuid4().hex[:8]}")
        final.rename(old)
    (build_root / recipe.dataset_id).rename(final)
    shutil.rmtree(build_root, ignore_errors=True)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return minari.load_dataset(recipe.dataset_id)


def _create_dataset(recipe, buffers, env_spec, eval_spec, observation_space, action_space, build_root: Path,
                    r_max: float) -> None:
    """The Minari dataset in `build_root` (MINARI_DATASETS_PATH points there), with our recipe in its metadata, its
    card as the description and, collected at one benchmark target, the reference scores."""
    import minari

    from ..evaluation.benchmark import reference_returns

    refs = reference_returns(recipe.env_id, recipe.env_kwargs, r_max)
    created = minari.create_dataset_from_buffers(
        dataset_id=recipe.dataset_id, buffer=buffers, env=env_spec, eval_env=eval_spec,
        algorithm_name=recipe.algorithm_name, author=recipe.author, code_permalink=recipe.code_permalink,
        observation_space=observation_space, action_space=action_space,
        description=dataset_card(recipe, [b.options for b in buffers], refs),
        ref_min_score=None if refs is None else refs[0], ref_max_score=None if refs is None else refs[1],
        data_format="hdf5", jpeg_encoding=False, requirements=None)
    _add_metadata(build_root / recipe.dataset_id, {"morca_recipe": json.dumps(recipe.__dict__, sort_keys=True),
                                                   "morca_recipe_identity": json.dumps(recipe.identity(), sort_keys=True),
                                                   # over what Minari reads back: every later read is compared
                                                   integrity.METADATA_KEY: json.dumps(
                                                       integrity.episode_checksums(created))})


def dataset_card(recipe: CollectionRecipe, metas: list[dict], refs: tuple[float, float] | None) -> str:
    """What `minari show` prints: the recipe, the behaviour, the env arguments, the K histogram, the mean PSNR and
    the reference scores `minari.get_normalized_score` uses."""
    ks = Counter(int(m["budget"]) for m in metas)
    psnr = np.array([m["psnr"] for m in metas], dtype=float)
    lines = [recipe.description or f"{recipe.num_episodes} {recipe.env_id} episodes",
             "", f"behaviour: {json.dumps(recipe.behavior, sort_keys=True)} (seed {recipe.seed})",
             f"env: {recipe.env_id} {json.dumps(recipe.env_kwargs, sort_keys=True)}; observations' features in "
             f"{recipe.feature_dtype}; K relabelled to each episode's realised reuses",
             f"K histogram (K: episodes): {', '.join(f'{k}: {n}' for k, n in sorted(ks.items()))}",
             f"PSNR: mean {psnr.mean():.2f} dB (min {psnr.min():.2f}, max {psnr.max():.2f}) over {len(psnr)} episodes",
             ("reference scores (morca_env.evaluation.benchmark, same target): random feasible "
              f"{refs[0]:.2f}, best fixed {refs[1]:.2f} (minari.get_normalized_score: 0 and 1)") if refs else
             "reference scores: none (collected over a speedup range or settings without shipped references)",
             "", f"recipe: {json.dumps(recipe.__dict__, sort_keys=True)}"]
    return "\n".join(lines)


def _add_metadata(dataset_dir: Path, extra: dict) -> None:
    path = dataset_dir / "data" / "metadata.json"
    metadata = json.loads(path.read_text())
    metadata.update(extra)
    atomic_write_text(path, json.dumps(metadata))


# ------------------------------------------------------------------ reading
def episode_options(dataset) -> list[dict]:
    """Per-episode metadata recorded at collection (prompt, seed, budget, psnr, ...)."""
    import h5py

    out = []
    path = Path(dataset.storage.data_path) / "main_data.hdf5"
    with h5py.File(path, "r") as f:
        for key in sorted(f.keys(), key=lambda k: int(k.split("_")[1])):
            attrs = f[key].attrs
            out.append({k.split("/", 1)[1]: (v.item() if hasattr(v, "item") else v)
                        for k, v in attrs.items() if k.startswith("options/")})
    return out


flatten_observation = as_flat  # kept names; the layout lives in morca_env.observation
tuple_observation = as_tuple


def first_episodes(dataset, count: int | None) -> list[int] | None:
    """Indices of a Minari dataset's first `count` episodes (None: all), for training on a prefix."""
    if count is None:
        return None
    if not 1 <= count <= dataset.total_episodes:
        raise ValueError(f"episodes={count} is outside [1, {dataset.total_episodes}] for {dataset.spec.dataset_id}")
    return list(range(count))


def transition_picker(n_step: int = 1):
    """d3rlpy's picker for `n_step`-step returns (gamma = 1): with the terminal-only PSNR reward,
    one-step TD needs ~N hops of slow target updates to carry the reward back to the first step;
    n_step = N makes every target the episode's own return (Monte-Carlo), which converges in a
    CPU-sized number of updates."""
    quiet_d3rlpy("transition_picker (d3rlpy's n-step picker)")
    from d3rlpy.dataset import BasicTransitionPicker, MultiStepTransitionPicker

    if isinstance(n_step, bool) or not isinstance(n_step, int) or n_step < 1:
        raise ValueError(f"n_step={n_step!r} must be an integer >= 1 (1: one-step TD as in the paper)")
    return BasicTransitionPicker() if n_step == 1 else MultiStepTransitionPicker(n_steps=n_step, gamma=1.0)


def to_replay_buffer(dataset, observation: str = "flat", episode_indices=None, n_step: int = 1):
    """A d3rlpy `ReplayBuffer` from a MORCA Minari dataset, or from several (a list: their episodes in order;
    `episode_indices` then applies to the first only, e.g. a prefix of a mixture plus all of a searched dataset).

    Each episode of N steps gives N transitions: observations[0..N-1] with the
    action taken there; the final (terminal) observation is the next observation
    of the last transition, which is `terminated`. `observation="flat"` (the
    default) concatenates the parts in gymnasium's sorted-key order, [action_mask,
    pooled, scalars, temporal] (`observation.FLAT_KEYS`; row t equals
    `gymnasium.spaces.flatten(env.observation_space, obs_t)`, so `FlattenObservation`
    feeds a policy trained on it), which every d3rlpy algorithm's default encoder takes; `"tuple"` keeps the four
    arrays, which our `agents.DiscreteIQL` (`agents.networks`) asks for. `n_step > 1` samples
    n-step returns (`transition_picker`).
    """
    quiet_d3rlpy("to_replay_buffer (a d3rlpy ReplayBuffer)")
    from d3rlpy.constants import ActionSpace
    from d3rlpy.dataset import Episode, InfiniteBuffer, ReplayBuffer

    if observation not in ("tuple", "flat"):
        raise ValueError(f"observation={observation!r}; valid: 'tuple', 'flat'")
    convert = tuple_observation if observation == "tuple" else flatten_observation
    datasets = list(dataset) if isinstance(dataset, (list, tuple)) else [dataset]
    if not datasets:
        raise ValueError("to_replay_buffer needs at least one dataset")
    datasets = [integrity.load_dataset(d) if isinstance(d, str) else d for d in datasets]  # ids are fine too
    for d in datasets:
        if not hasattr(d, "iterate_episodes"):
            raise TypeError(f"dataset={d!r}: give a minari.MinariDataset, a dataset id, or a list of them")
    if episode_indices is not None:
        indices = [int(i) for i in episode_indices]
        total = datasets[0].total_episodes
        bad = [i for i in indices if not 0 <= i < total]
        if bad or len(set(indices)) != len(indices):
            raise ValueError(f"episode_indices: {bad or sorted({i for i in indices if indices.count(i) > 1})} "
                             f"{'out of range' if bad else 'repeated'}; valid: distinct indices in [0, {total - 1}] "
                             f"of {datasets[0].spec.dataset_id!r}")
        episode_indices = indices
    steps = {d.spec.dataset_id: len(next(iter(d.iterate_episodes([0]))).actions) for d in datasets if d.total_episodes}
    if len(set(steps.values())) > 1:
        raise ValueError(f"datasets of different step counts cannot share a buffer (the state's t, u_t and K are "
                         f"fractions of N): {steps}")
    episodes = []
    for ep in (e for i, d in enumerate(datasets)
               for e in integrity.iterate_checked(d, episode_indices if i == 0 else None)):
        obs = {k: np.asarray(v) for k, v in ep.observations.items()}
        n = len(ep.actions)
        if any(len(v) != n + 1 for v in obs.values()):
            raise ValueError(f"episode {ep.id}: expected {n + 1} observations for {n} actions")
        if not ep.terminations[-1]:
            raise ValueError(f"episode {ep.id} does not end in a terminal step")
        converted = convert({k: v[:n] for k, v in obs.items()})
        episodes.append(Episode(observations=converted, actions=np.asarray(ep.actions, dtype=np.int64).reshape(n, 1),
                                rewards=np.asarray(ep.rewards, dtype=np.float32).reshape(n, 1), terminated=True))
    return ReplayBuffer(InfiniteBuffer(), episodes=episodes, action_space=ActionSpace.DISCRETE, action_size=2,
                        transition_picker=transition_picker(n_step))
