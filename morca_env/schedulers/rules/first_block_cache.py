"""FirstBlockCache (ParaAttention's "First Block Cache", as diffusers 0.42 ships it: `FirstBlockCacheConfig`).

Per CFG branch, block 0 runs at every step; its output residual r_t = block0(h_t) - h_t is
compared with the one of the branch's last *computed* step, r_ref:

    diff = mean|r_t - r_ref| / mean|r_ref|     (over the whole tensor)
    reuse iff diff < threshold,  else compute (and r_ref = r_t).

No accumulation, no warm-up, no forced step of its own: the first call of a branch computes
(no reference yet); the env adds its forced first and last steps (and Wan2.2's expert
switch, where the new expert's first computed step sets its reference). Default threshold
0.05 (diffusers' default; there are no official Wan2.1 constants: the rule is model-agnostic).

Strictness (`convention=`): "official" is ParaAttention's `are_two_tensors_similar`
(reuse iff diff < threshold); "diffusers" is diffusers' hook (compute iff diff > threshold,
i.e. reuse iff diff <= threshold). They differ only at diff == threshold.

How it differs here: the env decides once per step for both branches (a step reuses only
when every branch's gate wants to; diffusers decides per branch), and a reuse step
reuses the whole block stack's residual (h + r) where diffusers adds the cached residual
of blocks 1.. to block 0's fresh output. The decision needs block 0's output before the
step is decided, so a probe runs block 0 per branch on every free step
(`signals.head_block_residual`); its time is the policy's, counted in the episode's
latency (evaluate.py's policy time, `accelerate`'s wall clock): about 1/num_blocks of a
computed step per probed step, and a computed step runs block 0 again (the authors' code
runs it once). The reference r_ref is what the computed call itself produced, observed
by the residual cache (`ResidualCache.head_residual`).
"""

from __future__ import annotations

import torch

from . import forms, runtime

CONVENTIONS = ("official", "diffusers")
DEFAULT_THRESHOLD = 0.05


def relative_change(current: torch.Tensor, reference: torch.Tensor) -> float:
    """mean|current - reference| / mean|reference| over the whole tensor, as ParaAttention and diffusers compute it."""
    return float((current - reference).abs().mean() / reference.abs().mean())


class FirstBlockGate:
    """One branch's FirstBlockCache state: the block-0 residual of its last computed step."""

    def __init__(self, signal, threshold: float, forced=frozenset(), strict: bool = True):
        self.signal, self.threshold, self.forced, self.strict = signal, threshold, forced, strict
        self.reference: torch.Tensor | None = None
        self._step, self._current = None, None
        self.drift: float | None = None  # this step's relative change, when measured

    def wants_reuse(self, step: int) -> bool:
        self._step, self._current, self.drift = step, None, None
        if step in self.forced or self.reference is None:  # forced, or no reference yet: compute, no probe
            return False
        self._current = self.signal.probe(step)
        self.drift = relative_change(self._current, self.reference)
        return self.below(self.threshold)

    def below(self, threshold: float) -> bool:
        """The skip test of this step's change against `threshold` (ACID tests it against another one)."""
        return self.drift < threshold if self.strict else self.drift <= threshold

    def commit(self, reused: bool) -> None:
        if not reused:  # a computed step becomes the reference
            self.reference = self._current if self._current is not None else self.signal.observed(self._step)


class FirstBlockCache(runtime.RuntimeRule):
    """FirstBlockCache's gate per branch over block 0's output residual (see the module docstring)."""

    name = "first-block-cache"

    def __init__(self, convention: str = "official"):
        if convention not in CONVENTIONS:
            raise ValueError(f"convention={convention!r}; valid: {CONVENTIONS}")
        self.convention = convention

    def gate(self, signal, threshold: float) -> FirstBlockGate:
        return FirstBlockGate(signal, threshold, self.context.forced, strict=self.convention == "official")


def build(form: str, env=None, pipe=None, threshold: float = DEFAULT_THRESHOLD, convention: str = "official",
          branches=None, calibration=None, threshold_map=None, **options):
    """A FirstBlockCache scheduler: native at `threshold` (default diffusers' 0.05), global or exact."""
    source = forms.Source(env, pipe, branches, calibration)
    return runtime.make_form(FirstBlockCache(convention), form, threshold, source, threshold_map, **options)
