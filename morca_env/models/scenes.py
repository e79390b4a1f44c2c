"""MorcaScenes: the packaged pixel-space Wan model whose videos differ in motion, complexity and events.

`WanTransformer3DModel` (4 blocks, width 96 in 3 heads of 32, patch (2, 2, 2): one token is 2 frames of a
2x2-pixel square, so a clip is 6 x 8 x 8 = 384 tokens) over 3 x 12 x 16 x 16 RGB videos
of the `scenes_data` grammar, trained on the `scenes-train` prompts only. See
its model card (MorcaScenes-v0 in the documentation).

Why 16x16 and not 32x32 with patch (2, 4, 4) at the same token count: a token then
carries 96 pixel values, as many as the model's width, and a first model trained that
way drew 4x4 blocks of noise (prompt following 15-63% per factor). At patch (2, 2, 2)
a token carries 24 values, as in MorcaTiny, which draws clean shapes. Its heads (three
of 32; MorcaTiny has two of 48) tell the two models' speedup calibrations apart by
architecture: the lookup reads the transformer's config, which knows no video size.
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
        patch_size=(2, 2, 2), num_attention_heads=3, attention_head_dim=32, in_channels=3, out_channels=3,
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
