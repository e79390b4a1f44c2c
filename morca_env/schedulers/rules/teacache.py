"""TeaCache (Liu et al., CVPR 2025; TeaCache4Wan2.1, commit 7c10efc) as a scheduler: a fixed mask per setting.

Its signal is the timestep embedding alone: s_i = time_embedding(sin(t_i)) (shape
[B, dim]) or, with retention steps (`use_ret_steps=True`), the 6-way time
projection. With x_i = mean|s_i - s_{i-1}| / mean|s_{i-1}| and a 4th-degree
polynomial p (coefficients highest degree first), per branch

    A += p(x_i);  reuse iff A < delta, else compute and A = 0.

Forced computes: the first and last step (plain), or the first 5 steps and not
the last (retention steps). The previous embedding is updated on every step.
The signal depends on t only, so the schedule is one fixed mask per (steps,
shift, delta); both branches see the same signal, so their decisions agree.
We evaluate the model's own `condition_embedder` in float32 (the authors run the
time embedding under float32 autocast) on the run's scheduler timesteps, with
the expert that runs each step (Wan2.2).

Constants: the authors' T2V-1.3B polynomials (below); for our models, the ones
`morca fit-rules` fits by the authors' procedure. Thresholds in the
authors' README for 1.3B: 0.05 / 0.07 / 0.08 (settings "slow" / "medium" / "fast",
our names; default 0.08); MORCA's Table 7: 0.142 / 0.195 / 0.36 at ~2.4x / 3.0x / 4.0x.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
import torch.nn.functional as F

from . import forms

# T2V-1.3B (plain: time embedding) and (retention steps: time projection); 14B plain
COEFFICIENTS = {
    "wan21": (2.39676752e+03, -1.31110545e+03, 2.01331979e+02, -8.29855975e+00, 1.37887774e-01),
    "wan21-ret": (-5.21862437e4, 9.23041404e3, -5.28275948e2, 1.36987616e1, -4.99875664e-2),
    "wan21-14b": (-5784.54975374, 5449.50911966, -1811.16591783, 256.27178429, -13.02252404),
}
SETTINGS = {"slow": 0.05, "medium": 0.07, "fast": 0.08, "morca-2.4x": 0.142, "morca-3.0x": 0.195, "morca-4.0x": 0.36}
RETENTION_STEPS = 5


@torch.no_grad()
def time_signal(model, timestep, use_ret_steps: bool = False) -> torch.Tensor:
    """TeaCache's input signal at `timestep` from a diffusers Wan transformer: temb, or its 6-way projection."""
    embedder = model.condition_embedder
    freq = embedder.timesteps_proj(torch.as_tensor(timestep).reshape(1).float())
    time = embedder.time_embedder
    if time.cond_proj is not None or time.post_act is not None:
        raise ValueError("TeaCache's signal expects Wan's plain TimestepEmbedding (linear, act, linear)")
    hidden = time.act(F.linear(freq.float(), time.linear_1.weight.float(), time.linear_1.bias.float()))
    temb = F.linear(hidden, time.linear_2.weight.float(), time.linear_2.bias.float())
    if not use_ret_steps:
        return temb
    return F.linear(embedder.act_fn(temb), embedder.time_proj.weight.float(), embedder.time_proj.bias.float())


def relative_l1(current: torch.Tensor, previous: torch.Tensor) -> float:
    """mean|current - previous| / mean|previous|, over the whole tensor (as the authors compute it)."""
    return float((current - previous).abs().mean() / previous.abs().mean())


class TeaGate:
    """One branch's TeaCache accumulator A over the per-step increments p(x_i)."""

    def __init__(self, increments, forced, delta: float):
        self.increments, self.forced, self.delta = increments, forced, delta
        self.accumulated, self._pending = 0.0, 0.0
        self.drift: float | None = None  # this step's increment p(x_i), read by ACID (None on forced steps)

    def wants_reuse(self, step: int) -> bool:
        if step in self.forced:  # the rule's own forced computes: A = 0, no accumulation
            self._pending, self.drift = 0.0, None
            return False
        self.drift = float(self.increments[step])
        self._pending = self.accumulated + self.drift
        return self.below(self.delta)

    def below(self, threshold: float) -> bool:
        """TeaCache's test of this step's accumulated value against `threshold` (strict, as the authors')."""
        return self._pending < threshold

    def commit(self, reused: bool) -> None:
        self.accumulated = self._pending if reused else 0.0


