"""The registered model settings (paper App. A); their speedup calibrations live in `morca_env.speedup.files`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..diffusion.denoiser import DenoiserConfig
from . import scenes_data, tiny_data


@dataclass(frozen=True)
class TrainingPrompts:
    """Which training prompts each command uses when given none: slices of the model's training suite,
    disjoint from one another where one validates another, and never from its evaluation suite."""

    trainers: str | None  # agents' episodes: the offline datasets' prompts, whose references are cached
    fit_fixed: str  # `morca fit-fixed`: the best fixed schedule's search
    select_on: str  # its validation (`--select-on`)
    fit_rules: str  # `morca fit-rules`: the cache rules' thresholds
    anchor: str  # `morca anchor`: the anchored scheduler's margin


@dataclass(frozen=True)
class ModelPreset:
    name: str
    env_id: str
    description: str
    config: DenoiserConfig
    load: Callable[..., object]  # (model_id, device, dtype) -> WanPipeline
    train_suite: str
    eval_suite: str
    speedup_range: tuple[float, float]  # default per-episode target range (the paper's data ranges)
    r_max: float
    eval_targets: tuple[float, ...] = (2.4, 3.0, 4.0)  # default speedups of morca evaluate (paper Sec. 4.1)
    gpu_dtype: torch.dtype = torch.bfloat16
    prefers_gpu: bool = True
    model_id: str | None = None
    extra: dict = field(default_factory=dict)
    prompts: TrainingPrompts | None = None  # the commands' default training prompts (None: VBench's)

    def __post_init__(self):
        if self.prompts is None:
            object.__setattr__(self, "prompts", TrainingPrompts(
                trainers=None, fit_fixed=f"{self.train_suite}:12", select_on=f"{self.train_suite}[12:32]",
                fit_rules=f"{self.train_suite}:4", anchor=f"{self.train_suite}[32:56]"))


def _load_wan21(model_id, device, dtype):
    from .wan import load_wan_pipeline

    return load_wan_pipeline("wan21", model_id, device, dtype)


def _load_wan22(model_id, device, dtype):
    from .wan import load_wan_pipeline

    return load_wan_pipeline("wan22", model_id, device, dtype)


def _load_tiny(model_id, device, dtype):
    from .tiny import load_morca_tiny

    return load_morca_tiny(device=device, dtype=dtype, directory=model_id)


def _load_scenes(model_id, device, dtype):
    from .scenes import load_morca_scenes

    return load_morca_scenes(device=device, dtype=dtype, directory=model_id)


def _load_tiny_random(model_id, device, dtype):
    from .random_wan import build_tiny_wan_pipeline
    from .tiny_data import vocabulary

    pipe = build_tiny_wan_pipeline("wan21", channels=3, layers=2, vocabulary=vocabulary())
    return pipe.to(device) if dtype == torch.float32 else pipe.to(device=device, dtype=dtype)


PRESETS: dict[str, ModelPreset] = {
    "wan21": ModelPreset(
        name="wan21", env_id="MorcaWan21-v0", description="Wan2.1-T2V-1.3B, 480p, 81 frames, UniPC shift 3",
        config=DenoiserConfig(num_inference_steps=50, height=480, width=832, num_frames=81, guidance_scale=5.0),
        load=_load_wan21, train_suite="vbench-train", eval_suite="vbench-eval", speedup_range=(2.0, 4.5), r_max=40.0,
        model_id="Wan-AI/Wan2.1-T2V-1.3B-Diffusers",
    ),
    "wan22": ModelPreset(
        name="wan22", env_id="MorcaWan22-v0",
        description="Wan2.2-T2V-A14B (two experts, boundary 0.875), 480p, 45 frames, DPM++ flow solver",
        config=DenoiserConfig(num_inference_steps=50, height=480, width=832, num_frames=45, guidance_scale=4.0,
                              guidance_scale_2=3.0),
        load=_load_wan22, train_suite="vbench-train", eval_suite="vbench-eval", speedup_range=(1.5, 3.5), r_max=40.0,
        eval_targets=(1.8, 2.4, 3.0),
        model_id="Wan-AI/Wan2.2-T2V-A14B-Diffusers",
    ),
    "tiny": ModelPreset(
        name="tiny", env_id="MorcaTiny-v0",
        description=f"MorcaTiny: the packaged {tiny_data.FRAMES}x{tiny_data.HEIGHT}x{tiny_data.WIDTH} pixel-space "
                    "Wan-architecture model",
        config=DenoiserConfig(num_inference_steps=50, height=tiny_data.HEIGHT, width=tiny_data.WIDTH,
                              num_frames=tiny_data.FRAMES, guidance_scale=5.0,
                              max_sequence_length=16),
        load=_load_tiny, train_suite="tiny-train", eval_suite="tiny-eval", speedup_range=(1.5, 3.5), r_max=50.0,
        # Per-step work outside the blocks (signal, features, solver) is ~22% of a full step on
        # this small model, so the ceiling is ~4.1x on a CPU (packaged calibration, 2026-12-01).
        eval_targets=(2.0, 2.5, 3.0), gpu_dtype=torch.float32, prefers_gpu=False, prompts=TrainingPrompts(
            trainers="tiny-train:250", fit_fixed="tiny-train[::464]", select_on="tiny-train[11:2651:132]",
            fit_rules="tiny-train:4", anchor="tiny-train[7::44]"),
    ),
    "scenes": ModelPreset(
        name="scenes", env_id="MorcaScenes-v0",
        description=f"MorcaScenes: the packaged {scenes_data.FRAMES}x{scenes_data.HEIGHT}x{scenes_data.WIDTH} "
                    "pixel-space Wan-architecture model whose videos differ in motion, complexity and events",
        config=DenoiserConfig(num_inference_steps=50, height=scenes_data.HEIGHT, width=scenes_data.WIDTH,
                              num_frames=scenes_data.FRAMES, guidance_scale=5.0, max_sequence_length=16),
        load=_load_scenes, train_suite="scenes-train", eval_suite="scenes-eval", speedup_range=(1.5, 3.5),
        r_max=50.0, eval_targets=(2.0, 2.5, 3.0), gpu_dtype=torch.float32, prefers_gpu=False,
        # 12 and 19 prompts spread over the shuffled grammar for the fixed schedule, disjoint from each other
        # and from the anchored datasets' scenes-train[5::22]
        prompts=TrainingPrompts(
            trainers="scenes-train:250", fit_fixed="scenes-train[::1030]", select_on="scenes-train[11::660]",
            fit_rules="scenes-train:4", anchor="scenes-train[7::44]"),
    ),
    "tiny-random": ModelPreset(
        name="tiny-random", env_id="MorcaTinyRandom-v0",
        description="random-weights tiny Wan pipeline (4x16x16 pixels, 20 steps): tests and smoke runs only",
        config=DenoiserConfig(num_inference_steps=20, height=16, width=16, num_frames=4, guidance_scale=5.0,
                              max_sequence_length=16),
        load=_load_tiny_random, train_suite="tiny-train", eval_suite="tiny-eval", speedup_range=(1.5, 3.0),
        r_max=50.0, eval_targets=(1.5, 2.0, 2.5), gpu_dtype=torch.float32, prefers_gpu=False,
        prompts=TrainingPrompts(trainers=None, fit_fixed="tiny-train[::464]", select_on="tiny-train[11:2651:132]",
                                fit_rules="tiny-train:4", anchor="tiny-train[7::44]"),
    ),
}


def get_preset(name: str) -> ModelPreset:
    if name not in PRESETS:
        raise ValueError(f"unknown model {name!r}; valid models: {', '.join(PRESETS)}")
    return PRESETS[name]


def preset_for_env(env_id: str) -> ModelPreset:
    """The model preset behind a registered env id (where a command's defaults come from)."""
    for preset in PRESETS.values():
        if preset.env_id == env_id:
            return preset
    raise ValueError(f"env_id={env_id!r} is not a MORCA env; valid: {', '.join(p.env_id for p in PRESETS.values())}")
