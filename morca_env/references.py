"""On-disk cache of no-cache reference videos, one file per (model, config, prompt, seed).

A reference costs a full generation (minutes on a GPU for Wan), so it is made
once and shared by every episode and env instance that points to the same
directory. Files are written atomically; a file that is truncated, corrupt or
for another key is detected on load, reported with a warning and regenerated.
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import load_file, save_file

from .io import atomic_path
from .paths import cache_root


def default_cache_dir() -> Path:
    return cache_root() / "references"


@dataclass
class Reference:
    video: torch.Tensor  # (F, H, W, 3) uint8
    latency_s: float
    generated: bool  # True when made by this call, False when loaded


def reference_key(fields: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def _digest(video: torch.Tensor) -> str:
    return hashlib.sha256(video.contiguous().numpy().tobytes()).hexdigest()


class ReferenceCache:
    def __init__(self, directory: str | Path | None = None):
        self.directory = Path(directory) if directory is not None else default_cache_dir()
        self.generated = 0  # how many references this instance had to generate

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
            video = load_file(str(path))["video"]
            if meta.get("key") != key or meta.get("sha256") != _digest(video):
                raise ValueError("checksum or key mismatch")
            return Reference(video=video, latency_s=float(meta["latency_s"]), generated=False)
        except Exception as error:  # truncated, corrupt, or foreign file
            warnings.warn(f"reference file {path} is unreadable ({error}); regenerating it", stacklevel=2)
            return None

    def store(self, fields: dict[str, Any], video: torch.Tensor, latency_s: float) -> Path:
        if video.dtype != torch.uint8:
            raise TypeError(f"references are stored as uint8 videos, got {video.dtype}")
        key = reference_key(fields)
        path = self.path_for(key)
        meta = {"key": key, "sha256": _digest(video), "latency_s": repr(float(latency_s)),
                "fields": json.dumps(fields, sort_keys=True, default=str), "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
        with atomic_path(path) as tmp:
            save_file({"video": video.contiguous()}, str(tmp), metadata=meta)
        return path

    def get_or_create(self, fields: dict[str, Any], generate: Callable[[], tuple[torch.Tensor, float]]) -> Reference:
        """Load the reference for `fields`, or call `generate() -> (uint8 video, latency_s)` and store it."""
        found = self.load(fields)
        if found is not None:
            return found
        video, latency = generate()
        self.store(fields, video, latency)
        self.generated += 1
        return Reference(video=video, latency_s=latency, generated=True)
