"""Real Wan backends: loading Wan2.1-T2V-1.3B and Wan2.2-T2V-A14B with diffusers, offline-friendly.

Weights come from the Hugging Face hub cache or a local directory
(``model_id="/path/to/Wan2.1-T2V-1.3B-Diffusers"``). When neither is available
the error says which model id is needed and how to point at local weights.
The sampler is set to the paper's (App. A): UniPC (flow shift 3) for Wan2.1, a
DPM++ multistep flow solver (shift 12, the official sample_shift) for Wan2.2.
"""

from __future__ import annotations

import os

import torch

from .loading import quiet_loading

WAN21_MODEL_ID = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
WAN22_MODEL_ID = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"
_SIZES = {WAN21_MODEL_ID: "about 30 GB (1.3B transformer, umT5-XXL encoder, VAE)",
          WAN22_MODEL_ID: "about 125 GB (two 14B experts, umT5-XXL encoder, VAE)"}


class WanWeightsNotFound(OSError):
    """The Wan weights are neither in the Hugging Face cache nor at a local path."""


def _not_found_message(model_id: str, error: Exception) -> str:
    size = _SIZES.get(model_id, "")
    return (
        f"could not load the Wan pipeline {model_id!r}{f' ({size})' if size else ''}: {type(error).__name__}: {error}\n"
        f"  - download it once on a machine with internet: `huggingface-cli download {model_id}` "
        "(then set HF_HUB_OFFLINE=1 to stay offline), or\n"
        "  - point to a local copy: gym.make(..., model_id='/path/to/local/diffusers/folder'), or\n"
        "  - pass an already built pipeline: gym.make(..., pipeline=WanPipeline.from_pretrained(...))"
    )


def apply_paper_sampler(pipe, kind: str):
    """Replace the pipeline's scheduler with the paper's sampler for `kind` ('wan21' or 'wan22')."""
    from diffusers import DPMSolverMultistepScheduler, UniPCMultistepScheduler

    if kind == "wan21":
        pipe.scheduler = UniPCMultistepScheduler.from_config(
            pipe.scheduler.config, prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    elif kind == "wan22":
        pipe.scheduler = DPMSolverMultistepScheduler.from_config(
            pipe.scheduler.config, algorithm_type="dpmsolver++", solver_order=2, prediction_type="flow_prediction",
            use_flow_sigmas=True, flow_shift=12.0)
    else:
        raise ValueError(f"kind={kind!r} must be 'wan21' or 'wan22'")
    return pipe


def load_wan_pipeline(kind: str, model_id: str | None = None, device: str | torch.device = "cuda",
                      dtype: torch.dtype = torch.bfloat16):
    """``WanPipeline.from_pretrained`` with the VAE in float32 (as diffusers' Wan examples do)."""
    from diffusers import AutoencoderKLWan, WanPipeline

    model_id = model_id or (WAN21_MODEL_ID if kind == "wan21" else WAN22_MODEL_ID)
    local_only = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    try:
        with quiet_loading():
            vae = AutoencoderKLWan.from_pretrained(model_id, subfolder="vae", dtype=torch.float32,
                                                   local_files_only=local_only)
            pipe = WanPipeline.from_pretrained(model_id, vae=vae, dtype=dtype, local_files_only=local_only)
    except (OSError, ValueError, EnvironmentError) as error:
        raise WanWeightsNotFound(_not_found_message(model_id, error)) from error
    apply_paper_sampler(pipe, kind)
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device)
