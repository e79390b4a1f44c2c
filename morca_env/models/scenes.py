"""MorcaScenes: the packaged pixel-space Wan model whose videos differ in motion, complexity and events.

`WanTransformer3DModel` (4 blocks, width 96, patch (2, 4, 4): one token is 2 frames of a
4x4-pixel square, so a clip is 6 x 8 x 8 = 384 tokens) over 3 x 12 x 32 x 32 RGB videos
of the `scenes_data` grammar. See ``docs/morca_scenes.md`` (the model card).
"""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import WanPipeline

from . import pixel_model
from .scenes_data import FRAMES, HEIGHT, WIDTH, vocabulary

MODEL = pixel_model.PixelModel(
    name="morca-scenes-v0", title="MorcaScenes", vocabulary=vocabulary,
    transformer_config=dict(
        patch_size=(2, 4, 4), num_attention_heads=2, attention_head_dim=48, in_channels=3, out_channels=3,
        freq_dim=64, ffn_dim=384, num_layers=4, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    ),
    frames=FRAMES, height=HEIGHT, width=WIDTH, remake="morca train-testbed --model scenes",
)


class MorcaScenesWeightsError(pixel_model.PixelModelWeightsError):
    """The packaged MorcaScenes weights are missing or corrupt."""


def load_morca_scenes(device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                      directory: str | Path | None = None) -> WanPipeline:
    """Load the packaged MorcaScenes pipeline offline (verified against its manifest)."""
    return pixel_model.load(MODEL, device, dtype, directory, MorcaScenesWeightsError)
