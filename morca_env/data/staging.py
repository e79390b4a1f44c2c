"""Staged episodes: each finished episode is its own file (atomic write), so a crash loses only the episodes in
flight and `resume=True` skips the indices already there."""

from __future__ import annotations

import json
import logging
import zipfile
from pathlib import Path

import numpy as np

from ..utils.io import atomic_path


log = logging.getLogger(__name__)


def episode_path(staging: Path, index: int) -> Path:
    return staging / "episodes" / f"ep_{index:06d}.npz"


def write_episode(staging: Path, index: int, episode: dict) -> None:
    arrays = {f"obs/{k}": v for k, v in episode["observations"].items()}
    arrays.update(actions=episode["actions"], rewards=episode["rewards"],
                  meta=np.frombuffer(json.dumps(episode["meta"]).encode(), dtype=np.uint8))
    path = episode_path(staging, index)
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
