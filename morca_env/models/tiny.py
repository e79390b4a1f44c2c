"""MorcaTiny: a small pixel-space text-to-video model of Wan's architecture, trained by this project.

A stock diffusers ``WanPipeline``: ``WanTransformer3DModel`` (4 blocks, width 96,
patch (2, 2, 2): one token is 2 frames of a 2x2-pixel square, so time is 4 tokens), a
word-level tokenizer with a 2-layer ``UMT5EncoderModel``,
Wan2.1's sampler (UniPC, flow prediction, shift 3) and no VAE: the "latent" is
the RGB video itself (3 x 8 x 16 x 16, values in [-1, 1]). The weights ship
inside the package and load offline with ``WanPipeline.from_pretrained``.
See ``docs/morca_tiny.md`` (the model card) and ``scripts/tiny/train_tiny.py``.
"""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path

import torch
from diffusers import WanPipeline, WanTransformer3DModel

from .loading import quiet_loading
from .random_wan import set_pixel_space, wan21_scheduler
from .text import build_text_encoder, build_word_tokenizer
from .tiny_data import FRAMES, HEIGHT, WIDTH, vocabulary

MODEL_NAME = "morca-tiny-v0"
MAX_SEQUENCE_LENGTH = 16
TEXT_DIM = 32
TRANSFORMER_CONFIG = dict(
    patch_size=(2, 2, 2), num_attention_heads=2, attention_head_dim=48, in_channels=3, out_channels=3,
    text_dim=TEXT_DIM, freq_dim=64, ffn_dim=384, num_layers=4, cross_attn_norm=True,
    qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
)
GENERATION = dict(num_inference_steps=50, height=HEIGHT, width=WIDTH, num_frames=FRAMES, guidance_scale=5.0,
                  max_sequence_length=MAX_SEQUENCE_LENGTH)
MANIFEST = "manifest.json"


class MorcaTinyWeightsError(RuntimeError):
    """The packaged MorcaTiny weights are missing or corrupt."""


def build_untrained(seed: int = 0) -> WanPipeline:
    """MorcaTiny's architecture with fresh weights (the starting point of training)."""
    torch.manual_seed(seed)
    tokenizer = build_word_tokenizer(vocabulary())
    text_encoder = build_text_encoder(len(tokenizer), d_model=TEXT_DIM, layers=2, heads=4, seed=seed)
    transformer = WanTransformer3DModel(**TRANSFORMER_CONFIG)
    pipe = WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=None, scheduler=wan21_scheduler(3.0),
                       transformer=transformer)
    pipe.set_progress_bar_config(disable=True)
    return set_pixel_space(pipe)


def weights_dir() -> Path:
    return Path(str(resources.files("morca_env.models"))) / "weights" / MODEL_NAME


def file_digests(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file() and p.name != MANIFEST}


def verify_weights(directory: Path | None = None) -> Path:
    """Check every weight file against the manifest; raise `MorcaTinyWeightsError` with the reason."""
    directory = directory or weights_dir()
    manifest = directory / MANIFEST
    if not manifest.is_file():
        raise MorcaTinyWeightsError(
            f"MorcaTiny weights not found at {directory} (no {MANIFEST}). Reinstall the package "
            "(`pip install -e .`) or rebuild them with `python scripts/tiny/train_tiny.py`."
        )
    expected = json.loads(manifest.read_text())["sha256"]
    actual = file_digests(directory)
    for name, digest in expected.items():
        if name not in actual:
            raise MorcaTinyWeightsError(f"MorcaTiny weight file {directory / name} is missing; reinstall the package")
        if actual[name] != digest:
            raise MorcaTinyWeightsError(
                f"MorcaTiny weight file {directory / name} is corrupt (sha256 mismatch); reinstall the package "
                "or rebuild it with `python scripts/tiny/train_tiny.py`"
            )
    return directory


def load_morca_tiny(device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                    directory: str | Path | None = None) -> WanPipeline:
    """Load the packaged MorcaTiny pipeline offline (verified against its manifest)."""
    directory = verify_weights(Path(directory) if directory is not None else None)
    with quiet_loading():
        pipe = WanPipeline.from_pretrained(str(directory), vae=None, dtype=dtype, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return set_pixel_space(pipe).to(device)


def save_morca_tiny(pipe: WanPipeline, directory: Path, extra: dict | None = None) -> None:
    """save_pretrained + a manifest of sha256 digests (written last: its presence marks a complete save)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MANIFEST).unlink(missing_ok=True)
    pipe.save_pretrained(str(directory), safe_serialization=True)
    manifest = {"model": MODEL_NAME, "sha256": file_digests(directory), **(extra or {})}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
