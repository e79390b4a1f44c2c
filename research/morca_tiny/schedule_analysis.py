"""Measurements of a model's caching problem: step error vs terminal error under fixed schedules.

`run_schedule` generates a video with a given schedule and records, at every
reuse step, SeaCache's accumulated distance and the true step error (paper
Fig. 1): the relative L1 difference between the cached residual and the one a
recompute would give, measured by a probe transformer call in a separate cache
context (so the cached residuals are untouched).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from morca_env.diffusion.denoiser import StepwiseDenoiser
from morca_env.diffusion.features import latent_features
from morca_env.diffusion.metrics import psnr, to_uint8
from morca_env.diffusion.signals import StepDistanceTracker, signal_input_for_step


@dataclass
class ScheduleRun:
    schedule: list[int]
    psnr: float
    step_errors: list[float] = field(default_factory=list)  # one per step (0 on recompute steps)
    distances: list[float] = field(default_factory=list)  # SeaCache D_t at each step
    latent_stats: list[np.ndarray] = field(default_factory=list)  # phi(x_t) summary per step

    @property
    def summed_step_error(self) -> float:
        return float(np.sum(self.step_errors))


@torch.no_grad()
def probe_step_error(den: StepwiseDenoiser) -> float:
    """Relative L1 between the cached cond residual and a fresh one, at the denoiser's current step."""
    i = den.step_index
    model, cache = den.expert(i), den.cache_for(i)
    cached = cache.residual("cond")
    reuse = cache.reuse
    cache.reuse = False
    with model.cache_context("probe"):
        model(hidden_states=den.latents.to(den.transformer_dtype), timestep=den.timestep(i).expand(1),
              encoder_hidden_states=den.prompt_embeds, return_dict=False)
    cache.reuse = reuse
    fresh = cache.residual("probe")
    return float((cached - fresh).abs().mean() / (fresh.abs().mean() + 1e-12))


@torch.no_grad()
def run_schedule(den: StepwiseDenoiser, prompt: str, seed: int, schedule: list[int], reference: torch.Tensor,
                 signal_kind: str = "official", probe: bool = True) -> ScheduleRun:
    """Generate with `schedule` and record step errors, distances and latent statistics."""
    tracker = StepDistanceTracker(kind=signal_kind)
    den.start(prompt=prompt, seed=seed)
    run = ScheduleRun(schedule=list(schedule), psnr=0.0)
    for action in schedule:
        i = den.step_index
        tracker.observe(signal_input_for_step(signal_kind, den), den.sigma(i))
        run.distances.append(tracker.accumulated)
        feats = latent_features(den.latents)
        run.latent_stats.append(np.array([feats.pooled.std().item(), feats.mean.abs().mean().item(),
                                          feats.var.mean().item()]))
        run.step_errors.append(probe_step_error(den) if (action and probe) else 0.0)
        tracker.record(action)
        den.step(reuse=bool(action))
    run.psnr = psnr(to_uint8(den.decode()), reference)
    return run
