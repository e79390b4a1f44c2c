"""The three forms of rules that decide from run-time signals (outputs of the model): FirstBlockCache, EasyCache,
DiCache, SenCache, and ACID over any of them.

TeaCache's and MagCache's schedules are known before the run (`forms`). A run-time rule
reads what the model computes as the video is made (block 0's output residual, model
outputs), so its schedule exists only by running it. It keeps `forms`' gate protocol;
its gates read a live run (`RunView`) and their `commit` comes after the step ran, so a
computed step's observations are there. Their gates also expose `drift` (the increment
measured at the step, None when nothing was) and `below(threshold)` (the rule's skip test
against another threshold), which the ACID wrapper (`acid`) reads. The forms:

* native: `forms.NativeRule` as is, over the episode's own run (env or `accelerate`);
* exact budget (`ExactRuntimeRule`): `forms.search_threshold` over *free runs*: the rule
  played without a budget on a replay of the episode (same prompt, noise and pipeline, a
  private `StepwiseDenoiser`), stopping as soon as it exceeds K (`free_run`); the found
  schedule is then played. In the env the replay is the episode's (prompt, seed); under
  `accelerate` it is the call itself (`prepare_call`, before the pipeline runs). Like
  `seacache-exact`, the replays are an oracle-style search, not counted in latency;
* global threshold (`GlobalRuntimeRule`): one threshold per target speedup, g(rho), from
  the mean K of free runs over a grid of thresholds on training prompts (K depends on the
  prompt here), converted with the env's calibration; or a given `threshold_map`.

Signals come from what the model computes: `RunView.cache(step)` is the run's
`ResidualCache`, which observes block 0 (`head_arguments`, `head_residual`, `head_output`); where a rule
needs a value before the step is decided, a probe runs the first block(s) on the step's
input (`signals.head_block`) and its time is the policy's, so evaluate.py's
per-step policy time and `accelerate`'s latency count it.
"""

from __future__ import annotations

import logging
from typing import Protocol

import numpy as np
import torch

from ...speedup.files import ThresholdMap, threshold_map_from_counts
from ..base import PrecomputedSchedule
from ...diffusion.signals import head_block
from . import forms

logger = logging.getLogger(__name__)


class RunView(Protocol):
    """What a run-time rule reads of the run it schedules."""

    caches: list  # one ResidualCache per transformer (expert)

    def step_input(self, step: int) -> tuple:  # (transformer, model input latents, timestep) of `step`, before it runs
        ...

    def cache(self, step: int):  # the ResidualCache of the transformer that runs (ran) `step`
        ...


# A StepwiseDenoiser is a RunView (the env's is `env.unwrapped.run_view`); so is accelerate's run (its info["run_view"]).


class BatchRunView:
    """The `run_view` a scheduler gets where one run holds several videos (`MorcaVectorEnv`, a batched `accelerate`
    call): run-time rules read one live run, so on first use they are refused by name."""

    def _refuse(self, *_):
        raise RuntimeError("this scheduler reads the live run (a run-time rule), which a batch of videos does not "
                           "expose per video; play it one video at a time (MorcaEnv, or accelerate with one video)")

    step_input = cache = _refuse
    caches = property(_refuse)


class HeadSignal:
    """Block 0's output residual (`kind="residual"`) or output (`"output"`) for one branch: `probe(step)` before the
    step runs (the probe pays one block), `observed(step)` after a computed step (what the call computed; equal to
    the probe at the same input)."""

    def __init__(self, view: RunView, branch: str, kind: str = "residual"):
        if kind not in ("residual", "output"):
            raise ValueError(f"kind={kind!r}; valid: 'residual', 'output'")
        self.view, self.branch, self.kind = view, branch, kind

    def probe(self, step: int) -> torch.Tensor:
        model, hidden, timestep = self.view.step_input(step)
        tokens, output = head_block(model, self.view.cache(step), self.branch, hidden, timestep)
        return output - tokens if self.kind == "residual" else output

    def observed(self, step: int) -> torch.Tensor:
        cache = self.view.cache(step)
        value = cache.head_residual(self.branch) if self.kind == "residual" else cache.head_output(self.branch)
        if value is None:
            raise RuntimeError(f"step {step} computed but block 0 of branch {self.branch!r} was not kept "
                               "(ResidualCache.keep_head)")
        return value