class TeaCache(forms.Rule):
    """TeaCache's gate; `prepare` computes the increments p(x_i) from the run's timesteps (or takes `distances`)."""

    name = "teacache"

    def __init__(self, coefficients, use_ret_steps: bool = False, distances=None):
        coefficients = np.asarray(coefficients, dtype=float)
        if coefficients.shape != (5,) or not np.all(np.isfinite(coefficients)):
            raise ValueError(f"TeaCache coefficients must be 5 finite numbers (degree 4 first), got {coefficients!r}")
        if not isinstance(use_ret_steps, bool):
            raise TypeError(f"use_ret_steps={use_ret_steps!r} must be True or False")
        self.coefficients, self.use_ret_steps = coefficients, use_ret_steps
        self.fixed_distances = None if distances is None else np.asarray(distances, dtype=float)

    def rule_forced(self, num_steps: int) -> frozenset:
        if self.use_ret_steps:
            return frozenset(range(min(RETENTION_STEPS, num_steps)))
        return frozenset({0, num_steps - 1})

    def prepare(self, context: forms.RunContext) -> None:
        super().prepare(context)
        n = context.num_steps
        if self.fixed_distances is not None:
            distances = self.fixed_distances
        else:
            if context.step_models is None:
                raise ValueError("TeaCache needs the run's timesteps and transformer: pass env= or pipe=")
            signals = [time_signal(context.step_models[i], context.timesteps[i], self.use_ret_steps) for i in range(n)]
            distances = np.array([0.0] + [relative_l1(signals[i], signals[i - 1]) for i in range(1, n)])
        if len(distances) != n:
            raise ValueError(f"TeaCache has {len(distances)} step distances for a {n}-step run")
        self.distances = distances
        self.increments = np.polyval(self.coefficients, distances)

    def gates(self, threshold: float) -> list[TeaGate]:
        forced = self.rule_forced(self.context.num_steps)
        return [TeaGate(self.increments, forced, threshold) for _ in self.context.branches]


def coefficients_for(model: str | None, use_ret_steps: bool, coefficients=None):
    """Explicit coefficients, else the ones fitted for `model` (packaged), else the authors' T2V-1.3B ones."""
    if coefficients is not None:
        return coefficients
    key = "coefficients_ret" if use_ret_steps else "coefficients"
    fitted = forms.packaged_constants("teacache", model)
    if fitted is not None:
        return fitted[key]
    if model not in (None, "wan21"):
        warnings.warn(f"no TeaCache polynomial fitted for {model!r} (morca fit-rules); using the "
                      "authors' Wan2.1-T2V-1.3B one", stacklevel=3)
    return COEFFICIENTS["wan21-ret" if use_ret_steps else "wan21"]


def build(form: str, env=None, pipe=None, setting: str | None = None, delta: float | None = None,
          use_ret_steps: bool = False, coefficients=None, branches=None, calibration=None, threshold_map=None):
    """A TeaCache scheduler: native at `delta` (or a named `setting`; default the authors' 0.08), global or exact."""
    if setting is not None and setting not in SETTINGS:
        raise ValueError(f"setting={setting!r}; valid: {', '.join(SETTINGS)}")
    if delta is None:
        delta = SETTINGS[setting or "fast"]
    source = forms.Source(env, pipe, branches, calibration)
    rule = TeaCache(coefficients_for(source.model, use_ret_steps, coefficients), use_ret_steps)
    return forms.make_form(rule, form, delta, source, threshold_map)


@torch.no_grad()
def fit_coefficients(denoiser, pairs, degree: int = 4) -> dict:
    """The authors' calibration: over no-cache runs of the (prompt, seed) `pairs`, the polynomial (degree 4)
    mapping the input signal's relative L1 x_i to the model output's relative L1 y_i between consecutive
    steps (each branch one sample), least squares; one fit for the plain signal, one for the projection.
    `pairs` holds (prompt, seed) pairs or dicts of `denoiser.start` arguments."""
    outputs: list = []

    def keep(module, args, output):
        outputs.append(output[0].detach().float())

    hooks = [model.register_forward_hook(keep) for model in denoiser.experts]
    n, branches = denoiser.num_steps, len(denoiser.branches)
    x = {False: [], True: []}
    for use_ret in (False, True):
        signals = [time_signal(denoiser.expert(i), denoiser.timestep(i), use_ret) for i in range(n)]
        x[use_ret] = [relative_l1(signals[i], signals[i - 1]) for i in range(1, n)]
    xs, ys = {False: [], True: []}, []
    try:
        for pair in pairs:
            outputs.clear()
            denoiser.start(**(pair if isinstance(pair, dict) else {"prompt": pair[0], "seed": pair[1]}))
            while not denoiser.done:
                denoiser.step(reuse=False)
            per_step = [outputs[i * branches:(i + 1) * branches] for i in range(n)]
            for b in range(branches):
                ys.extend(relative_l1(per_step[i][b], per_step[i - 1][b]) for i in range(1, n))
                for use_ret in (False, True):
                    xs[use_ret].extend(x[use_ret])
    finally:
        for hook in hooks:
            hook.remove()
    fit = {key: np.polyfit(xs[use_ret], ys, degree).tolist()
           for key, use_ret in (("coefficients", False), ("coefficients_ret", True))}
    fit["input_range"] = [float(min(xs[False])), float(max(xs[False]))]
    fit["input_range_ret"] = [float(min(xs[True])), float(max(xs[True]))]
    return fit
