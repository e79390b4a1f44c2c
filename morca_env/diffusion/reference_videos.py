"""On-disk cache of no-cache reference videos, one file per (model, config, prompt, seed).

A reference costs a full generation (minutes on a GPU for Wan), so it is made
once and shared by every episode and env instance that points to the same
directory. Files are written atomically; one sha256 covers the video and every
metadata field (latency, key, fields), so a file that is truncated, has any byte
changed or is for another key is detected on load, reported with a warning
naming it, and regenerated. A directory that cannot be written is reported at
construction; references are then generated for each episode and not kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import load_file, save_file

from ..utils.io import atomic_path
from ..utils.paths import cache_root


def default_cache_dir() -> Path:
    return cache_root() / "references"


DEFAULT_LIMIT_MB = 8192  # about 80 Wan2.1 references, or a million MorcaTiny ones


def cache_limit_bytes() -> int:
    """The reference cache's size bound: $MORCA_REFERENCE_CACHE_MB (MiB), else `DEFAULT_LIMIT_MB`."""
    text = os.environ.get("MORCA_REFERENCE_CACHE_MB", str(DEFAULT_LIMIT_MB))
    try:
        megabytes = float(text)
    except ValueError:
        megabytes = -1.0
    if not megabytes > 0:
        raise ValueError(f"MORCA_REFERENCE_CACHE_MB={text!r} must be a positive number of MiB "
                         f"(default {DEFAULT_LIMIT_MB})")
    return int(megabytes * 2**20)


def cache_files(directory: str | Path) -> list[Path]:
    """The reference files under `directory`, least recently used first (a load touches its file)."""
    files = [p for p in Path(directory).glob("??/*.safetensors") if p.is_file()]
    return sorted(files, key=lambda p: p.stat().st_mtime)


def trim_cache(directory: str | Path, limit: int) -> int:
    """Delete least recently used references until the directory holds at most `limit` bytes; returns how many
    were deleted. Deleting is safe: a missing reference is generated again when an episode needs it."""
    files = cache_files(directory)
    sizes = [p.stat().st_size for p in files]
    total, removed = sum(sizes), 0
    for path, size in zip(files, sizes):
        if total <= limit:
            break
        path.unlink(missing_ok=True)
        total -= size
        removed += 1
    return removed


@dataclass
class Reference:
    video: torch.Tensor  # (F, H, W, 3) uint8
    latency_s: float
    generated: bool  # True when made by this call, False when loaded


def reference_key(fields: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def _digest(video: torch.Tensor, meta: dict[str, str]) -> str:
    """sha256 of the video bytes, shape and dtype, and every metadata field but the digest itself."""
    digest = hashlib.sha256(video.contiguous().numpy().tobytes())
    digest.update(json.dumps([list(video.shape), str(video.dtype)]).encode())
    digest.update(json.dumps({k: v for k, v in meta.items() if k != "sha256"}, sort_keys=True).encode())
    return digest.hexdigest()


class ReferenceCache:
    def __init__(self, directory: str | Path | None = None):
        self.directory = Path(directory) if directory is not None else default_cache_dir()
        self.generated = 0  # how many references this instance had to generate
        self.limit = cache_limit_bytes()  # read once: a bad value fails at construction, not mid-training
        self._bytes: int | None = None  # the directory's size as this instance last knew it

    def check_writable(self) -> bool:
        """Warn (once, here) when references cannot be kept in the directory; True when they can."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=self.directory):
                pass
            return True
        except OSError as error:
            warnings.warn(f"reference_cache_dir {self.directory} is not writable ({error}): references will be "
                          "regenerated for every episode; pass reference_cache_dir= or set MORCA_CACHE_DIR to a "
                          "writable directory", stacklevel=3)
            return False

    def path_for(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.safetensors"

    def load(self, fields: dict[str, Any]) -> Reference | None:
        key = reference_key(fields)
        path = self.path_for(key)
        if not path.exists():
            return None
        try:
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
            tensors = load_file(str(path))
            video = tensors["video"]
            if set(tensors) != {"video"} or meta.get("key") != key or meta.get("sha256") != _digest(video, meta):
                raise ValueError("checksum or key mismatch")
            with contextlib.suppress(OSError):
                os.utime(path)  # recently used: the size bound evicts the others first
            return Reference(video=video, latency_s=float(meta["latency_s"]), generated=False)
        except Exception as error:  # truncated, corrupt, or foreign file
            warnings.warn(f"reference file {path} is unreadable ({error}); regenerating it", stacklevel=2)
            return None

    def store(self, fields: dict[str, Any], video: torch.Tensor, latency_s: float) -> Path:
        if video.dtype != torch.uint8:
            raise TypeError(f"references are stored as uint8 videos, got {video.dtype}")
        key = reference_key(fields)
        path = self.path_for(key)
        meta = {"key": key, "latency_s": repr(float(latency_s)),
                "fields": json.dumps(fields, sort_keys=True, default=str), "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
        meta["sha256"] = _digest(video, meta)
        with atomic_path(path) as tmp:
            save_file({"video": video.contiguous()}, str(tmp), metadata=meta)
        size = path.stat().st_size
        if self._bytes is None:  # one scan per instance; then counted, so a store costs no directory walk
            self._bytes = sum(p.stat().st_size for p in cache_files(self.directory))
        else:
            self._bytes += size
        if self._bytes > self.limit:
            trim_cache(self.directory, max(self.limit, size))  # the file just written is the newest: kept
            self._bytes = None
        return path

    def get_or_create(self, fields: dict[str, Any], generate: Callable[[], tuple[torch.Tensor, float]]) -> Reference:
        """Load the reference for `fields`, or call `generate() -> (uint8 video, latency_s)` and store it."""
        found = self.load(fields)
        if found is not None:
            return found
        video, latency = generate()
        self.generated += 1
        try:
            self.store(fields, video, latency)
        except OSError as error:  # read-only or full disk: the episode can still use the video
            warnings.warn(f"could not store the reference in {self.directory} ({error}); it is used for this "
                          "episode only", stacklevel=2)
        return Reference(video=video, latency_s=latency, generated=True)