class OutputSignal:
    """One branch's model input before each step (`input(step)`) and model output after a computed one (`output`)."""

    def __init__(self, view: RunView, branch: str):
        self.view, self.branch = view, branch

    def input(self, step: int) -> torch.Tensor:
        return self.view.step_input(step)[1]

    def timestep(self, step: int) -> float:
        """The step's timestep / 1000 (Wan's scheduler counts 1000 training timesteps)."""
        return float(self.view.step_input(step)[2].reshape(-1)[0]) / 1000.0

    def output(self, step: int) -> torch.Tensor:
        output = self.view.cache(step).model_output(self.branch)
        if output is None:
            raise RuntimeError(f"step {step} computed but the model output of branch {self.branch!r} was not kept "
                               "(ResidualCache.keep_output)")
        return output


class TraceSignal:
    """A hand-written (or recorded) signal for unit tests and parity checks: `values` per step (probe, observed),
    or `inputs` and `outputs` per step (input, output), and `timesteps` (timestep / 1000) per step."""

    def __init__(self, values=None, inputs=None, outputs=None, timesteps=None):
        def tensors(seq):
            return None if seq is None else [torch.as_tensor(v, dtype=torch.float32) for v in seq]

        self.values, self.inputs, self.outputs = tensors(values), tensors(inputs), tensors(outputs)
        self.timesteps = None if timesteps is None else [float(t) for t in timesteps]

    def timestep(self, step: int) -> float:
        return self.timesteps[step]

    def probe(self, step: int) -> torch.Tensor:
        return self.values[step]

    observed = probe

    def input(self, step: int) -> torch.Tensor:
        return self.inputs[step]

    def output(self, step: int) -> torch.Tensor:
        return self.outputs[step]


class RuntimeRule(forms.Rule):
    """Base of a run-time rule: gates built over one signal per branch (`signals`), read from `context.view`."""

    runtime = True
    keeps_head = True  # the rule reads block 0 (input, output) from the cache
    keeps_output = False  # the rule reads the transformer's output from the cache
    threshold_start = 1e-3  # the exact form's first bisection bracket
    # thresholds to 1%: each try is a generation, and finer steps rarely change a run-time rule's count
    threshold_rtol = 0.01

    def prepare(self, context: forms.RunContext) -> None:
        super().prepare(context)
        if context.view is not None:
            self.observe(context.view.caches)

    def observe(self, caches) -> None:
        """Ask the run's residual caches to keep what this rule reads (they only observe)."""
        for cache in caches:
            cache.keep_head = cache.keep_head or self.keeps_head
            cache.keep_output = cache.keep_output or self.keeps_output

    def signals(self, view: RunView) -> list:
        return [HeadSignal(view, branch) for branch in self.context.branches]

    def gates(self, threshold: float, signals=None) -> list[forms.Gate]:
        """One gate per branch over `signals` (default: the live run's)."""
        if signals is None:
            if self.context.view is None:
                raise ValueError(f"{self.name} decides from the run's own signals: pass env= (or run it under "
                                 "accelerate), or give it a signal trace")
            signals = self.signals(self.context.view)
        return [self.gate(signal, threshold) for signal in signals]

    def gate(self, signal, threshold: float) -> forms.Gate:
        raise NotImplementedError


