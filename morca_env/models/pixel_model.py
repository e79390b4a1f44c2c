"""The project's own pixel-space Wan models (MorcaTiny, MorcaScenes): one recipe, several worlds.

Each is a stock diffusers ``WanPipeline``: a ``WanTransformer3DModel``, a word-level
tokenizer over its grammar with a small ``UMT5EncoderModel``, Wan2.1's sampler (UniPC,
flow prediction, shift 3) and no VAE: the "latent" is the RGB video itself, in [-1, 1].
Weights ship inside the package with a sha256 manifest checked at load, and load
offline with ``WanPipeline.from_pretrained``. A `PixelModel` names what differs between
them; the functions here build, verify, load and save any of them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable

import torch
from diffusers import WanPipeline, WanTransformer3DModel

from .loading import quiet_loading
from .random_wan import set_pixel_space, wan21_scheduler
from .text import build_text_encoder, build_word_tokenizer

MANIFEST = "manifest.json"


class PixelModelWeightsError(RuntimeError):
    """A packaged model's weights are missing or corrupt."""


@dataclass(frozen=True)
class PixelModel:
    name: str  # the weights folder, e.g. "morca-tiny-v0"
    title: str  # for messages, e.g. "MorcaTiny"
    vocabulary: Callable[[], list[str]]
    transformer_config: dict
    frames: int
    height: int
    width: int
    remake: str  # the command that trains these weights, named in errors
    text_dim: int = 32
    text_layers: int = 2
    text_heads: int = 4
    max_sequence_length: int = 16
    generation: dict = field(default_factory=dict)

    def __post_init__(self):
        gen = dict(num_inference_steps=50, height=self.height, width=self.width, num_frames=self.frames,
                   guidance_scale=5.0, max_sequence_length=self.max_sequence_length)
        object.__setattr__(self, "generation", {**gen, **self.generation})

    def weights_dir(self) -> Path:
        return Path(str(resources.files("morca_env.models"))) / "weights" / self.name


def build_untrained(model: PixelModel, seed: int = 0) -> WanPipeline:
    """The model's architecture with fresh weights (the starting point of training)."""
    torch.manual_seed(seed)
    tokenizer = build_word_tokenizer(model.vocabulary())
    text_encoder = build_text_encoder(len(tokenizer), d_model=model.text_dim, layers=model.text_layers,
                                      heads=model.text_heads, seed=seed)
    transformer = WanTransformer3DModel(text_dim=model.text_dim, **model.transformer_config)
    pipe = WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=None, scheduler=wan21_scheduler(3.0),
                       transformer=transformer)
    pipe.set_progress_bar_config(disable=True)
    return set_pixel_space(pipe)


def file_digests(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file() and p.name != MANIFEST}


def verify_weights(model: PixelModel, directory: Path | None = None,
                   error: type[Exception] = PixelModelWeightsError) -> Path:
    """Check every weight file against the manifest; raise `error` with the reason."""
    directory = directory or model.weights_dir()
    manifest = directory / MANIFEST
    if not manifest.is_file():
        raise error(f"{model.title} weights not found at {directory} (no {MANIFEST}). Reinstall the package "
                    f"(`pip install -e .`) or rebuild them with `{model.remake}`.")
    expected = json.loads(manifest.read_text())["sha256"]
    actual = file_digests(directory)
    for name, digest in expected.items():
        if name not in actual:
            raise error(f"{model.title} weight file {directory / name} is missing; reinstall the package")
        if actual[name] != digest:
            raise error(f"{model.title} weight file {directory / name} is corrupt (sha256 mismatch); reinstall the "
                        f"package or rebuild it with `{model.remake}`")
    return directory


def load(model: PixelModel, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
         directory: str | Path | None = None, error: type[Exception] = PixelModelWeightsError) -> WanPipeline:
    """Load the packaged pipeline offline (verified against its manifest)."""
    directory = verify_weights(model, Path(directory) if directory is not None else None, error)
    with quiet_loading():
        pipe = WanPipeline.from_pretrained(str(directory), vae=None, dtype=dtype, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return set_pixel_space(pipe).to(device)


def save(model: PixelModel, pipe: WanPipeline, directory: Path, extra: dict | None = None) -> None:
    """save_pretrained + a manifest of sha256 digests (written last: its presence marks a complete save)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MANIFEST).unlink(missing_ok=True)
    pipe.save_pretrained(str(directory), safe_serialization=True)
    manifest = {"model": model.name, "sha256": file_digests(directory), **(extra or {})}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
