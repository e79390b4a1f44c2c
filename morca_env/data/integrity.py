"""Checksums for the Minari datasets this project writes: one sha256 per episode over what Minari reads back
(observations, actions, rewards, terminations, truncations), kept in the dataset's metadata.

Minari stores no checksum, so a flipped bit in a stored reward loads silently (16.75 -> 4.19 in one trial).
Checkpoints and references here already carry theirs; this gives datasets the same guarantee. A plain
`minari.load_dataset` user checks a dataset with `verify_dataset(dataset)` or `morca verify <id>`.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import numpy as np

METADATA_KEY = "morca_episode_sha256"


class DatasetIntegrityError(ValueError):
    """A stored dataset's contents differ from what was written (damaged file, or edited by hand)."""


def episode_digest(episode) -> str:
    """sha256 of one `minari.EpisodeData`: every array's dtype, shape and bytes, in a fixed order."""
    digest = hashlib.sha256()
    obs = episode.observations
    arrays = ([(f"obs/{k}", obs[k]) for k in sorted(obs)] if isinstance(obs, dict) else [("obs", obs)])  # or flat
    arrays += [("actions", episode.actions), ("rewards", episode.rewards), ("terminations", episode.terminations),
               ("truncations", episode.truncations)]
    for name, value in arrays:
        array = np.ascontiguousarray(np.asarray(value))
        digest.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def data_file(dataset) -> Path:
    return Path(dataset.storage.data_path) / "main_data.hdf5"


def episode_checksums(dataset) -> list[str]:
    """The checksums to record for a freshly built dataset, in episode order."""
    return [episode_digest(ep) for ep in dataset.iterate_episodes()]


def recorded_checksums(dataset) -> list[str] | None:
    """The dataset's recorded checksums, or None (with a warning) for a dataset built before they existed."""
    value = dataset.storage.metadata.get(METADATA_KEY)
    if value is None:
        warnings.warn(f"dataset {dataset.spec.dataset_id!r} ({data_file(dataset)}) has no episode checksums (built "
                      "by an older version or by hand): it cannot be verified; rebuild it to add them", stacklevel=3)
        return None
    return json.loads(value) if isinstance(value, str) else list(value)


def check_episode(dataset, episode, checksums: list[str] | None) -> None:
    """Raise if `episode` (read from `dataset`) differs from its recorded checksum."""
    if checksums is None:
        return
    if episode.id >= len(checksums) or episode_digest(episode) != checksums[episode.id]:
        raise DatasetIntegrityError(
            f"dataset {dataset.spec.dataset_id!r}: episode {episode.id} in {data_file(dataset)} does not match its "
            "recorded checksum (the file was damaged or edited): rebuild it (collect_dataset(..., overwrite=True), or "
            "`morca collect <recipe> --overwrite`)")


def verify_dataset(dataset) -> int:
    """Check every episode of a dataset (a `minari.MinariDataset` or its id) against its recorded checksums and
    the recorded episode count; -> the number of episodes verified (0 for a dataset without checksums)."""
    if isinstance(dataset, str):
        dataset = load_dataset(dataset)
    checksums = recorded_checksums(dataset)
    if checksums is None:
        return 0
    if dataset.total_episodes != len(checksums):
        raise DatasetIntegrityError(f"dataset {dataset.spec.dataset_id!r} ({data_file(dataset)}) holds "
                                    f"{dataset.total_episodes} episodes, its checksums {len(checksums)}: it is "
                                    "truncated or was edited; rebuild it")
    for episode in iterate_checked(dataset):
        pass
    return len(checksums)


def iterate_checked(dataset, episode_indices=None):
    """`dataset.iterate_episodes(episode_indices)`, each episode checked against its checksum, and an unreadable
    file reported by name."""
    checksums = recorded_checksums(dataset)
    try:
        for episode in dataset.iterate_episodes(episode_indices):
            check_episode(dataset, episode, checksums)
            yield episode
    except (OSError, KeyError, RuntimeError) as error:
        raise DatasetIntegrityError(f"dataset {dataset.spec.dataset_id!r}: {data_file(dataset)} cannot be read "
                                    f"({type(error).__name__}: {error}); rebuild it") from error


def load_dataset(dataset_id: str):
    """`minari.load_dataset`, with an unreadable (truncated, damaged) dataset reported by its id and file."""
    import minari
    from minari.storage.datasets_root_dir import get_dataset_path

    if not isinstance(dataset_id, str) or not dataset_id:
        raise ValueError(f"dataset id {dataset_id!r} must be a non-empty string, e.g. 'morca/tiny/random-v0'")
    if not (get_dataset_path(dataset_id) / "data").is_dir():  # minari would suggest download=True: none is hosted
        root = get_dataset_path()
        local = sorted(str(p.parent.relative_to(root)) for p in root.glob("**/data") if p.is_dir())
        raise FileNotFoundError(
            f"dataset {dataset_id!r} is not in the local Minari root {root} (MINARI_DATASETS_PATH); local datasets: "
            f"{', '.join(local) or 'none'}. MORCA's datasets are not hosted: make it with `morca collect "
            "<recipe>` (a recipe file, or a packaged recipe's dataset id such as morca/tiny/random-v0)")
    try:
        return minari.load_dataset(dataset_id)
    except (OSError, KeyError, json.JSONDecodeError) as error:
        raise DatasetIntegrityError(f"dataset {dataset_id!r} cannot be loaded ({type(error).__name__}: {error}): it "
                                    "is damaged or incomplete; rebuild it with overwrite=True") from error