def free_run(rule: RuntimeRule, denoiser, start: dict, threshold: float, forced,
             stop_above: int | None = None) -> list[int]:
    """The rule on its own (no budget) over a fresh run of `denoiser.start(**start)` (a reuse needs a cached
    residual, as in the env); stops once it holds more than `stop_above` reuses (see `forms.simulate`)."""
    denoiser.start(**start)
    rule.observe(denoiser.caches)
    return forms.simulate(rule.gates(threshold, rule.signals(denoiser)), denoiser.num_steps, forced,
                          run_step=lambda step, action: denoiser.step(reuse=bool(action)), stop_above=stop_above,
                          can_reuse=denoiser.cache_valid)


class Replay:
    """Free runs of the episode a policy schedules: a private denoiser on the same pipeline and its start arguments."""

    def __init__(self, pipe, config, device, start: dict):
        self.pipe, self.config, self.device, self.start = pipe, config, device, dict(start)
        self._denoiser = None

    @property
    def denoiser(self):
        from ...diffusion.denoiser import StepwiseDenoiser

        if self._denoiser is None:
            self._denoiser = StepwiseDenoiser(self.pipe, self.config, device=self.device)
        return self._denoiser

    def run(self, rule: RuntimeRule, threshold: float, forced, stop_above: int | None = None,
            start: dict | None = None) -> list[int]:
        return free_run(rule, self.denoiser, start or self.start, threshold, forced, stop_above)

    def close(self) -> None:
        if self._denoiser is not None:
            self._denoiser.close()
            self._denoiser = None


def env_replay(env, info) -> Replay:
    env = env.unwrapped
    return Replay(env.pipe, env.config, env.device, {"prompt": info["prompt"], "seed": info["seed"]})


class ExactRuntimeRule(PrecomputedSchedule):
    """The rule at the per-episode threshold that spends exactly K, found on free runs (see the module docstring)."""

    def __init__(self, rule: RuntimeRule, source: forms.Source, iterations: int = 12):
        if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
            raise ValueError(f"iterations={iterations!r} must be a positive integer")
        self.rule, self.source, self.iterations = rule, source, iterations
        self.last_threshold: float | None = None
        self.clipped: tuple[int, int] | None = None
        self.replays = 0
        self._replay: Replay | None = None
        self._planned: list[int] | None = None  # found by prepare_call (accelerate) before the pipeline ran

    def prepare_call(self, replay: Replay, spec, budget: int) -> None:
        """Under `accelerate`: search on replays of the call before it runs."""
        try:
            self._planned = self.search(replay, spec, budget, forms.Source(pipe=replay.pipe, branches=self.source.branches)
                                        .context({"num_steps": spec.num_steps, "forced_steps": sorted(spec.forced)}))
        finally:
            replay.close()

    def reset(self, obs, info) -> None:
        if self.source.env is None and self._planned is None:
            raise ValueError(f"{self.rule.name}-exact searches its threshold on replays of the episode: pass env=, "
                             "or run it under morca_env.accelerate")
        self._info = info
        super().reset(obs, info)

    def plan(self, spec, budget):
        if self._planned is not None:
            schedule, self._planned = self._planned, None
            return schedule
        if self._replay is None:
            self._replay = env_replay(self.source.env, self._info)
        self._replay.start = {"prompt": self._info["prompt"], "seed": self._info["seed"]}
        return self.search(self._replay, spec, budget, self.source.context(self._info))

    def search(self, replay: Replay, spec, budget: int, context) -> list[int]:
        if budget == 0:
            self.last_threshold, self.clipped = 0.0, None
            return [0] * spec.num_steps
        self.rule.prepare(context)

        def schedule_at(threshold):
            self.replays += 1
            return replay.run(self.rule, threshold, spec.forced, stop_above=budget)

        self.last_threshold, schedule = forms.search_threshold(schedule_at, budget, self.iterations,
                                                               start=self.rule.threshold_start,
                                                               rtol=self.rule.threshold_rtol)
        self.clipped = forms.clipping(self.rule.name, schedule, budget, spec.num_steps, self.last_threshold)
        return (schedule + [0] * spec.num_steps)[:spec.num_steps]

    def close(self) -> None:
        if self._replay is not None:
            self._replay.close()
            self._replay = None


