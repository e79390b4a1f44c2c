"""From staged episodes to a Minari dataset: built in a hidden folder and renamed into place, with its card and
the per-episode checksums that `integrity` verifies."""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from collections import Counter
from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import numpy as np

from ..observation import as_flat
from ..utils.io import atomic_write_text
from ..registration import register_envs

from . import integrity
from .recipe import SPEC_EXCLUDED_KWARGS, CollectionRecipe, minari_root
from .staging import completed_indices, episode_path, read_episode

log = logging.getLogger(__name__)


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
    num_steps = probe.unwrapped.num_steps
    probe.close()

    flat = bool(env_spec.kwargs.get("flat", False))
    if flat:  # flat-input loaders wrap the recovered env in TimeLimit(spec.max_episode_steps), which must be set;
        # N + 1 never binds (the env terminates itself after its N steps, never truncated)
        env_spec = eval_spec = replace(env_spec, max_episode_steps=num_steps + 1)
    buffers = []
    for index in range(recipe.num_episodes):
        ep = read_episode(episode_path(staging, index))
        if flat:  # gymnasium's flatten of each Dict observation, as the flat env gives them
            ep["observations"] = as_flat(ep["observations"])
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
             "hosting: on no Minari remote (the `minari download` row of `minari show` does not apply): remake it "
             "with `morca collect` and the recipe below (a packaged recipe by its dataset id)",
             "", f"recipe: {json.dumps(recipe.__dict__, sort_keys=True)}"]
    return "\n".join(lines)


def _add_metadata(dataset_dir: Path, extra: dict) -> None:
    path = dataset_dir / "data" / "metadata.json"
    metadata = json.loads(path.read_text())
    metadata.update(extra)
    atomic_write_text(path, json.dumps(metadata))
