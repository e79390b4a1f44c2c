"""MorcaEnv: cache scheduling for Wan video denoising as a budget-constrained MDP (MORCA, Sec. 3.2 / App. D)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
import warnings
from dataclasses import asdict, replace
from typing import Any, NamedTuple, Sequence

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from .budget import BudgetSpec, forced_recompute_steps
from .speedup.calibration import BUDGET_ROUNDINGS, SpeedupCalibration, seed_dither
from .diffusion.denoiser import DenoiserConfig, StepwiseDenoiser, check_batch_memory
from .diffusion.metrics import Lpips, LpipsUnavailable, to_uint8, video_metrics
from .speedup.files import check_calibration, resolve as resolve_calibration
from .models.presets import ModelPreset, get_preset
from .prompts import PromptSuite, get_suite
from .diffusion.reference_videos import ReferenceCache
from .observation import (SCALAR_NAMES, ObservationBuilder, check_feature_dtype, check_mask_dtype,  # noqa: F401
                          check_observation, observation_space, parse_action, present)  # (SCALAR_NAMES re-exported)
from .diffusion.signals import SIGNAL_KINDS, signal_input_for_step

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_LPIPS_WARNED = False
MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed takes a signed 64-bit integer


def _check_device(device) -> torch.device:
    """`device` as a torch.device that exists on this machine."""
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device={device!r} is not a torch device; valid: 'cpu', 'cuda', 'cuda:<index>'") from error
    if resolved.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"device={device!r} but CUDA is not available on this machine; valid here: 'cpu'")
        if resolved.index is not None and resolved.index >= count:
            raise ValueError(f"device={device!r}: this machine has {count} CUDA device(s); valid: cuda:0..cuda:{count - 1}")
    return resolved


RESET_OPTIONS = ("prompt", "seed", "speedup", "budget", "scheduler_cost_s")


class EpisodeStart(NamedTuple):
    """What a reset starts: the prompt, the generation seed, the target speedup (None when set by a budget) and K."""

    prompt: str
    seed: int
    target_speedup: float | None
    budget: int


def episode_info(start: EpisodeStart, spec: BudgetSpec, schedule: list[int], used: int, num_projected: int,
                 reference_latency_s: float, with_lpips: bool, step: int = -1, action: int = -1, requested: int = -1,
                 projected: bool = False, final: dict | None = None, reference_generated: bool = False) -> dict:
    """An episode's info, the same keys after reset and after every step, as plain picklable values with no None
    (MorcaEnv's and each MorcaVectorEnv sub-env's): tianshou stacks infos into arrays (a missing key or a None
    becomes NaN and stops it), async vector envs, sb3's SubprocVecEnv and Ray pickle them. What only the end knows
    (`psnr`, `ssim`, `lpips`, and the timings `latency_s`, `speedup`, `overhead_s`, so check_env's determinism
    check holds) is 0.0 until the terminal step; `schedule` is the N decisions so far, -1 where not yet made;
    `step` / `action` / `requested_action` are -1 after reset; `target_speedup` is 0.0 when the episode was set by
    a budget; `reference_generated` says whether this call generated the reference video (only a reset can)."""
    ends = {"psnr": 0.0, "ssim": 0.0, **({"lpips": 0.0} if with_lpips else {}),
            "latency_s": 0.0, "speedup": 0.0, "overhead_s": 0.0}
    return {"prompt": start.prompt, "seed": start.seed, "budget": start.budget,
            "target_speedup": start.target_speedup or 0.0, "num_steps": spec.num_steps,
            "forced_steps": sorted(spec.forced), "reference_generated": reference_generated,
            "step": step, "action": action, "requested_action": requested, "projected": projected,
            "reuses": used, "num_reuse": used, "num_projected": num_projected,
            "schedule": list(schedule) + [-1] * (spec.num_steps - len(schedule)),
            "reference_latency_s": reference_latency_s, **ends, **(final or {})}


def _is_number(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


class MorcaEnv(gym.Env):
    """Decide, at every denoising step of a Wan video, whether to reuse SeaCache's cached residual.

    ## Description

    One episode generates one video with a diffusers Wan pipeline. At each of the
    N denoising steps the agent either recomputes the transformer blocks (action 0)
    or reuses the residual cached at the last recompute (action 1), for both
    classifier-free-guidance branches at once. A target speedup rho* is turned into
    an exact reuse budget K (K = alpha - beta / rho, calibrated latencies); the
    action mask keeps exactly K reuses attainable (the augmented MDP of the
    MORCA paper, App. D), so every episode hits its budget.

    ## Variants

    | id                   | model                                   | for                                   |
    |----------------------|-----------------------------------------|---------------------------------------|
    | `MorcaWan21-v0`      | Wan2.1-T2V-1.3B (GPU, weights)          | the paper's setting                   |
    | `MorcaWan22-v0`      | Wan2.2-T2V-A14B, two experts (GPU)      | the paper's setting                   |
    | `MorcaTiny-v0`       | packaged, 8 x 16 x 16 px, one shape     | the whole pipeline on a CPU           |
    | `MorcaScenes-v0`     | packaged, 12 x 16 x 16 px, scenes       | content-dependent scheduling on a CPU |
    | `MorcaTinyRandom-v0` | MorcaTiny's architecture, random weights| tests                                 |

    MorcaTiny's videos (one shape on a near-flat background) all pose the same
    denoising problem; MorcaScenes' prompts set motion (still to a camera pan),
    complexity (1-3 objects, five background textures), a temporal event and a
    scale change independently, so schedules can depend on the content. Both
    are testbeds for methods at CPU scale, trained by this project; results on
    them are not evidence about Wan (their model cards say what they are).

    ## Action Space

    `Discrete(2)`: 0 = recompute, 1 = reuse. An infeasible action is projected onto
    the feasible one and flagged with `info["projected"] = True`; use
    `obs["action_mask"]` or `action_masks()` (sb3-contrib) to avoid that.

    ## Observation Space

    A `Dict`:

    | key           | shape          | content                                                        |
    |---------------|----------------|----------------------------------------------------------------|
    | `pooled`      | (3C, 4, 8, 8)  | P3 pools of x_t, x_{t+1} (previous step), x_{j_t} (last recompute) |
    | `temporal`    | (6C, 8, 8)     | P2 pools of the temporal means (3C) then variances (3C) of the same |
    | `scalars`     | (7,)           | d_t, D_t, t, l_t, u_t, K, cache-valid bit                      |
    | `action_mask` | (2,) int8      | [recompute feasible, reuse feasible] (`mask_dtype="bool"`: bool) |

    Two tracks: `observation="full"` (the default, above) and `observation="scalars"`, a Dict of `scalars` and
    `action_mask` alone (no latent features computed). `flat=True` gives either track as one float32 Box in
    the flat layout's order, the mask first (`morca_env.observation.FLAT_KEYS`; the scalars track: 9 values).

    C is the latent's channel count (16 for Wan, 3 for the pixel-space testbeds). d_t is SeaCache's
    filtered step distance and D_t its sum since the last recompute (unbounded);
    t = remaining steps / N, l_t = steps since the last recompute / N,
    u_t = reuses so far / N, K = budget / N. The flat form (`FlattenObservation(env)`,
    `to_replay_buffer`'s default) is in that order (`morca_env.observation.FLAT_KEYS`).

    ## Rewards

    0 at every step but the last, then min(PSNR(video, reference), r_max) in dB,
    the reference being the no-cache video for the same prompt and seed.

    ## Starting State

    `reset` draws a prompt and generation seed from the prompt suite and a target
    speedup (or takes `options["prompt"]`, `options["seed"]`, `options["speedup"]`
    / `options["budget"]`; `options["scheduler_cost_s"]`, the driving scheduler's
    own seconds per step, is counted when a speedup becomes K), encodes the prompt,
    draws the initial noise and makes sure the reference video exists (generated once, cached on disk).

    ## Episode End

    After N steps: `terminated=True` (never truncated). `info` has the same keys
    after reset and every step (plain values, no None, so vector envs, tianshou's
    buffers and Ray take it); the final one holds `psnr`, `ssim`, `lpips` (when
    LPIPS weights are available), `schedule` (N 0/1 decisions; -1 marks steps not
    yet taken before the end), `num_reuse`, `budget`, `target_speedup` (0.0 when
    set by a budget), `latency_s`, `reference_latency_s` and `speedup` =
    `reference_latency_s / latency_s` (the end-only values are 0.0 before it). `reference_latency_s` is a
    stock (no-reuse) generation timed by this env in this process, once, on its
    first reset (after a warm-up run when the reference came from disk); the
    latency stored with a cached reference is never used, since it may come from
    a cold first run or another machine. Timings drift with a machine's load:
    `morca evaluate` times stock runs next to each prompt's episodes.

    ## Arguments

    ```python
    gym.make("MorcaTiny-v0", speedup=3.0)            # or budget=25, or speedup=(1.5, 4.5)
    gym.make("MorcaScenes-v0", speedup=3.0)          # the CPU testbed whose videos differ in content
    gym.make("MorcaWan21-v0", speedup=3.0)           # real Wan2.1 (GPU, weights)
    gym.make("MorcaWan21-v0", pipeline=my_pipe)      # any already built WanPipeline
    ```

    `speedup`, `budget`, `prompts` (suite name or list), `num_inference_steps`,
    `height`, `width`, `num_frames`, `guidance_scale`, `guidance_scale_2`,
    `negative_prompt`, `r_max`, `device`, `dtype`, `pipeline`, `model_id`,
    `reference_cache_dir`, `lpips`, `signal` ("official" or "latent"), `calibration`,
    `enforce_budget` (default True; False only forbids reuse on forced steps, for
    behaviour-data collection whose episodes are relabelled with their realised K),
    `budget_rounding` ("dither", the default: a target speedup between two attainable
    ones runs floor(K*) or ceil(K*) by a draw keyed on the generation seed, so the
    mean realised speedup over episodes is the target; "nearest": always the K with
    the nearest predicted speedup), `latent_features` (default True on the full track; False leaves
    `pooled` and `temporal` at zero and skips computing them, for rule schedulers and
    scalar-state policies: a cheaper env, so measure its own calibration), `feature_dtype`
    ("float32", the default, or "float16": the dtype of `pooled` and `temporal`, as the
    project's datasets store them, so a dataset's observation space equals its recovered env's), `mask_dtype`
    ("int8", the default and gymnasium's convention, a MultiBinary space; or "bool", a boolean Box, which
    torchrl's `ActionMask` and masked `QValueModule` take as they are), `observation` ("full" or "scalars",
    the track) and `flat` (default False; True: one flat vector, for flat-input libraries and datasets).
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 8}

    def __init__(
        self,
        model: str = "tiny",
        *,
        speedup: float | tuple[float, float] | None = None,
        budget: int | None = None,
        prompts: str | Sequence[str] | PromptSuite | None = None,
        num_inference_steps: int | None = None,
        height: int | None = None,
        width: int | None = None,
        num_frames: int | None = None,
        guidance_scale: float | None = None,
        guidance_scale_2: float | None = None,
        negative_prompt: str | None = None,
        r_max: float | None = None,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        pipeline: Any = None,
        model_id: str | None = None,
        reference_cache_dir: str | None = None,
        lpips: bool = True,
        signal: str = "official",
        calibration: SpeedupCalibration | str | None = None,
        enforce_budget: bool = True,
        budget_rounding: str = "dither",
        latent_features: bool | None = None,
        feature_dtype: str = "float32",
        mask_dtype: str = "int8",
        observation: str = "full",
        flat: bool = False,
        render_mode: str | None = None,
    ):
        super().__init__()
        self.observation = check_observation(observation)
        if latent_features is None:
            latent_features = observation == "full"
        for name, flag in (("latent_features", latent_features), ("lpips", lpips), ("enforce_budget", enforce_budget),
                           ("flat", flat)):
            if not isinstance(flag, (bool, np.bool_)):
                raise TypeError(f"{name}={flag!r} must be True or False")
        if latent_features and observation != "full":
            raise ValueError(f"latent_features=True with observation={observation!r}, which has none; valid: "
                             "observation='full' for latent features")
        self.flat = bool(flat)
        if negative_prompt is not None and not isinstance(negative_prompt, str):
            raise TypeError(f"negative_prompt={negative_prompt!r} must be a string")
        if reference_cache_dir is not None and not isinstance(reference_cache_dir, (str, os.PathLike)):
            raise TypeError(f"reference_cache_dir={reference_cache_dir!r} must be a directory path")
        check_calibration(calibration)
        self.latent_features = bool(latent_features)
        self.feature_dtype = check_feature_dtype(feature_dtype)  # before the pipeline loads
        self.mask_dtype = check_mask_dtype(mask_dtype)
        if budget_rounding not in BUDGET_ROUNDINGS:
            raise ValueError(f"budget_rounding={budget_rounding!r}; valid: {BUDGET_ROUNDINGS}")
        self.budget_rounding = budget_rounding
        self.preset: ModelPreset = get_preset(model)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode={render_mode!r}; valid: {self.metadata['render_modes']}")
        self.render_mode = render_mode
        if signal not in SIGNAL_KINDS:
            raise ValueError(f"signal={signal!r}; valid: {SIGNAL_KINDS}")
        self.signal_kind = signal
        if r_max is not None and not (_is_number(r_max) and 0 < r_max < math.inf):
            raise ValueError(f"r_max={r_max!r} must be a positive finite number of dB")
        self.r_max = float(self.preset.r_max if r_max is None else r_max)
        self.suite = get_suite(prompts if prompts is not None else self.preset.train_suite)

        overrides = {k: v for k, v in dict(num_inference_steps=num_inference_steps, height=height, width=width,
                                           num_frames=num_frames, guidance_scale=guidance_scale,
                                           guidance_scale_2=guidance_scale_2, negative_prompt=negative_prompt).items()
                     if v is not None}
        self.config: DenoiserConfig = replace(self.preset.config, **overrides)

        if pipeline is None:
            self.device = _check_device(device) if device is not None else torch.device(
                "cuda" if self.preset.prefers_gpu and torch.cuda.is_available() else "cpu")
            self.dtype = self._resolve_dtype(dtype)
            pipeline = self.preset.load(model_id, self.device, self.dtype)
        elif not (hasattr(pipeline, "transformer") and hasattr(pipeline, "scheduler")):
            raise TypeError(f"pipeline must be a diffusers WanPipeline, got {type(pipeline).__name__}")
        else:  # an injected pipeline stays where and as it is
            self.device = _check_device(device) if device is not None else pipeline._execution_device
            self.dtype = pipeline.transformer.dtype
        self.pipe = pipeline
        self.model_id = model_id or getattr(pipeline, "name_or_path", None) or self.preset.model_id or self.preset.name
        self.denoiser = StepwiseDenoiser(pipeline, self.config, device=self.device)
        try:
            self._finish_init(speedup, budget, calibration, enforce_budget, reference_cache_dir, lpips, signal)
        except BaseException:
            self.denoiser.close()  # leave an injected pipeline without our hooks
            raise

    def _finish_init(self, speedup, budget, calibration, enforce_budget, reference_cache_dir, lpips, signal):
        self.num_steps = self.denoiser.num_steps
        self.budget_spec = BudgetSpec(self.num_steps, forced_recompute_steps(self.num_steps, self.denoiser.expert_switch_step))
        if self.budget_spec.max_budget < 1:
            raise ValueError(f"num_inference_steps={self.num_steps} leaves no step that may reuse the cache "
                             f"(steps {sorted(self.budget_spec.forced)} always recompute); valid: "
                             f">= {len(self.budget_spec.forced) + 1}")
        self._check_video_shape()
        check_batch_memory(self.denoiser, 1)  # one video: a huge height or width is refused before it allocates
        self.calibration = resolve_calibration(self.preset.name if calibration is None else calibration,
                                               self.num_steps, self.budget_spec.max_budget)
        self.calibration = replace(self.calibration, max_budget=self.budget_spec.max_budget)
        self._speedup_spec, self._budget_default = self._validate_target(speedup, budget)
        self.enforce_budget = bool(enforce_budget)

        self.references = ReferenceCache(reference_cache_dir)
        self.references.check_writable()
        self._stock_latency_s: float | None = None
        self._fingerprint = self._pipeline_fingerprint()
        self._lpips = self._make_lpips(lpips)
        self.observer = ObservationBuilder(self.budget_spec, signal, latent_features=self.latent_features,
                                           feature_dtype=self.feature_dtype, mask_dtype=self.mask_dtype)

        self.observation_space = observation_space(self.denoiser.in_channels, self.feature_dtype, self.mask_dtype,
                                                   self.observation, self.flat)
        self.action_space = spaces.Discrete(2)
        self._episode_active = False
        self._ended = False
        self.last_video: torch.Tensor | None = None
        self.reference_video: torch.Tensor | None = None

    # ------------------------------------------------------------ construction
    def _resolve_dtype(self, dtype) -> torch.dtype:
        if dtype is None:
            return self.preset.gpu_dtype if self.device.type == "cuda" else torch.float32
        if isinstance(dtype, str):
            if dtype not in _DTYPES:
                raise ValueError(f"dtype={dtype!r}; valid: {', '.join(_DTYPES)}")
            return _DTYPES[dtype]
        if dtype not in _DTYPES.values():
            raise ValueError(f"dtype={dtype!r}; valid: {', '.join(_DTYPES)}")
        return dtype

    def _validate_target(self, speedup, budget):
        if speedup is not None and budget is not None:
            raise ValueError(f"pass speedup or budget, not both (got speedup={speedup!r}, budget={budget!r})")
        if budget is not None:
            return None, self.budget_spec.check_budget(budget)
        if speedup is None:
            lo, hi = self.preset.speedup_range
            hi = min(hi, self.calibration.speedup_range[1])
            if lo > hi:
                raise ValueError(f"num_inference_steps={self.num_steps}: the default speedup range "
                                 f"{self.preset.speedup_range} is outside the feasible range "
                                 f"[{self.calibration.speedup_range[0]:.2f}, {self.calibration.speedup_range[1]:.2f}]; "
                                 "pass speedup= or budget= within it, or more steps")
            return (lo, hi), None
        return self._check_speedup_spec(speedup), None

    def _check_speedup_spec(self, speedup):
        if _is_number(speedup):
            return self.calibration.check_speedup(float(speedup))
        if isinstance(speedup, (tuple, list)) and len(speedup) == 2 and all(_is_number(s) for s in speedup):
            lo, hi = (self.calibration.check_speedup(float(s)) for s in speedup)
            if lo > hi:
                raise ValueError(f"speedup range {tuple(speedup)} must be (low, high) with low <= high")
            return (lo, hi)
        raise ValueError(f"speedup={speedup!r} must be a number or a (low, high) pair in "
                         f"[{self.calibration.speedup_range[0]:.2f}, {self.calibration.speedup_range[1]:.2f}]")

    def _check_video_shape(self) -> None:
        """height, width and num_frames must fit the VAE's and the transformer's patch factors."""
        patch_t, patch_h, patch_w = self.denoiser.experts[0].config.patch_size
        spatial = getattr(self.pipe, "vae_scale_factor_spatial", 1)
        temporal = getattr(self.pipe, "vae_scale_factor_temporal", 1)
        for name, factor in (("height", spatial * patch_h), ("width", spatial * patch_w)):
            value = getattr(self.config, name)
            if value % factor:
                raise ValueError(f"{name}={value} must be a positive multiple of {factor} for this model "
                                 f"(VAE factor {spatial} x patch {factor // spatial})")
        frames = self.config.num_frames
        valid = [temporal * (patch_t * k - 1) + 1 for k in range(1, 5)]  # latent frames a multiple of the patch
        if (frames - 1) % temporal or ((frames - 1) // temporal + 1) % patch_t:
            raise ValueError(f"num_frames={frames} does not fit this model (VAE temporal factor {temporal}, "
                             f"temporal patch {patch_t}); valid: {', '.join(map(str, valid))}, ...")

    def _make_lpips(self, enabled: bool):
        global _LPIPS_WARNED
        if not enabled:
            return None
        try:
            return Lpips(self.device)
        except LpipsUnavailable as error:
            if not _LPIPS_WARNED:
                warnings.warn(f"LPIPS disabled: {error}", stacklevel=3)
                _LPIPS_WARNED = True
            return None

    def _pipeline_fingerprint(self) -> str:
        """Identifies the model for the reference cache: configs plus a sample of the weights."""
        digest = hashlib.sha256()
        digest.update(str(self.model_id).encode())
        digest.update(json.dumps(dict(self.denoiser.scheduler.config), sort_keys=True, default=str).encode())
        for model in self.denoiser.experts:
            digest.update(json.dumps(dict(model.config), sort_keys=True, default=str).encode())
            params = list(model.parameters())
            budget = 1 << 20
            for p in params[:8] + params[-2:]:
                flat = p.detach().reshape(-1)[:budget].float().cpu()
                digest.update(flat.numpy().tobytes())
        for name in ("text_encoder", "vae"):
            module = getattr(self.pipe, name, None)
            if module is not None:
                digest.update(json.dumps(module.config.to_dict() if hasattr(module.config, "to_dict")
                                         else dict(module.config), sort_keys=True, default=str).encode())
                first = next(module.parameters()).detach().reshape(-1)[:4096].float().cpu()
                digest.update(first.numpy().tobytes())
        return digest.hexdigest()[:16]

    # ----------------------------------------------------------------- episode
    def plan_episode(self, np_random: np.random.Generator, options: dict | None = None) -> EpisodeStart:
        """What a reset with these options starts, drawing what they leave open from `np_random` (the prompt and
        seed from the suite, then a speedup from the range): `reset` plays it, and `MorcaVectorEnv` plans each
        sub-env's episode with that sub-env's generator, so both give the same episode for the same seed."""
        if options is not None and not isinstance(options, dict):  # "prompt" or [] used to slip through
            raise TypeError(f"options={options!r} must be a dict (or None); keys: {', '.join(RESET_OPTIONS)}")
        options = dict(options or {})
        unknown = set(options) - set(RESET_OPTIONS)
        if unknown:
            raise ValueError(f"unknown reset options {sorted(unknown)}; valid: {', '.join(RESET_OPTIONS)}")
        prompt, gen_seed = self.suite.sample(np_random)
        if "prompt" in options:
            prompt = options["prompt"]
            if not isinstance(prompt, str) or not prompt.strip():
                raise ValueError(f"options['prompt']={prompt!r} must be a non-empty string")
        if "seed" in options:
            gen_seed = options["seed"]
            if isinstance(gen_seed, bool) or not isinstance(gen_seed, (int, np.integer)) or not 0 <= gen_seed <= MAX_SEED:
                raise ValueError(f"options['seed']={gen_seed!r} must be an integer in [0, 2**63 - 1]")
        target_speedup, budget = self._episode_target(options, np_random, int(gen_seed))
        return EpisodeStart(prompt, int(gen_seed), target_speedup, budget)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self._check_open("reset()")
        self._episode_active, self._ended = False, False  # until this reset succeeds
        super().reset(seed=seed)
        start = self.plan_episode(self.np_random, options)
        self.prompt, self.gen_seed, self.target_speedup, self.budget = start

        reference = self.references.get_or_create(self._reference_fields(), self._generate_reference)
        self.reference_video = reference.video
        self.reference_latency = self._stock_latency(reference)

        self.denoiser.start(prompt=self.prompt, seed=self.gen_seed)
        self.observer.reset(self.budget, self.enforce_budget)
        self._overhead_s = 0.0
        self.schedule: list[int] = []
        self.projected_count = 0
        self._episode_active, self._ended = True, False
        obs = self._observe()
        return obs, self._info(reference_generated=reference.generated)

    @property
    def run_view(self) -> StepwiseDenoiser:
        """The live run, for schedulers that read run-time signals (`rules.runtime`); never put in `info`,
        which must pickle."""
        return self.denoiser

    def _episode_target(self, options, np_random, gen_seed: int) -> tuple[float | None, int]:
        if "speedup" in options and "budget" in options:
            raise ValueError("reset options take speedup or budget, not both")
        if "budget" in options:
            return None, self.budget_spec.check_budget(options["budget"])
        cost = options.get("scheduler_cost_s", 0.0)
        if "speedup" in options:
            if not _is_number(options["speedup"]):
                raise ValueError(f"options['speedup']={options['speedup']!r} must be a number")
            rho = self.calibration.with_scheduler_cost(cost).check_speedup(options["speedup"])
            return rho, self.budget_for_speedup(rho, gen_seed, cost)
        if self._budget_default is not None:
            return None, self._budget_default
        spec = self._speedup_spec
        rho = spec if isinstance(spec, float) else float(np_random.uniform(spec[0], spec[1]))
        return rho, self.budget_for_speedup(rho, gen_seed, cost)

    def budget_for_speedup(self, speedup: float, seed: int, scheduler_cost_s: float = 0.0) -> int:
        """The K an episode with generation seed `seed` runs for a target speedup (this env's rounding):
        what `reset(options={"speedup": ...})` uses, for tools that plan at the same K (search, tables)."""
        calibration = self.calibration.with_scheduler_cost(scheduler_cost_s)
        dither = seed_dither(seed) if self.budget_rounding == "dither" else None
        return calibration.budget_for_speedup(calibration.check_speedup(speedup), dither)

    def _reference_fields(self) -> dict:
        return self.reference_fields(self.prompt, self.gen_seed)

    def reference_fields(self, prompt: str, seed: int) -> dict:
        """The reference cache's key fields of the no-cache video of (prompt, seed) with this env's model."""
        return {"model": self._fingerprint, "config": asdict(self.config), "prompt": prompt,
                "seed": seed, "dtype": str(self.dtype), "device": self.device.type}

    def _generate_reference(self) -> tuple[torch.Tensor, float]:
        video = self.denoiser.generate(schedule=None, prompt=self.prompt, seed=self.gen_seed)
        return to_uint8(video), self.denoiser.elapsed_s

    def _stock_latency(self, reference) -> float:
        """Seconds of a stock (no-reuse) generation, timed in this process once per env.

        The latency stored with a cached reference was taken whenever and wherever it was
        generated (a cold first run, another machine), so it never sets `info["speedup"]`.
        """
        if self._stock_latency_s is None:
            runs = 1 if reference.generated else 2  # without a fresh reference the model is still cold
            self._stock_latency_s = min(self._timed_stock_run() for _ in range(runs))
        return self._stock_latency_s

    def _timed_stock_run(self) -> float:
        self.denoiser.generate(schedule=None, prompt=self.prompt, seed=self.gen_seed)
        return self.denoiser.elapsed_s

    def action_masks(self) -> np.ndarray:
        """The current feasible-action mask as booleans (sb3-contrib's MaskablePPO convention)."""
        return self._mask.astype(bool)

    def _observe(self) -> dict[str, np.ndarray]:
        t0 = time.perf_counter()
        den, i = self.denoiser, self.denoiser.step_index
        model_s = den.elapsed_s  # the step's own work done early (its patch embedding) is not the env's
        if den.done:
            obs = self.observer.observe(None, den.latents)
        else:
            obs = self.observer.observe(i, den.latents, signal_input_for_step(self.signal_kind, den), den.sigma(i),
                                        den.cache_valid(i))
        self._overhead_s += time.perf_counter() - t0 - (den.elapsed_s - model_s)
        return present(obs, self.observation, self.flat)

    @property
    def _mask(self) -> np.ndarray:
        return self.observer.mask

    @property
    def used(self) -> int:
        return self.observer.used

    def step(self, action):
        self._check_open("step()")
        if not self._episode_active:
            if self._ended:
                raise RuntimeError(f"step() called after the episode ended ({self.num_steps} of {self.num_steps} "
                                   "steps done); call reset() to start a new episode")
            raise RuntimeError("step() called without a running episode (no reset() yet, or the last one failed); "
                               "call reset() first")
        requested = parse_action(action)
        i = self.denoiser.step_index
        executed, projected = self.observer.project(requested, i, self.denoiser.cache_valid(i))
        self.observer.record(i, executed)
        self.denoiser.step(reuse=bool(executed))
        self.schedule.append(executed)
        self.projected_count += int(projected)
        reward, terminated, final = 0.0, False, {}
        if self.denoiser.done:
            terminated = True
            video = to_uint8(self.denoiser.decode())
            self.last_video = video
            final = self.score_video(video, self.reference_video)
            reward = self.terminal_reward(final["psnr"])
            final["latency_s"] = latency = self.denoiser.elapsed_s + self._overhead_s
            final["speedup"] = self.reference_latency / latency
            final["overhead_s"] = self._overhead_s  # the one in latency_s (the terminal observation is not)
            self._episode_active, self._ended = False, True
        obs = self._observe()
        return obs, reward, terminated, False, self._info(i, executed, requested, projected, final)

    def _info(self, step: int = -1, action: int = -1, requested: int = -1, projected: bool = False,
              final: dict | None = None, reference_generated: bool = False) -> dict[str, Any]:
        """This episode's info now (`episode_info`)."""
        return episode_info(EpisodeStart(self.prompt, self.gen_seed, self.target_speedup, self.budget),
                            self.budget_spec, self.schedule, self.used, self.projected_count, self.reference_latency,
                            self._lpips is not None, step, action, requested, projected, final, reference_generated)

    def render(self):
        """rgb_array: the middle frame of the last finished video (or of the reference before any)."""
        video = self.last_video if self.last_video is not None else self.reference_video
        if video is None:
            return None
        return video[video.shape[0] // 2].numpy()

    def score_video(self, video: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
        """A finished uint8 video's `psnr`, `ssim` (and `lpips` where its weights are available) against the
        reference: what the last step's info reports."""
        return video_metrics(video, reference, self._lpips)

    @property
    def scores_lpips(self) -> bool:
        """Whether `score_video` (and so the final info) includes LPIPS."""
        return self._lpips is not None

    def terminal_reward(self, psnr: float) -> float:
        """The reward of a finished video with this PSNR: min(PSNR, r_max) (every side run scores with this)."""
        return float(min(psnr, self.r_max))

    def side_run(self) -> StepwiseDenoiser:
        """A private denoiser on this env's pipeline, config and device, for runs beside the episode (schedule
        search, replays, probes): the same model and noise as the env's episodes. The caller closes it."""
        return StepwiseDenoiser(self.pipe, self.config, device=self.device)

    def close(self):
        if getattr(self, "denoiser", None) is not None:
            self.denoiser.close()
        self._closed = True

    def _check_open(self, call: str) -> None:
        if getattr(self, "_closed", False):
            raise RuntimeError(f"{call} on a closed MorcaEnv (close() released its pipeline hooks); make a new env "
                               "with gym.make")
