"""A Wan denoising loop that pauses between steps, so a scheduler can decide each step's cache use.

``WanPipeline.__call__`` runs all steps in one call. `StepwiseDenoiser` performs
the same operations, in the same order, over the pipeline's own components:
``encode_prompt`` once (or injected prompt embeddings), ``prepare_latents``,
``scheduler.set_timesteps``, then per step the cond and uncond transformer calls
inside ``transformer.cache_context(...)``, classifier-free guidance and
``scheduler.step``; finally the VAE decode (or, for pixel-space models without a
VAE, the latent itself is the video). With no reuse its final latents equal the
pipeline's ``output_type="latent"`` result.

Wan2.2 (``transformer_2`` and ``boundary_ratio``): the high-noise expert runs
while t >= boundary_ratio * num_train_timesteps, then the low-noise expert with
``guidance_scale_2``. Each expert has its own residual cache.
"""

from __future__ import annotations

import copy
import os
import time
import warnings
from dataclasses import dataclass
from typing import Sequence

import torch

from . import wan_structure
from .cache import ResidualCache


@dataclass
class DenoiserConfig:
    """Generation settings (defaults: Wan2.1-T2V-1.3B at 480p, paper App. A)."""

    num_inference_steps: int = 50
    height: int = 480
    width: int = 832
    num_frames: int = 81
    guidance_scale: float = 5.0
    guidance_scale_2: float | None = None
    negative_prompt: str = ""
    max_sequence_length: int = 512

    def __post_init__(self):
        for name in ("num_inference_steps", "height", "width", "num_frames", "max_sequence_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        for name in ("guidance_scale", "guidance_scale_2"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and value >= 0):
                raise ValueError(f"{name}={value!r} must be a non-negative number")


@dataclass(frozen=True)
class DenoiserSnapshot:
    index: int
    latents: torch.Tensor  # never written in place: each step makes a new tensor
    scheduler: object  # a private deep copy
    caches: list  # ResidualCache.snapshot() per expert
    elapsed_s: float
    last_velocity: torch.Tensor | None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepwiseDenoiser:
    """Runs a diffusers ``WanPipeline``'s denoising one step at a time with a residual cache.

    Usage::

        den = StepwiseDenoiser(pipe, DenoiserConfig(...))
        den.start(prompt="a red ball", seed=0)
        while not den.done:
            den.step(reuse=False)
        video = den.decode()          # (F, H, W, 3) float32 in [0, 1]
    """

    def __init__(self, pipe, config: DenoiserConfig | None = None, device: str | torch.device | None = None):
        self.pipe = pipe
        self.config = config or DenoiserConfig()
        top = int(getattr(pipe.scheduler.config, "num_train_timesteps", 1000))
        if self.config.num_inference_steps > top:  # before anything is attached or allocated
            raise ValueError(f"num_inference_steps={self.config.num_inference_steps} exceeds the {top} timesteps "
                             f"of this model's scheduler; valid: 2 to {top} (Wan uses 50)")
        self.device = torch.device(device) if device is not None else pipe._execution_device
        self.experts = wan_structure.experts(pipe)
        self.caches = [ResidualCache.attach(m, owner=self) for m in self.experts]
        # a private scheduler: its multistep history must not leak between episodes or into the pipeline
        self.scheduler = copy.deepcopy(pipe.scheduler)
        self.scheduler.set_timesteps(self.config.num_inference_steps, device=self.device)
        self.timesteps = self.scheduler.timesteps
        self._sigmas = self.scheduler.sigmas.tolist()  # read every step; a tensor index + float() cost ~20 us in an episode
        self.expert_of_step = wan_structure.expert_of_steps(pipe, self.timesteps)
        self._latents: torch.Tensor | None = None
        self._cond = self._uncond = None  # the video's text embeddings (`start`)
        self._input = self._input_of = None  # model_input's tensor and the latents it was made from
        self.last_velocity: torch.Tensor | None = None  # guided model output of the latest step
        self._index = self.num_steps
        self.elapsed_s = 0.0
        self.run_id = 0  # counts start() calls: what is read once per video (signals' time modulation) keys on it

    # ----------------------------------------------------------------- structure
    @property
    def prompt_embeds(self) -> torch.Tensor | None:
        """The conditional branch's text embeddings of the current video (None before `start`)."""
        return self._cond

    @property
    def num_steps(self) -> int:
        return len(self.timesteps)

    @property
    def transformer_dtype(self) -> torch.dtype:
        # ModelMixin.dtype walks every submodule (about 1 ms on the tiny model, each step);
        # the patch embedding's weight has the same dtype and costs nothing.
        return self.experts[0].patch_embedding.weight.dtype

    @property
    def in_channels(self) -> int:
        return self.experts[0].config.in_channels

    @property
    def do_cfg(self) -> bool:
        return self.config.guidance_scale > 1.0

    @property
    def branches(self) -> tuple[str, ...]:
        return wan_structure.branches(self.config.guidance_scale)

    @property
    def expert_switch_step(self) -> int | None:
        """First step of the low-noise expert (Wan2.2), else None."""
        return wan_structure.switch_step(self.expert_of_step)

    # ------------------------------------------------------------------- episode
    @property
    def step_index(self) -> int:
        return self._index

    @property
    def done(self) -> bool:
        return self._index >= self.num_steps

    @property
    def batch_size(self) -> int:
        """Videos in the current run: 1 after `start`, len(prompts) after `start_batch`."""
        return self.latents.shape[0]

    @property
    def latents(self) -> torch.Tensor:
        if self._latents is None:
            raise RuntimeError("call start() first")
        return self._latents

    def sigma(self, step: int) -> float:
        return self._sigmas[step]

    def timestep(self, step: int) -> torch.Tensor:
        return self.timesteps[step]

    def expert(self, step: int):
        return self.experts[self.expert_of_step[step]]

    def cache_for(self, step: int) -> ResidualCache:
        return self.caches[self.expert_of_step[step]]

    # the RunView of morca_env.schedulers.rules.runtime: what rules that read run-time signals see of this run
    def step_input(self, step: int) -> tuple:
        """(transformer, model input, timestep) of `step`, the next step to run."""
        if self._index != step or self.done:
            raise RuntimeError(f"the run is at step {self._index}, not {step}: a run-time rule decides each step "
                               "before it runs, in order")
        return self.expert(step), self.model_input(), self.timestep(step).expand(self.latents.shape[0])

    def model_input(self) -> torch.Tensor:
        """The latents in the transformer's dtype, converted once per step for the signal and the step's calls."""
        if self._input_of is not self._latents:
            self._input, self._input_of = self.latents.to(self.transformer_dtype), self._latents
        return self._input

    def patch_embedding(self) -> torch.Tensor:
        """The current step's patch embedding of `model_input()`, (B, D, F', H', W'): model work, timed as the
        step's. The official signal reads it before the decision; both CFG branches' transformer calls then
        get it from the cache's memo instead of recomputing it."""
        t0 = time.perf_counter()
        with torch.no_grad():
            tokens = self.expert(self._index).patch_embedding(self.model_input())
        self.elapsed_s += time.perf_counter() - t0
        return tokens

    def cache(self, step: int) -> ResidualCache:
        return self.cache_for(step)

    def cache_valid(self, step: int) -> bool:
        return self.cache_for(step).is_valid(self.branches)

    @torch.no_grad()
    def encode(self, prompt: str | None = None, prompt_embeds: torch.Tensor | None = None,
               negative_prompt_embeds: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Prompt embeddings (cond, uncond) in the transformer's dtype."""
        has_encoder = getattr(self.pipe, "text_encoder", None) is not None
        negative = None
        if prompt_embeds is None:
            if prompt is None:
                raise ValueError("pass a prompt or prompt_embeds")
            if not has_encoder:
                raise ValueError("this pipeline has no text encoder: pass prompt_embeds (and negative_prompt_embeds)")
            warn_if_truncated(self.pipe, prompt, self.config.max_sequence_length)
            negative = self.config.negative_prompt
        else:
            prompt = None
            if self.do_cfg and negative_prompt_embeds is None:
                if not has_encoder:
                    raise ValueError("guidance needs negative_prompt_embeds when the pipeline has no text encoder")
                negative = [self.config.negative_prompt]
        cond, uncond = self.pipe.encode_prompt(
            prompt=prompt,
            negative_prompt=negative,
            do_classifier_free_guidance=self.do_cfg,
            num_videos_per_prompt=1,
            prompt_embeds=prompt_embeds,
            negative_prompt_embeds=negative_prompt_embeds,
            max_sequence_length=self.config.max_sequence_length,
            device=self.device,
        )
        cond = cond.to(device=self.device, dtype=self.transformer_dtype)
        uncond = uncond.to(device=self.device, dtype=self.transformer_dtype) if uncond is not None else None
        return cond, uncond

    @torch.no_grad()
    def start(self, prompt: str | None = None, seed: int = 0, prompt_embeds: torch.Tensor | None = None,
              negative_prompt_embeds: torch.Tensor | None = None, latents: torch.Tensor | None = None) -> torch.Tensor:
        """Begin a new video: encode, draw the initial noise, reset scheduler and caches."""
        t0 = time.perf_counter()
        self._cond, self._uncond = self.encode(prompt, prompt_embeds, negative_prompt_embeds)
        self._latents = self._initial_noise(seed, latents)
        return self._begin(t0)

    @torch.no_grad()
    def start_batch(self, prompts: Sequence[str], seeds: Sequence[int]) -> torch.Tensor:
        """Begin len(prompts) videos run in lockstep, one batch through every step: sample n's text embeddings and
        initial noise are exactly those of `start(prompt=prompts[n], seed=seeds[n])` (each encoded and drawn on its
        own, so a batch never changes a sample's inputs). `step` then takes one decision per sample."""
        if len(prompts) != len(seeds) or not len(prompts):
            raise ValueError(f"start_batch needs one seed per prompt and at least one video; got {len(prompts)} "
                             f"prompts and {len(seeds)} seeds")
        t0 = time.perf_counter()
        encoded = [self.encode(prompt) for prompt in prompts]
        self._cond = torch.cat([cond for cond, _ in encoded])
        self._uncond = torch.cat([uncond for _, uncond in encoded]) if encoded[0][1] is not None else None
        self._latents = torch.cat([self._initial_noise(seed) for seed in seeds])
        return self._begin(t0)

    def _initial_noise(self, seed: int, latents: torch.Tensor | None = None) -> torch.Tensor:
        generator = torch.Generator("cpu").manual_seed(int(seed))
        return self.pipe.prepare_latents(
            1, self.in_channels, self.config.height, self.config.width, self.config.num_frames,
            torch.float32, self.device, generator, latents,
        )

    def _begin(self, t0: float) -> torch.Tensor:
        self.scheduler.set_timesteps(self.config.num_inference_steps, device=self.device)
        self.scheduler.set_begin_index(0)
        self._sigmas = self.scheduler.sigmas.tolist()
        self.run_id += 1
        for cache in self.caches:
            cache.claim(self)
        self._index = 0
        _sync(self.device)
        self.elapsed_s = time.perf_counter() - t0
        return self._latents

    @torch.no_grad()
    def step(self, reuse: bool | Sequence[bool]) -> torch.Tensor:
        """Run one denoising step (both CFG branches) reusing the cached residual or recomputing: one decision
        for the batch, or one per sample (`start_batch`; the recomputing samples run the blocks as a sub-batch)."""
        if self._latents is None or self.done:
            raise RuntimeError("no denoising step left: call start() to begin a new video")
        t0 = time.perf_counter()
        i = self._index
        t = self.timesteps[i]
        model = self.expert(i)
        cache = self.cache_for(i)
        if i == 0 and cache.owner != id(self):
            cache.claim(self)  # nothing of this video is cached yet: take the shared cache back
        cache.check_owner(self)
        per_sample = hasattr(reuse, "__len__")  # a list, tuple or array of per-sample decisions
        if per_sample and len(reuse) != self.batch_size:
            raise ValueError(f"step {i}: {len(reuse)} decisions for a batch of {self.batch_size} videos")
        if (any(reuse) if per_sample else reuse) and not cache.is_valid(self.branches):
            raise RuntimeError(f"step {i}: reuse needs a cached residual for branches {self.branches}")
        if per_sample:
            cache.decide(reuse)
        else:
            cache.reuse = bool(reuse)
        guidance = self.config.guidance_scale
        if self.expert_of_step[i] == 1 and self.config.guidance_scale_2 is not None:
            guidance = self.config.guidance_scale_2
        model_input = self.model_input()
        timestep = t.expand(self._latents.shape[0])
        context = {"step_index": i, "sigma": self.sigma(i), "num_inference_steps": self.num_steps}
        with model.cache_context("cond", **context):
            noise_pred = model(hidden_states=model_input, timestep=timestep, encoder_hidden_states=self._cond,
                               return_dict=False)[0]
        if self.do_cfg:
            with model.cache_context("uncond", **context):
                noise_uncond = model(hidden_states=model_input, timestep=timestep,
                                     encoder_hidden_states=self._uncond, return_dict=False)[0]
            noise_pred = noise_uncond + guidance * (noise_pred - noise_uncond)
        cache.reuse = False
        self.last_velocity = noise_pred
        self._latents = self.scheduler.step(noise_pred, t, self._latents, return_dict=False)[0]
        self._index += 1
        _sync(self.device)
        self.elapsed_s += time.perf_counter() - t0
        return self._latents

    def snapshot(self) -> "DenoiserSnapshot":
        """The state before the next step: enough to resume this video from here (see `restore`)."""
        return DenoiserSnapshot(self._index, self._latents, copy.deepcopy(self.scheduler),
                                [cache.snapshot() for cache in self.caches], self.elapsed_s, self.last_velocity)

    def restore(self, snapshot: "DenoiserSnapshot") -> None:
        """Continue the video from `snapshot` (taken by this denoiser, after the same `start`); the
        snapshot stays valid for further restores. Steps then give what they gave the first time."""
        self._index, self._latents = snapshot.index, snapshot.latents
        self.scheduler = copy.deepcopy(snapshot.scheduler)
        for cache, state in zip(self.caches, snapshot.caches):
            cache.claim(self)
            cache.restore(state)
        self.elapsed_s, self.last_velocity = snapshot.elapsed_s, snapshot.last_velocity

    def decode(self) -> torch.Tensor:
        """The finished video as (F, H, W, 3) float32 in [0, 1] on the CPU."""
        if self._latents is not None and self.batch_size != 1:
            raise RuntimeError(f"decode() gives one video; this run holds {self.batch_size}: call decode_batch()")
        return self.decode_batch()[0]

    @torch.no_grad()
    def decode_batch(self) -> torch.Tensor:
        """The finished videos as (B, F, H, W, 3) float32 in [0, 1] on the CPU."""
        if not self.done or self._latents is None:
            raise RuntimeError("decode() needs all denoising steps to be run")
        t0 = time.perf_counter()
        latents = self._latents
        vae = getattr(self.pipe, "vae", None)
        if vae is not None:
            latents = latents.to(vae.device, dtype=vae.dtype)
            z_dim = vae.config.z_dim
            mean = torch.tensor(vae.config.latents_mean).view(1, z_dim, 1, 1, 1).to(latents)
            inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, z_dim, 1, 1, 1).to(latents)
            video = vae.decode(latents / inv_std + mean, return_dict=False)[0]
        else:  # pixel-space model: the latent is the video in [-1, 1]
            video = latents
        video = (video.float() / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 4, 1).contiguous().cpu()
        _sync(self.device)
        self.elapsed_s += time.perf_counter() - t0
        return video

    def generate(self, schedule=None, **start_kwargs) -> torch.Tensor:
        """Convenience: a whole video with a fixed schedule (None = no reuse)."""
        self.start(**start_kwargs)
        actions = list(schedule) if schedule is not None else [0] * self.num_steps
        if len(actions) != self.num_steps:
            raise ValueError(f"schedule has {len(actions)} actions, expected {self.num_steps}")
        for a in actions:
            self.step(reuse=bool(a))
        return self.decode()

    def close(self) -> None:
        """Remove the cache hooks: the pipeline's transformers behave exactly as before."""
        for cache in self.caches:
            cache.detach(self)
        self.caches = []


_truncation_warned: set[tuple[str, int]] = set()


def warn_if_truncated(pipe, prompt, max_length: int) -> None:
    """Warn (once per prompt) when the text encoder will read only the first `max_length` tokens of `prompt`:
    two prompts that differ after that give the same video (MorcaTiny reads 16 tokens, Wan 512)."""
    tokenizer = getattr(pipe, "tokenizer", None)
    if tokenizer is None or not isinstance(prompt, str) or (prompt, max_length) in _truncation_warned:
        return
    count = len(tokenizer(prompt, add_special_tokens=True).input_ids)
    if count > max_length:
        _truncation_warned.add((prompt, max_length))
        warnings.warn(f"prompt {prompt[:60]!r}... has {count} tokens and this model reads the first {max_length}: "
                      "prompts that differ only after that give the same video", stacklevel=3)


def batch_memory_bytes(denoiser, batch: int) -> int:
    """An estimate of the device memory a batched step of `batch` videos holds at its peak: per video, one block's
    activations (hidden states, q, k, v, attention output and the feed-forward's hidden layer), the residual of
    each CFG branch of each expert (float32), the patch embedding memo and the latents."""
    model = denoiser.experts[0]
    config = model.config
    pipe = denoiser.pipe
    latent_frames = (denoiser.config.num_frames - 1) // getattr(pipe, "vae_scale_factor_temporal", 1) + 1
    spatial = getattr(pipe, "vae_scale_factor_spatial", 1)
    patch_t, patch_h, patch_w = config.patch_size
    tokens = (latent_frames // patch_t) * (denoiser.config.height // spatial // patch_h) * \
        (denoiser.config.width // spatial // patch_w)
    dim = config.num_attention_heads * config.attention_head_dim
    element = torch.finfo(denoiser.transformer_dtype).bits // 8
    activations = tokens * (6 * dim + config.ffn_dim) * element * 2  # both CFG branches' calls may overlap
    residuals = len(denoiser.branches) * len(denoiser.experts) * tokens * dim * 4
    latents = config.in_channels * latent_frames * (denoiser.config.height // spatial) * \
        (denoiser.config.width // spatial) * 4 * 4  # latents, model input, velocity, scheduler history
    return batch * (activations + residuals + tokens * dim * element + latents)


def free_memory_bytes(device: torch.device) -> int:
    """Free memory of `device`: CUDA's own count, else the machine's available RAM (Linux), else unknown (-1)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return -1


def check_batch_memory(denoiser, batch: int) -> None:
    """Refuse a batch (or one video: `batch=1`) whose step would not fit the device's free memory, naming both and
    what fits, before anything that size is allocated."""
    need = batch_memory_bytes(denoiser, batch)
    free = free_memory_bytes(denoiser.device)
    if 0 <= free < need and batch == 1:
        c = denoiser.config
        raise ValueError(f"height={c.height}, width={c.width}, num_frames={c.num_frames}: one denoising step needs "
                         f"about {need / 2**30:.2f} GiB on {denoiser.device} and {free / 2**30:.2f} GiB are free; "
                         "valid here: a smaller video (memory grows with height x width x num_frames)")
    if 0 <= free < need:
        per_video = max(1, need // batch)
        raise ValueError(f"num_envs={batch}: a batched step needs about {need / 2**30:.2f} GiB on {denoiser.device} "
                         f"and {free / 2**30:.2f} GiB are free; valid here: num_envs <= {max(free // per_video, 0)}")
