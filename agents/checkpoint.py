"""Checkpoints with a sha256 sidecar (`<file>.sha256`), verified on every load.

d3rlpy's `load_learnable` and `torch.load` read a file with a flipped byte in its
weights without a word, and a truncated one with a bare `UnpicklingError`. Every
checkpoint this project writes (`.d3` for d3rlpy algorithms, `.pt` for REINFORCE)
goes through `save_learnable` / `save_torch`, and every load through
`load_learnable` / `load_torch`, which refuse a file whose bytes do not match
its checksum with an error naming the file.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from morca_env.io import atomic_path, atomic_write_text

SUFFIX = ".sha256"


class CheckpointError(ValueError):
    """A checkpoint that is missing its checksum, does not match it, or cannot be read."""


def checksum_path(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.name + SUFFIX)


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_checksum(path: str | Path, source: str | Path | None = None) -> Path:
    """Record the sha256 of `source` (default: `path` itself) as `path`'s checksum.

    Also the way to vouch for a checkpoint written before checksums existed.
    """
    path = Path(path)
    side = checksum_path(path)
    atomic_write_text(side, f"{file_sha256(source or path)}  {path.name}\n")
    return side


def verify(path: str | Path) -> Path:
    """Raise `CheckpointError` (naming the file) unless `path` matches its recorded sha256."""
    if path is None or not isinstance(path, (str, Path)):
        raise TypeError(f"checkpoint path={path!r}: give the path of a checkpoint file (.d3 or .pt)")
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"checkpoint {path} is a directory, not a checkpoint file: give a file in it, e.g. "
                                f"{path / 'final.d3'}")
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    side = checksum_path(path)
    if not side.is_file():
        raise CheckpointError(f"checkpoint {path} has no checksum file {side.name}, so its integrity cannot be "
                              "checked; if you trust it, record one with "
                              f"agents.checkpoint.write_checksum({str(path)!r})")
    recorded = side.read_text().split()
    expected = recorded[0] if recorded else ""
    actual = file_sha256(path)
    if actual != expected:
        raise CheckpointError(f"checkpoint {path} is damaged: its sha256 {actual[:12]}... does not match "
                              f"{expected[:12] or '(empty)'}... in {side.name} (changed bytes, truncation or an "
                              "interrupted save); restore it or train again")
    return path


def save_learnable(algo, path: str | Path) -> Path:
    """`algo.save(path)` written atomically, with its checksum."""
    path = Path(path)
    with atomic_path(path) as tmp:
        algo.save(str(tmp))
        write_checksum(path, tmp)
    return path


def load_learnable(path: str | Path, device: Any = None):
    """`d3rlpy.load_learnable` after verifying the checksum (import `agents` registers our classes)."""
    import d3rlpy

    verify(path)
    try:
        return d3rlpy.load_learnable(str(path), device=device)
    except Exception as error:
        raise CheckpointError(f"checkpoint {path} could not be loaded: {type(error).__name__}: {error}") from error


def save_torch(state: dict, path: str | Path) -> Path:
    """`torch.save(state, path)` written atomically, with its checksum."""
    import torch

    path = Path(path)
    with atomic_path(path) as tmp:
        torch.save(state, tmp)
        write_checksum(path, tmp)
    return path


def load_torch(path: str | Path) -> dict:
    """`torch.load` of a checkpoint we wrote, after verifying its checksum."""
    import torch

    verify(path)
    try:
        return torch.load(path, weights_only=False)
    except Exception as error:
        raise CheckpointError(f"checkpoint {path} could not be loaded: {type(error).__name__}: {error}") from error
