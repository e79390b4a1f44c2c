"""SenCache (sensitivity-aware caching, cited by the MORCA line of work) as a scheduler: the error of a reuse
predicted from the model output's sensitivity to the noisy latent and to the timestep.

Source: the method's description ("caching error predicted by model-output sensitivity to the
noisy latent and the timestep; per-sample adaptive caching steps"). No official code or Wan2.1
constants are available to this project, so the rule below is derived from that description
and says where it chooses; its global and exact forms (threshold fitted to a speedup, or
searched per video for exactly K) are the fair comparisons, not the native threshold.

Derivation. Reusing at step t what was computed at the last computed step j replaces the model
output v(x_t, tau_t) by v(x_j, tau_j) (tau = timestep / 1000). To first order

    v(x_t, tau_t) - v(x_j, tau_j) ~ J_x (x_t - x_j) + d_tau v (tau_t - tau_j),

so in mean absolute size, relative to the cached output o_j,

    e_t = (S_x mean|x_t - x_j| + S_tau |tau_t - tau_j|) / mean|o_j|,

with S_x, S_tau >= 0 the output's sensitivities. They come from what the run already has, per
video: consecutive computed steps (a, b) give one equation each,

    mean|o_b - o_a| = S_x mean|x_b - x_a| + S_tau |tau_b - tau_a|,

and the last `history` equations (default 3) are solved by non-negative least squares
(`scipy.optimize.nnls`; with one equation the minimum-residual non-negative fit). Reuse iff
e_t < threshold, else compute. Unlike EasyCache nothing is accumulated: e_t is measured from
the last computed step, so it grows while reuses continue. The first `warmup` fraction of the
steps (default 0.1, our choice) and the last step compute; a step without an estimate computes.
One decision per step, on the cond call (the uncond call follows), from the latent and the cond
output that the residual cache keeps (`keep_output`): no probe, no extra model cost. On our
cache a reuse adds the block stack's residual rather than replaying the model output.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.optimize import nnls

from . import forms, runtime

DEFAULT_THRESHOLD = 0.1  # our choice, not tuned (no official constant): compare through the global/exact forms


def mean_abs(tensor: torch.Tensor) -> float:
    return float(tensor.float().abs().mean())


def fit_sensitivities(equations) -> tuple[float, float]:
    """(S_x, S_tau) >= 0 minimising sum (S_x dx + S_tau dtau - dv)^2 over `equations` of (dx, dtau, dv)."""
    a = np.array([[dx, dtau] for dx, dtau, _ in equations], dtype=float)
    b = np.array([dv for _, _, dv in equations], dtype=float)
    if not np.all(np.isfinite(a)) or not np.all(np.isfinite(b)):
        return math.inf, math.inf
    solution, _ = nnls(a, b)
    return float(solution[0]), float(solution[1])


class SensitivityGate:
    """The cond branch's SenCache state: the equations so far, the sensitivities, the last computed step."""

    def __init__(self, signal, threshold: float, forced=frozenset(), history: int = 3):
        self.signal, self.threshold, self.forced, self.history = signal, threshold, forced, history
        self.equations: list[tuple[float, float, float]] = []
        self.sensitivity: tuple[float, float] | None = None
        self.last = None  # (x_j, tau_j, o_j) of the last computed step
        self._step = self._input = self._tau = None
        self.drift: float | None = None  # e_t, when predicted (ACID reads it)

    def wants_reuse(self, step: int) -> bool:
        self._step, self._input, self._tau = step, self.signal.input(step), self.signal.timestep(step)
        self.drift = None
        if step in self.forced or self.sensitivity is None or self.last is None:
            return False
        x_j, tau_j, o_j = self.last
        scale = mean_abs(o_j)
        s_x, s_tau = self.sensitivity
        change = s_x * mean_abs(self._input - x_j) + s_tau * abs(self._tau - tau_j)
        self.drift = change / scale if scale > 0 else math.inf
        return self.below(self.threshold)

    def below(self, threshold: float) -> bool:
        """The skip test of the predicted error against `threshold` (ACID tests it against another one)."""
        return self.drift is not None and self.drift < threshold

    def commit(self, reused: bool) -> None:
        if reused:
            return
        output = self.signal.output(self._step)
        if self.last is not None:
            x_j, tau_j, o_j = self.last
            self.equations = (self.equations + [(mean_abs(self._input - x_j), abs(self._tau - tau_j),
                                                 mean_abs(output - o_j))])[-self.history:]
            self.sensitivity = fit_sensitivities(self.equations)
        self.last = (self._input, self._tau, output)


class SenCache(runtime.RuntimeRule):
    """SenCache's shared gate (decided on the cond branch) over the model input, timestep and output."""

    name = "sencache"
    keeps_head, keeps_output = False, True

    def __init__(self, warmup: float = 0.1, history: int = 3):
        if not (isinstance(warmup, (int, float)) and not isinstance(warmup, bool) and 0 <= warmup <= 1):
            raise ValueError(f"warmup={warmup!r} must be a fraction of the steps in [0, 1]")
        if isinstance(history, bool) or not isinstance(history, int) or history < 1:
            raise ValueError(f"history={history!r} must be an integer >= 1 (computed-step pairs in the fit)")
        self.warmup, self.history = float(warmup), history

    def rule_forced(self, num_steps: int) -> frozenset:
        """The first round(warmup * N) steps and the last one."""
        return frozenset(range(min(round(self.warmup * num_steps), num_steps))) | {num_steps - 1}

    def signals(self, view) -> list:
        return [runtime.OutputSignal(view, "cond")]  # one decision, on the cond call

    def gate(self, signal, threshold: float) -> SensitivityGate:
        return SensitivityGate(signal, threshold, self.context.forced | self.rule_forced(self.context.num_steps),
                               self.history)


def build(form: str, env=None, pipe=None, threshold: float | None = None, warmup: float = 0.1, history: int = 3,
          branches=None, calibration=None, threshold_map=None, **options):
    """A SenCache scheduler: native at `threshold` (default 0.1, our choice), global or exact."""
    source = forms.Source(env, pipe, branches, calibration)
    return runtime.make_form(SenCache(warmup, history), form,
                             DEFAULT_THRESHOLD if threshold is None else threshold, source, threshold_map, **options)
