"""DiCache (Bu et al., 2025; WAN2.1/run_wan_dicache.py, commit dd7f0de) as a scheduler: the block-0 probe rule.

Per CFG branch, after a warm-up of the first int(2N R) transformer calls (calls alternate
cond, uncond: call 2i + b at step i), every step runs the probe, block 0, on the step's
input and compares its output y_t with the previous step's y_{t-1} (probe or full pass):

    delta_t = mean|y_t - y_{t-1}| / mean|y_{t-1}|;  A += delta_t
    reuse iff A < tau, else compute and A = 0.

Warm-up steps compute without a probe (y is taken from their full pass); the last step is
not forced by the rule (the env forces it). Official Wan2.1 defaults: tau = 0.08
(`rel_l1_thresh`), R = 0.2 (`ret_ratio`: the first 10 of 50 steps), probe depth 1; one
accumulator per branch (the env reuses only when both branches' gates want to).

The probe's cost: block 0 per branch on every free step after warm-up
(`signals.head_block`), inside the policy's call, so it is in the episode's latency
(evaluate.py adds the policy's per-step time; under `accelerate` it runs inside the
pipeline call): 1/num_blocks of a computed step per reuse step. The authors' code
reuses the probe's output as the start of the full pass on a computed step; here the
computed step runs block 0 again (one more block per computed step after warm-up).

Not reproduced: DiCache's trajectory alignment (DCTA: on a reuse step, extrapolating
from the last two full residuals with gamma = clip(mean|p_t - p_1| / mean|p_2 - p_1|, 1, 2)).
It changes what a reuse step outputs, which our env's residual cache fixes (h + r for
every scheduler); this scheduler is DiCache's decision rule over that cache.
"""

from __future__ import annotations

import math

import torch

from . import forms, runtime
from .first_block_cache import relative_change

DEFAULT_THRESHOLD, DEFAULT_RETENTION = 0.08, 0.2


class DiGate:
    """One branch's DiCache state: the previous step's block-0 output y and the accumulated change A."""

    def __init__(self, signal, threshold: float, retained: int, forced=frozenset()):
        self.signal, self.threshold, self.retained, self.forced = signal, threshold, retained, forced
        self.previous: torch.Tensor | None = None
        self.accumulated, self._pending = 0.0, 0.0
        self._step, self._current = None, None
        self.drift: float | None = None  # this step's delta_t, when measured

    def wants_reuse(self, step: int) -> bool:
        self._step, self._current, self._pending, self.drift = step, None, 0.0, None
        if step < self.retained or step in self.forced or self.previous is None:  # warm-up or forced: no probe
            return False
        self._current = self.signal.probe(step)
        self.drift = relative_change(self._current, self.previous)
        self._pending = self.accumulated + self.drift
        return self.below(self.threshold)

    def below(self, threshold: float) -> bool:
        """The skip test of the accumulated change against `threshold` (ACID tests it against another one)."""
        return self._pending < threshold

    def commit(self, reused: bool) -> None:
        self.accumulated = self._pending if reused else 0.0
        # y of this step: the probe's, else (warm-up, forced) the computed call's block 0
        self.previous = self._current if self._current is not None else self.signal.observed(self._step)


class DiCache(runtime.RuntimeRule):
    """DiCache's gate per branch over block 0's output (see the module docstring)."""

    name = "dicache"

    def __init__(self, retention: float = DEFAULT_RETENTION):
        if not (isinstance(retention, (int, float)) and not isinstance(retention, bool) and 0 <= retention <= 1):
            raise ValueError(f"retention (R)={retention!r} must be a number in [0, 1]")
        self.retention = float(retention)

    def retained_steps(self, branch: int) -> int:
        """Steps of branch `branch` (0 cond, 1 uncond) inside the warm-up: call 2i + b is in it iff 2i + b < int(2NR)."""
        calls = int(2 * self.context.num_steps * self.retention)
        return max(0, math.ceil((calls - branch) / 2))

    def signals(self, view) -> list:
        return [runtime.HeadSignal(view, branch, kind="output") for branch in self.context.branches]

    def gates(self, threshold: float, signals=None) -> list[DiGate]:
        gates = super().gates(threshold, signals)
        for index, gate in enumerate(gates):
            gate.retained = self.retained_steps(index)
        return gates

    def gate(self, signal, threshold: float) -> DiGate:
        return DiGate(signal, threshold, 0, self.context.forced)


def build(form: str, env=None, pipe=None, threshold: float = DEFAULT_THRESHOLD, retention: float = DEFAULT_RETENTION,
          branches=None, calibration=None, threshold_map=None, **options):
    """A DiCache scheduler: native at `threshold` (default the authors' 0.08), global or exact."""
    source = forms.Source(env, pipe, branches, calibration)
    return runtime.make_form(DiCache(retention), form, threshold, source, threshold_map, **options)
