"""Tiny random-weights Wan pipelines, built in memory.

They exercise exactly the code paths of the real Wan2.1 / Wan2.2 pipelines
(``WanPipeline`` with a ``WanTransformer3DModel``, optional second expert,
optional ``AutoencoderKLWan``, a word-level tokenizer and a small
``UMT5EncoderModel``) at a size that runs in milliseconds on a CPU. Their
outputs are noise-like: use them for tests and smoke runs, never for results.
"""

from __future__ import annotations

from typing import Iterable

import torch
from diffusers import (
    AutoencoderKLWan,
    DPMSolverMultistepScheduler,
    UniPCMultistepScheduler,
    WanPipeline,
    WanTransformer3DModel,
)

from .text import build_word_tokenizer, build_text_encoder


def wan21_scheduler(flow_shift: float = 3.0) -> UniPCMultistepScheduler:
    """Wan2.1-T2V's sampler: UniPC with flow prediction and shifted flow sigmas."""
    return UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=flow_shift, num_train_timesteps=1000
    )


def wan22_scheduler(flow_shift: float = 12.0) -> DPMSolverMultistepScheduler:
    """The paper's Wan2.2 sampler: a DPM++ (2nd-order multistep) flow solver."""
    return DPMSolverMultistepScheduler(
        algorithm_type="dpmsolver++", solver_order=2, prediction_type="flow_prediction", use_flow_sigmas=True,
        flow_shift=flow_shift, num_train_timesteps=1000,
    )


def tiny_transformer(in_channels: int = 4, dim: int = 32, heads: int = 2, layers: int = 2, text_dim: int = 16,
                     patch_size=(1, 2, 2), seed: int = 0) -> WanTransformer3DModel:
    torch.manual_seed(seed)
    model = WanTransformer3DModel(
        patch_size=tuple(patch_size), num_attention_heads=heads, attention_head_dim=dim // heads,
        in_channels=in_channels, out_channels=in_channels, text_dim=text_dim, freq_dim=32, ffn_dim=2 * dim,
        num_layers=layers, cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
    )
    # random init leaves the output projection tiny; scale it so steps actually move the latent
    with torch.no_grad():
        for block in model.blocks:
            block.scale_shift_table.normal_(0, 0.5)
    return model.eval()


def tiny_vae(z_dim: int = 4, seed: int = 0) -> AutoencoderKLWan:
    torch.manual_seed(seed)
    return AutoencoderKLWan(
        base_dim=4, z_dim=z_dim, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True],
        latents_mean=[0.1 * i for i in range(z_dim)], latents_std=[1.0 + 0.1 * i for i in range(z_dim)],
    ).eval()


def build_tiny_wan_pipeline(
    kind: str = "wan21",
    *,
    with_text_encoder: bool = True,
    with_vae: bool = False,
    channels: int = 4,
    layers: int = 2,
    vocabulary: Iterable[str] = (),
    seed: int = 0,
) -> WanPipeline:
    """A random-weights ``WanPipeline`` with Wan2.1's (`kind="wan21"`) or Wan2.2's (`"wan22"`) structure.

    Without a VAE the pipeline works in "pixel space": the latent has `channels`
    channels at full resolution (scale factors 1), like MorcaTiny.
    """
    if kind not in ("wan21", "wan22"):
        raise ValueError(f"kind={kind!r} must be 'wan21' or 'wan22'")
    text_dim = 16
    tokenizer = text_encoder = None
    if with_text_encoder:
        tokenizer = build_word_tokenizer(vocabulary)
        text_encoder = build_text_encoder(len(tokenizer), d_model=text_dim, seed=seed)
    vae = tiny_vae(z_dim=channels, seed=seed) if with_vae else None
    transformer = tiny_transformer(channels, layers=layers, text_dim=text_dim, seed=seed)
    kwargs = {}
    if kind == "wan22":
        kwargs = dict(transformer_2=tiny_transformer(channels, layers=layers, text_dim=text_dim, seed=seed + 1),
                      boundary_ratio=0.875)
    scheduler = wan21_scheduler() if kind == "wan21" else wan22_scheduler()
    pipe = WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, scheduler=scheduler,
                       transformer=transformer, **kwargs)
    if vae is None:
        set_pixel_space(pipe)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def set_pixel_space(pipe: WanPipeline) -> WanPipeline:
    """Make a VAE-less WanPipeline draw latents at full resolution (scale factors 1)."""
    pipe.vae_scale_factor_temporal = 1
    pipe.vae_scale_factor_spatial = 1
    pipe.video_processor.config.vae_scale_factor = 1
    return pipe
