"""What a Wan pipeline's structure means for caching, worked out once for the denoiser and `accelerate`.

Wan2.1 has one transformer; Wan2.2 has two experts (`transformer_2`), the
high-noise one running while t >= boundary_ratio * num_train_timesteps. Each
expert keeps its own residual cache, so the first step of the low-noise expert
must recompute, as must the first and last steps. Classifier-free guidance
(guidance_scale > 1) runs a "cond" and an "uncond" branch per step, each with
its own residual.
"""

from __future__ import annotations

import copy

from ..budget import BudgetSpec, forced_recompute_steps


def experts(pipe) -> list:
    """The pipeline's transformers in the order they run (high-noise expert first)."""
    found = [m for m in (getattr(pipe, "transformer", None), getattr(pipe, "transformer_2", None)) if m is not None]
    if not found:
        raise ValueError("the pipeline has no transformer")
    if len(found) == 2 and getattr(pipe.config, "boundary_ratio", None) is None:
        raise ValueError("a pipeline with transformer_2 needs `boundary_ratio` in its config")
    return found


def expert_of_steps(pipe, timesteps) -> list[int]:
    """Index of the expert that runs each step (0 for every step of a one-expert pipeline)."""
    if len(experts(pipe)) == 1:
        return [0] * len(timesteps)
    boundary = pipe.config.boundary_ratio * pipe.scheduler.config.num_train_timesteps
    return [0 if t >= boundary else 1 for t in timesteps]


def switch_step(expert_of_step: list[int]) -> int | None:
    """First step of the low-noise expert (Wan2.2), else None."""
    return expert_of_step.index(1) if 1 in expert_of_step else None


def pipeline_timesteps(pipe, num_steps: int):
    """The timesteps the pipeline's scheduler runs for `num_steps` (on a private copy of the scheduler)."""
    scheduler = copy.deepcopy(pipe.scheduler)
    scheduler.set_timesteps(num_steps)
    return scheduler.timesteps


def budget_spec(pipe, num_steps: int) -> BudgetSpec:
    """Forced steps of an N-step generation with this pipeline."""
    return BudgetSpec(num_steps, forced_recompute_steps(num_steps, switch_step(
        expert_of_steps(pipe, pipeline_timesteps(pipe, num_steps)))))


def branches(guidance_scale: float) -> tuple[str, ...]:
    """The cache-context names a step runs: both CFG branches when guidance is on."""
    return ("cond", "uncond") if guidance_scale > 1.0 else ("cond",)
