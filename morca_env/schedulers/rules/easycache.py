"""EasyCache (Zhou et al., 2025; EasyCache4Wan2.1, commit 5127804) as a scheduler: its decision signal over our cache.

EasyCache decides on the cond call of each step and the uncond call follows (one shared
decision). With x_t the model input (latent) at step t, o the cond model output of a
computed step, and j, i the last two computed steps:

    k = mean|o_i - o_j| / mean|x_i - x_j|                     (updated after every computed step)
    pred_t = k * mean|x_t - x_{t-1}| / mean|o_i|              (x_{t-1}: the previous step's input, any step)
    A += pred_t;  reuse iff A < tau, else compute and A = 0.

The first `warmup` steps and the last step compute (A = 0 there); a step without k yet
computes. Official Wan2.1 constants: tau = 0.05 by default (the authors' help text: 0.1 for
about 2x, 0.2 for about 3x), 10 warm-up steps of 50 (`warmup=0.2`, a fraction of the steps
here, so it scales with N as MagCache's and DiCache's retention does).

How it differs from the original: the authors cache the whole model's output minus its
input (o - x) and, on a reuse step, bypass the transformer entirely (x_t + (o - x)). Our env
reuses the block stack's residual (the patch and time embeddings, the output head and
unpatchify still run), so here EasyCache is its *decision signal* driving our residual
cache. The signal reads what the run already computes: the step's latent and the cond
model output of computed calls, which the residual cache keeps (`keep_output`); no probe,
so no extra cost.
"""

from __future__ import annotations

import math

import torch

from . import forms, runtime

DEFAULT_THRESHOLD = 0.05
SETTINGS = {"default": 0.05, "2x": 0.1, "3x": 0.2}  # the authors' default and help-text thresholds


def mean_abs(tensor: torch.Tensor) -> float:
    return float(tensor.float().abs().mean())


class EasyGate:
    """The cond branch's EasyCache state: k, the accumulated prediction A, the last computed input and output."""

    def __init__(self, signal, threshold: float, forced=frozenset()):
        self.signal, self.threshold, self.forced = signal, threshold, forced
        self.k: float | None = None
        self.accumulated, self._pending = 0.0, 0.0
        self.previous_input = None  # x_{t-1}, updated every step
        self.last_input = self.last_output = None  # x_i, o_i of the last computed step
        self._step, self._input = None, None
        self.drift: float | None = None  # this step's predicted change, when measured

    def wants_reuse(self, step: int) -> bool:
        self._step, self._input = step, self.signal.input(step)
        self._pending, self.drift = 0.0, None
        if step in self.forced or self.k is None or self.previous_input is None or self.last_output is None:
            return False
        scale = mean_abs(self.last_output)
        self.drift = self.k * mean_abs(self._input - self.previous_input) / scale if scale > 0 else math.inf
        self._pending = self.accumulated + self.drift
        return self.below(self.threshold)

    def below(self, threshold: float) -> bool:
        """The skip test of the accumulated prediction against `threshold` (ACID tests it against another one)."""
        return self._pending < threshold

    def commit(self, reused: bool) -> None:
        if reused:
            self.accumulated = self._pending
        else:  # computed: A = 0, and k from this output and the previous computed one
            self.accumulated = 0.0
            output = self.signal.output(self._step)
            if self.last_output is not None:
                change = mean_abs(self._input - self.last_input)
                self.k = mean_abs(output - self.last_output) / change if change > 0 else math.inf
            self.last_input, self.last_output = self._input, output
        self.previous_input = self._input


class EasyCache(runtime.RuntimeRule):
    """EasyCache's shared gate (decided on the cond branch) over the model input and output (module docstring)."""

    name = "easycache"
    keeps_head, keeps_output = False, True

    def __init__(self, warmup: float = 0.2):
        if not (isinstance(warmup, (int, float)) and not isinstance(warmup, bool) and 0 <= warmup <= 1):
            raise ValueError(f"warmup={warmup!r} must be a fraction of the steps in [0, 1]")
        self.warmup = float(warmup)

    def rule_forced(self, num_steps: int) -> frozenset:
        """The first round(warmup * N) steps and the last one (10 and step 49 of 50 officially)."""
        return frozenset(range(min(round(self.warmup * num_steps), num_steps))) | {num_steps - 1}

    def signals(self, view) -> list:
        return [runtime.OutputSignal(view, "cond")]  # one decision, on the cond call

    def gate(self, signal, threshold: float) -> EasyGate:
        return EasyGate(signal, threshold, self.context.forced | self.rule_forced(self.context.num_steps))


def build(form: str, env=None, pipe=None, threshold: float | None = None, setting: str | None = None,
          warmup: float = 0.2, branches=None, calibration=None, threshold_map=None, **options):
    """An EasyCache scheduler: native at `threshold` (or a named `setting`; default the authors' 0.05), global or
    exact."""
    if setting is not None and setting not in SETTINGS:
        raise ValueError(f"setting={setting!r}; valid: {', '.join(SETTINGS)}")
    if threshold is None:
        threshold = SETTINGS[setting or "default"]
    source = forms.Source(env, pipe, branches, calibration)
    return runtime.make_form(EasyCache(warmup), form, threshold, source, threshold_map, **options)
