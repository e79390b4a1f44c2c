"""MorcaTiny: a small pixel-space text-to-video model of Wan's architecture, trained by this project.

`WanTransformer3DModel` (4 blocks, width 96, patch (2, 2, 2): one token is 2 frames of a
2x2-pixel square, so time is 4 tokens) over 3 x 8 x 16 x 16 RGB videos of one shape
moving on a near-flat background (`tiny_data`). See its model card (MorcaTiny-v0 in the documentation)
and `morca_env.models.pixel_model` for what every packaged pixel model shares.
"""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import WanPipeline

from . import pixel_model
from .pixel_model import MANIFEST, file_digests  # noqa: F401  (part of this module's API)
from .tiny_data import FRAMES, HEIGHT, WIDTH, vocabulary

MODEL_NAME = "morca-tiny-v0"
MAX_SEQUENCE_LENGTH = 16
TEXT_DIM = 32
TRANSFORMER_CONFIG = dict(
    patch_size=(2, 2, 2), num_attention_heads=2, attention_head_dim=48, in_channels=3, out_channels=3,
    freq_dim=64, ffn_dim=384, num_layers=4, cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
)
MODEL = pixel_model.PixelModel(
    name=MODEL_NAME, title="MorcaTiny", vocabulary=vocabulary, transformer_config=TRANSFORMER_CONFIG,
    frames=FRAMES, height=HEIGHT, width=WIDTH, remake="morca train-testbed --model tiny", text_dim=TEXT_DIM,
    max_sequence_length=MAX_SEQUENCE_LENGTH,
)
GENERATION = MODEL.generation


class MorcaTinyWeightsError(pixel_model.PixelModelWeightsError):
    """The packaged MorcaTiny weights are missing or corrupt."""


def build_untrained(seed: int = 0) -> WanPipeline:
    """MorcaTiny's architecture with fresh weights (the starting point of training)."""
    return pixel_model.build_untrained(MODEL, seed)


def weights_dir() -> Path:
    return MODEL.weights_dir()


def verify_weights(directory: Path | None = None) -> Path:
    """Check every weight file against the manifest; raise `MorcaTinyWeightsError` with the reason."""
    return pixel_model.verify_weights(MODEL, directory, MorcaTinyWeightsError)


def load_morca_tiny(device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                    directory: str | Path | None = None) -> WanPipeline:
    """Load the packaged MorcaTiny pipeline offline (verified against its manifest)."""
    return pixel_model.load(MODEL, device, dtype, directory, MorcaTinyWeightsError)


def save_morca_tiny(pipe: WanPipeline, directory: Path, extra: dict | None = None) -> None:
    """save_pretrained + a manifest of sha256 digests (written last: its presence marks a complete save)."""
    pixel_model.save(MODEL, pipe, directory, extra)
