"""Deployment: let a cache scheduler drive a stock diffusers `WanPipeline` call under an exact reuse budget.

    result = morca_env.accelerate(pipe, policy, speedup=3.0, prompt="a cat surfing", num_inference_steps=50)
    frames, schedule = result.output.frames, result.schedule

`policy` is any scheduler with the `reset(obs, info)` / `policy(obs) -> action`
protocol (a trained `agents.MorcaPolicy`, `UniformInterval`, `SeaCacheThreshold`,
...). For the duration of the call, hooks on each transformer build the
scheduler's observation at the first (cond) transformer call of every step, ask
the policy, project its action onto the feasible set (so exactly K steps reuse)
and set the residual cache; the uncond branch follows the same decision. The
hooks are removed afterwards, whatever happens. With K = 0 the output is exactly
the stock pipeline's.

Rules that read run-time signals get the live call as `info["run_view"]` at reset
(the step's model input and timestep, the residual caches: see
`morca_env.schedulers.rules.runtime.RunView`). A policy with `prepare_call(replay, spec, budget)`
(the exact-budget forms of those rules) is first given a `Replay` of this very call
(same prompt, noise and settings, on a private `StepwiseDenoiser`) to search on; the
call's initial noise is then drawn here from its `generator` (as the pipeline would
draw it) and passed as `latents`, so the replays and the call start alike.

Batches (`prompt=[...]`, `prompt_embeds` of several rows, `num_videos_per_prompt > 1`): every video gets its
own scheduler (a list of one per video, or copies of the one given), its own budget (`speedup` / `budget`:
one value for all or one per video, in the pipeline's order: each prompt's videos together) and its own
decisions; the videos that recompute run the blocks as one sub-batch (`ResidualCache.decide`). Video n equals
a separate call with video n's prompt and generator (pass a list of generators, one per video, as diffusers
allows), up to float32 rounding. Run-time rules (which read one live run) need one video per call.

Note for the pixel-space testbeds (MorcaTiny, MorcaScenes: no VAE): `WanPipeline`
assumes a 4x temporal VAE and turns `num_frames=F` into F + 1 frames when the
temporal factor is 1; ask for `num_frames=7` (MorcaTiny's 8 frames) or 11
(MorcaScenes' 12) and `output_type="latent"`.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from diffusers.hooks import HookRegistry, ModelHook
from diffusers.hooks.hooks import BaseState, StateManager

from .diffusion import wan_structure
from .budget import BudgetSpec
from .speedup.calibration import SpeedupCalibration
from .speedup import files as calibration_files
from .diffusion.cache import ResidualCache
from .observation import BatchObservationBuilder, ObservationBuilder, parse_action
from .schedulers.rules.runtime import BatchRunView
from .diffusion.signals import SIGNAL_KINDS, official_signal_input

_DECISION_HOOK = "morca_decision"


@dataclass
class AccelerateResult:
    output: Any  # what the pipeline returned
    schedule: list[int] = field(default_factory=list)  # executed actions (1 = reuse); video 0's in a batch
    budget: int = 0  # video 0's in a batch
    num_projected: int = 0  # scheduler actions that were infeasible and got projected (all videos)
    latency_s: float = 0.0
    schedules: list[list[int]] = field(default_factory=list)  # every video's executed actions, in batch order
    budgets: list[int] = field(default_factory=list)  # every video's K


class _NoState(BaseState):
    def reset(self):
        pass


class _DecisionHook(ModelHook):
    """Runs before every transformer call; decides at the first branch of each step."""

    _is_stateful = True  # so that cache_context reaches our StateManager

    def __init__(self, run: "_Run", expert: int):
        super().__init__()
        self.run, self.expert = run, expert
        self.states = StateManager(_NoState)

    def pre_forward(self, module, *args, **kwargs):
        context = self.states._context
        if context is None or context.step_index is None:
            raise RuntimeError("accelerate() needs a pipeline that calls the transformer inside "
                               "cache_context(name, step_index=..., sigma=...), as diffusers' WanPipeline does")
        if context.name == "cond":
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            timestep = kwargs["timestep"] if "timestep" in kwargs else args[1]
            self.run.decide(module, self.expert, int(context.step_index), float(context.sigma), hidden, timestep)
        return args, kwargs

    def reset_state(self, module):
        self.states.reset()
        return module


class _Run:
    def __init__(self, pipe, policies: list, spec: BudgetSpec, budgets: list[int], signal: str, branches,
                 target_speedups: list[float | None]):
        self.pipe, self.policies, self.spec, self.budgets = pipe, policies, spec, budgets
        self.policy, self.budget = policies[0], budgets[0]
        self.target_speedups = target_speedups
        self.signal = signal
        self.experts = wan_structure.experts(pipe)
        self.caches = [ResidualCache.attach(m, owner=self) for m in self.experts]
        for cache in self.caches:
            cache.claim(self)
        if len(policies) == 1:  # one video: the env's own builder, bitwise the env's observations
            self.builder = ObservationBuilder(spec, signal)
            self.builder.reset(budgets[0])
        else:
            self.builder = BatchObservationBuilder(spec, signal)
            self.builder.reset(budgets)
        self.branches = branches
        self.result = AccelerateResult(output=None, budget=budgets[0], budgets=list(budgets),
                                       schedules=[[] for _ in budgets])
        self.result.schedule = self.result.schedules[0]
        self.current: tuple | None = None  # (transformer, model input, timestep) of the step being decided
        self.step_experts: dict[int, int] = {}
        self.hooks = []
        for index, model in enumerate(self.experts):
            registry = HookRegistry.check_if_exists_or_initialize(model)
            registry.register_hook(_DecisionHook(self, index), _DECISION_HOOK)
            registry.invalidate_child_registries_cache()
            self.hooks.append(registry)

    @torch.no_grad()
    def decide(self, module, expert: int, step: int, sigma: float, hidden, timestep) -> None:
        cache = self.caches[expert]
        self.current, self.step_experts[step] = (module, hidden, timestep), expert
        valid = cache.is_valid(self.branches())
        signal_input = (official_signal_input(module, hidden, timestep) if self.signal == "official" else hidden)
        if hidden.shape[0] != len(self.policies):
            raise RuntimeError(f"the pipeline runs {hidden.shape[0]} videos per transformer call; accelerate counted "
                               f"{len(self.policies)} from prompt / prompt_embeds and num_videos_per_prompt")
        obs = self.builder.observe(step, hidden, signal_input, sigma, valid)
        if len(self.policies) == 1:
            if step == 0:
                self.policy.reset(obs, self._info(0, self))
            executed, projected = self.builder.project(parse_action(self.policy(obs)), step, valid)
            self.builder.record(step, executed)
            cache.reuse = bool(executed)
            self.result.schedule.append(executed)
            self.result.num_projected += int(projected)
            return
        rows = [{k: v[n] for k, v in obs.items()} for n in range(len(self.policies))]
        if step == 0:
            for n, policy in enumerate(self.policies):
                policy.reset(rows[n], self._info(n, BatchRunView()))
        requested = [parse_action(policy(row)) for policy, row in zip(self.policies, rows)]
        executed, projected = self.builder.project(requested, step, valid)
        self.builder.record(step, executed)
        cache.decide(executed.astype(bool).tolist())
        for schedule, action in zip(self.result.schedules, executed):
            schedule.append(int(action))
        self.result.num_projected += int(projected.sum())

    def _info(self, n: int, view) -> dict:
        return {"num_steps": self.spec.num_steps, "forced_steps": sorted(self.spec.forced),
                "budget": self.budgets[n], "target_speedup": self.target_speedups[n], "run_view": view}

    # the RunView of morca_env.schedulers.rules.runtime: what run-time rules read of this call
    def step_input(self, step: int) -> tuple:
        if self.current is None or max(self.step_experts) != step:
            raise RuntimeError(f"step {step} is not the step being decided")
        return self.current

    def cache(self, step: int) -> ResidualCache:
        return self.caches[self.step_experts[step]]

    def close(self) -> None:
        for registry in self.hooks:
            registry.remove_hook(_DECISION_HOOK, recurse=False)
            registry.invalidate_child_registries_cache()
        for cache in self.caches:
            cache.reuse = False
            cache.detach(self)


def accelerate(pipe, policy, *, speedup: float | None = None, budget: int | None = None,
               calibration: SpeedupCalibration | str | None = None, signal: str = "official",
               scheduler_cost_s: float = 0.0, **call_kwargs) -> AccelerateResult:
    """Call `pipe(**call_kwargs)` with `policy` deciding cache reuse under an exact budget.

    Pass `budget` (K) or `speedup` (converted with `calibration`: a `SpeedupCalibration`, a calibration
    JSON, or a registered model name, "wan21", "wan22", "tiny" or "scenes"; by default the one of the pipeline's
    model, read from its transformer's config, and refused if unknown; `scheduler_cost_s`, the
    policy's own seconds per step, is counted in that conversion). One call runs the K
    with the nearest predicted speedup (the env instead dithers K across episodes).
    """
    if (speedup is None) == (budget is None):
        raise ValueError(f"pass exactly one of speedup or budget (got speedup={speedup!r}, budget={budget!r})")
    num_steps = call_kwargs.get("num_inference_steps", 50)
    if isinstance(num_steps, (bool, np.bool_)) or not isinstance(num_steps, (int, np.integer)) or num_steps < 1:
        raise ValueError(f"num_inference_steps={num_steps!r} must be a positive integer")
    num_steps = int(num_steps)
    if "num_inference_steps" in call_kwargs:
        call_kwargs = {**call_kwargs, "num_inference_steps": num_steps}
    if signal not in SIGNAL_KINDS:
        raise ValueError(f"signal={signal!r}; valid: {SIGNAL_KINDS}")
    videos = _video_count(call_kwargs)
    policies = _policies(policy, videos)
    calibration_files.check_calibration(calibration)
    spec = wan_structure.budget_spec(pipe, num_steps)
    speedups = _per_video("speedup", speedup, videos) if speedup is not None else [None] * videos
    if budget is None:
        if calibration is None:
            calibration = calibration_files.calibration_for_pipeline(pipe)
        calibration = calibration_files.resolve(calibration, num_steps, spec.max_budget)
        budgets = [calibration.with_scheduler_cost(scheduler_cost_s).budget_for_speedup(s) for s in speedups]
    else:
        budgets = _per_video("budget", budget, videos)
    budgets = [spec.check_budget(k) for k in budgets]
    if any(getattr(p, "prepare_call", None) is not None for p in policies):
        call_kwargs = _with_latents(pipe, call_kwargs, videos)
        for n, (member, k) in enumerate(zip(policies, budgets)):
            if getattr(member, "prepare_call", None) is not None:
                member.prepare_call(_replay_of(pipe, call_kwargs, n, videos), spec, k)
    guidance = call_kwargs.get("guidance_scale", 5.0)
    branches = lambda: wan_structure.branches(guidance)  # noqa: E731
    run = _Run(pipe, policies, spec, budgets, signal, branches, speedups)
    t0 = time.perf_counter()
    try:
        output = pipe(**call_kwargs)
    finally:
        run.close()
    run.result.output = output
    run.result.latency_s = time.perf_counter() - t0
    for schedule, k in zip(run.result.schedules, budgets):
        if sum(schedule) != k or len(schedule) != num_steps:
            raise RuntimeError(f"executed {sum(schedule)} reuses in {len(schedule)} steps, expected {k} in "
                               f"{num_steps}: the pipeline did not run the expected steps")
    return run.result


def _video_count(call_kwargs: dict) -> int:
    """Videos the call makes: prompts (or prompt_embeds rows) x num_videos_per_prompt."""
    per_prompt = call_kwargs.get("num_videos_per_prompt", 1)
    per_prompt = 1 if per_prompt is None else per_prompt  # diffusers' own default for None
    if isinstance(per_prompt, bool) or not isinstance(per_prompt, (int, np.integer)) or per_prompt < 1:
        raise ValueError(f"num_videos_per_prompt={per_prompt!r} must be a positive integer")
    prompt, embeds = call_kwargs.get("prompt"), call_kwargs.get("prompt_embeds")
    if isinstance(prompt, (list, tuple)):
        prompts = len(prompt)
    elif prompt is None and embeds is not None:
        prompts = int(embeds.shape[0])
    else:
        prompts = 1
    return prompts * int(per_prompt)


def _policies(policy, videos: int) -> list:
    """One scheduler per video: the list given (one per video), or `policy` and copies of it (a scheduler keeps
    per-episode state)."""
    members = list(policy) if isinstance(policy, (list, tuple)) else [policy]
    for member in members:
        if isinstance(member, type):
            raise TypeError(f"policy={member.__name__} is a class: pass an instance, e.g. {member.__name__}(...) or "
                            "morca_env.make_scheduler(name)")
        if not (callable(member) and callable(getattr(member, "reset", None))):
            raise TypeError(f"policy={member!r} must have reset(obs, info) and __call__(obs) -> action, "
                            "like morca_env.policies or agents.MorcaPolicy")
    if len(members) == 1:
        return members + [copy.deepcopy(members[0]) for _ in range(videos - 1)]
    if len(members) != videos:
        raise ValueError(f"{len(members)} policies for a call of {videos} videos (prompts x num_videos_per_prompt); "
                         f"valid: one for all, or {videos}")
    return members


def _per_video(name: str, value, videos: int) -> list:
    values = list(value) if isinstance(value, (list, tuple, np.ndarray)) else [value] * videos
    if len(values) != videos:
        raise ValueError(f"{name} has {len(values)} values for a call of {videos} videos (prompts x "
                         f"num_videos_per_prompt); valid: one for all, or {videos}")
    return values


_PIPELINE_DEFAULTS = {"height": 480, "width": 832, "num_frames": 81, "num_inference_steps": 50,
                      "guidance_scale": 5.0, "guidance_scale_2": None, "max_sequence_length": 512}


def _frames(pipe, num_frames: int) -> int:
    """The frame count WanPipeline really generates (it rounds to 4k + 1 for a 4x temporal VAE)."""
    temporal = getattr(pipe, "vae_scale_factor_temporal", 4)
    return num_frames if num_frames % temporal == 1 else num_frames // temporal * temporal + 1


def _with_latents(pipe, call_kwargs: dict, videos: int = 1) -> dict:
    """`call_kwargs` with the initial noise drawn from its generator(s) as WanPipeline draws it (same shape, dtype,
    device and generator use), so that replays and the call start from the same latents."""
    if call_kwargs.get("latents") is not None:
        return call_kwargs
    settings = {k: call_kwargs.get(k, v) for k, v in _PIPELINE_DEFAULTS.items()}
    latents = pipe.prepare_latents(videos, wan_structure.experts(pipe)[0].config.in_channels, settings["height"],
                                   settings["width"], _frames(pipe, settings["num_frames"]), torch.float32,
                                   pipe._execution_device, call_kwargs.get("generator"))
    return dict(call_kwargs, latents=latents)


def _replay_of(pipe, call_kwargs: dict, video: int = 0, videos: int = 1):
    """Free runs of video `video` of this call: a private denoiser with the call's settings, started from that
    video's inputs (its prompt or prompt embeddings, its initial noise)."""
    from .diffusion.denoiser import DenoiserConfig
    from .schedulers.rules.runtime import Replay

    settings = {k: call_kwargs.get(k, v) for k, v in _PIPELINE_DEFAULTS.items()}
    settings["num_frames"] = _frames(pipe, settings["num_frames"])
    negative = call_kwargs.get("negative_prompt")
    config = DenoiserConfig(**settings, **({"negative_prompt": negative} if isinstance(negative, str) else {}))
    start = {k: call_kwargs[k] for k in ("prompt", "prompt_embeds", "negative_prompt_embeds", "latents")
             if call_kwargs.get(k) is not None}
    if videos > 1:
        prompt = video // (videos // _video_count({**call_kwargs, "num_videos_per_prompt": 1}))
        for key in ("prompt_embeds", "negative_prompt_embeds"):
            if key in start:
                start[key] = start[key][prompt:prompt + 1]
        if isinstance(start.get("prompt"), (list, tuple)):
            start["prompt"] = start["prompt"][prompt]
        start["latents"] = start["latents"][video:video + 1]
    return Replay(pipe, config, pipe._execution_device, start)