_FITTED: dict = {}  # fitted global maps, per env and rule setting


class GlobalRuntimeRule(forms.NativeRule):
    """One threshold per target speedup, g(rho): given, or fitted on free runs over training prompts (once per env)."""

    def __init__(self, rule: RuntimeRule, source: forms.Source, threshold_map: ThresholdMap | None = None,
                 grid=tuple(np.logspace(-3, 1, 9)), fit_prompts: int = 2):
        super().__init__(rule, 0.0, source)
        if isinstance(fit_prompts, bool) or not isinstance(fit_prompts, int) or fit_prompts < 1:
            raise ValueError(f"fit_prompts={fit_prompts!r} must be a positive integer")
        grid = np.asarray(grid, dtype=float)
        if grid.ndim != 1 or len(grid) < 2 or np.any(grid <= 0) or np.any(np.diff(grid) <= 0):
            raise ValueError(f"grid={grid.tolist()!r} must hold >= 2 increasing positive thresholds")
        self.threshold_map, self.grid, self.fit_prompts = threshold_map, grid, fit_prompts
        self._fitted_for = None

    def episode_threshold(self, info) -> float:
        if not info.get("target_speedup"):
            raise ValueError(f"{self.rule.name}-global needs a target speedup (reset with options={{'speedup': ...}}, "
                             "or accelerate(..., speedup=...))")
        context = self.rule.context
        key = (context.num_steps, context.forced, id(context.calibration))
        if self.threshold_map is None or (self._fitted_for is not None and self._fitted_for != key):
            self.threshold_map, self._fitted_for = self.fit(context), key
        return self.threshold_map(float(info["target_speedup"]))

    def fit(self, context) -> ThresholdMap:
        env = self.source.env
        if env is None or context.calibration is None:
            raise ValueError(f"{self.rule.name}-global needs a threshold_map (speedups and thresholds, as "
                             "ThresholdMap.to_dict gives) or env= to fit one on training prompts")
        settings = tuple((k, v) for k, v in sorted(vars(self.rule).items()) if k != "context")
        key = (id(env), type(self.rule), settings, tuple(self.grid), self.fit_prompts, context.num_steps,
               context.forced, id(context.calibration))
        if key not in _FITTED:  # one fit per env and setting: collection makes a policy per episode
            _FITTED[key] = self._fit(env, context)
        return _FITTED[key]

    def _fit(self, env, context) -> ThresholdMap:
        pairs = env.suite.pairs()[:self.fit_prompts]
        replay = Replay(env.pipe, env.config, env.device, {})
        counts = []
        try:
            for threshold in self.grid:
                counts.append(np.mean([sum(replay.run(self.rule, float(threshold), context.forced,
                                                      start={"prompt": p, "seed": s})) for p, s in pairs]))
        finally:
            replay.close()
        logger.info("%s-global: mean K %s over thresholds %s", self.rule.name, counts, self.grid.tolist())
        return threshold_map_from_counts(
            self.rule.name, self.grid, counts, context.calibration,
            f"mean K of free runs on {len(pairs)} prompts of {env.suite.name!r} and the env calibration")


def make_form(rule: RuntimeRule, form: str, threshold, source: forms.Source, threshold_map=None, **options):
    """A run-time rule's policy in `form` ('native', 'global' or 'exact')."""
    if isinstance(threshold_map, dict):
        threshold_map = ThresholdMap.from_dict(threshold_map)
    if form == "native":
        if options:
            raise TypeError(f"unexpected options {sorted(options)} for the native form")
        return forms.NativeRule(rule, threshold, source)
    if form == "global":
        return GlobalRuntimeRule(rule, source, threshold_map, **options)
    if form == "exact":
        return ExactRuntimeRule(rule, source, **options)
    raise ValueError(f"form={form!r}; valid: 'native', 'global', 'exact'")
