"""MagCache (Ma et al., NeurIPS 2025; MagCache4Wan2.1, commit df81cb1) as a scheduler: a fixed mask per setting.

The authors calibrate once, per step and CFG branch, the magnitude ratio
ratio_t = mean over tokens of ||r_t||_2 / ||r_{t-1}||_2 of the block-stack residual r
(`morca fit-rules` does it for our models). At run time the gate needs
only the step index. Per branch, after the first int(2N R) transformer calls (calls
alternate cond, uncond: call 2i + b at step i), each step does

    rho *= ratio_t;  k += 1;  E += |1 - rho|
    reuse iff E < delta and k <= K_max, else compute and reset rho = 1, E = 0, k = 0.

The last step is not forced by the rule (the env forces it). Ratios are
interleaved cond / uncond (2N values, the first two 1.0) and nearest-interpolated
per branch when N differs from the calibration's.

Conventions (`convention=`): "official" is the authors' (strict `E < delta`,
retention counted in calls, int(2N R)); "diffusers" is diffusers 0.42's
`MagCacheConfig` hook (`E <= delta`, retention int(R N + 0.5) steps per branch,
one ratio list of length N for every branch). They differ only at E == delta
and where 2N R is odd.

The env makes one decision per step: a step reuses only when both branches' gates
want to. At MORCA's 3.0x setting (0.9246, 8, 0.2) the authors' cond and uncond
masks differ; here such steps compute (`forms.branch_masks` gives each branch's own).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch

from . import forms

# Wan2.1-T2V-1.3B magnitude ratios shipped with MagCache4Wan2.1 (interleaved cond, uncond; 50 steps)
WAN21_T2V_13B_RATIOS = (1.0, 1.0, 1.0124, 1.02213, 1.00166, 1.0041, 0.99791, 1.00061, 0.99682, 0.99762, 0.99634,
                        0.99685, 0.99567, 0.99586, 0.99416, 0.99422, 0.99578, 0.99575, 0.9957, 0.99563, 0.99511,
                        0.99506, 0.99535, 0.99531, 0.99552, 0.99549, 0.99541, 0.99539, 0.9954, 0.99536, 0.99489,
                        0.99485, 0.99518, 0.99514, 0.99484, 0.99478, 0.99481, 0.99479, 0.99415, 0.99413, 0.99419,
                        0.99416, 0.99396, 0.99393, 0.99388, 0.99386, 0.99349, 0.99349, 0.99309, 0.99304, 0.9927,
                        0.9927, 0.99228, 0.99226, 0.99171, 0.9917, 0.99137, 0.99135, 0.99068, 0.99063, 0.99005,
                        0.99003, 0.98944, 0.98942, 0.98849, 0.98849, 0.98758, 0.98757, 0.98644, 0.98643, 0.98504,
                        0.98503, 0.9836, 0.98359, 0.98202, 0.98201, 0.97977, 0.97978, 0.97717, 0.97718, 0.9741,
                        0.97411, 0.97003, 0.97002, 0.96538, 0.96541, 0.9593, 0.95933, 0.95086, 0.95089, 0.94013,
                        0.94019, 0.92402, 0.92414, 0.90241, 0.9026, 0.86821, 0.86868, 0.81838, 0.81939)

# (delta, K_max, R): the authors' README settings for T2V-1.3B (E012K2R02 / E012K4R02) and MORCA's Table 7
SETTINGS = {"slow": (0.12, 2, 0.2), "fast": (0.12, 4, 0.2), "morca-2.4x": (0.15, 6, 0.2),
            "morca-3.0x": (0.9246, 8, 0.2), "morca-4.0x": (8.0, 40, 0.2)}
CONVENTIONS = ("official", "diffusers")


def nearest_interp(values, length: int) -> np.ndarray:
    """Nearest-index resampling of `values` to `length` entries (the authors' and diffusers' interpolation)."""
    values = np.asarray(values, dtype=float)
    if length == 1:
        return values[-1:]
    return values[np.round(np.arange(length) * (len(values) - 1) / (length - 1)).astype(int)]


def branch_ratios(ratios, num_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """(cond, uncond) ratios per step from an interleaved list, resampled per branch when 2N differs."""
    ratios = np.asarray(ratios, dtype=float)
    if ratios.ndim != 1 or len(ratios) < 2 or len(ratios) % 2:
        raise ValueError(f"MagCache ratios must be an interleaved cond/uncond list of even length >= 2, "
                         f"got shape {ratios.shape}")
    return nearest_interp(ratios[0::2], num_steps), nearest_interp(ratios[1::2], num_steps)


class MagGate:
    """One branch's MagCache accumulators (rho, E, k) over its per-step ratios."""

    def __init__(self, ratios, delta: float, max_skip: int, retained: int, strict: bool = True):
        self.ratios, self.delta, self.max_skip, self.retained, self.strict = ratios, delta, max_skip, retained, strict
        self.rho, self.err, self.k = 1.0, 0.0, 0
        self._pending = None
        self.drift: float | None = None  # this step's error increment |1 - rho|, read by ACID (None in retention)

    def wants_reuse(self, step: int) -> bool:
        rho = self.rho * float(self.ratios[step])
        err, k = self.err + abs(1.0 - rho), self.k + 1
        # what a reuse here would leave in the accumulators, also during retention: an exact budget's mask can
        # force a reuse on any free step, and the accumulators then advance as on every reuse
        self._pending = (rho, err, k)
        if step < self.retained:  # retention: always compute
            self.drift = None
            return False
        self.drift = abs(1.0 - rho)
        return self.below(self.delta)

    def below(self, threshold: float) -> bool:
        """MagCache's test of this step's accumulated error against `threshold` (its strictness), within K_max."""
        _, err, k = self._pending
        return (err < threshold if self.strict else err <= threshold) and k <= self.max_skip

    def commit(self, reused: bool) -> None:
        if reused:
            self.rho, self.err, self.k = self._pending
        else:
            self.rho, self.err, self.k = 1.0, 0.0, 0


class MagCache(forms.Rule):
    """MagCache's gate over given ratios (interleaved, 2N' values) with K_max and retention ratio R."""

    name = "magcache"

    def __init__(self, ratios=WAN21_T2V_13B_RATIOS, max_skip: int = 2, retention: float = 0.2,
                 convention: str = "official"):
        if isinstance(max_skip, bool) or not isinstance(max_skip, int) or max_skip < 0:
            raise ValueError(f"max_skip (K_max)={max_skip!r} must be an integer >= 0")
        if not (isinstance(retention, (int, float)) and 0 <= retention <= 1):
            raise ValueError(f"retention (R)={retention!r} must be a number in [0, 1]")
        if convention not in CONVENTIONS:
            raise ValueError(f"convention={convention!r}; valid: {CONVENTIONS}")
        branch_ratios(ratios, 2)  # validates the layout
        self.ratios, self.max_skip, self.retention, self.convention = ratios, max_skip, float(retention), convention

    def retained_steps(self, branch: int) -> int:
        """Steps of branch `branch` (0 cond, 1 uncond) inside the retention window."""
        n = self.context.num_steps
        if self.convention == "diffusers":
            return int(self.retention * n + 0.5)
        calls = int(2 * n * self.retention)  # call 2i + b is retained iff 2i + b < calls
        return max(0, math.ceil((calls - branch) / 2))

    def gates(self, threshold: float) -> list[MagGate]:
        cond, uncond = branch_ratios(self.ratios, self.context.num_steps)
        per_branch = {"cond": (cond, 0), "uncond": (uncond, 1)}
        return [MagGate(per_branch[b][0], threshold, self.max_skip, self.retained_steps(per_branch[b][1]),
                        strict=self.convention == "official") for b in self.context.branches]


def ratios_for(model: str | None, ratios=None):
    """Explicit ratios, else the ones fitted for `model` (packaged), else the shipped Wan2.1-1.3B ones."""
    if ratios is not None:
        return ratios
    fitted = forms.packaged_constants("magcache", model)
    if fitted is not None:
        return fitted["ratios"]
    if model not in (None, "wan21"):
        warnings.warn(f"no MagCache ratios fitted for {model!r} (morca fit-rules); using the shipped "
                      "Wan2.1-T2V-1.3B ones", stacklevel=3)
    return WAN21_T2V_13B_RATIOS


def build(form: str, env=None, pipe=None, setting: str | None = None, delta: float | None = None,
          max_skip: int | None = None, retention: float | None = None, ratios=None, convention: str = "official",
          branches=None, calibration=None, threshold_map=None):
    """A MagCache scheduler: `setting` (one of `SETTINGS`; default "slow" natively, "morca-3.0x"'s K_max and R for
    the global and exact forms, whose threshold is searched) with any of delta, K_max, R overridden."""
    if setting is None:
        setting = "slow" if form == "native" else "morca-3.0x"
    if setting not in SETTINGS:
        raise ValueError(f"setting={setting!r}; valid: {', '.join(SETTINGS)}")
    default_delta, default_skip, default_retention = SETTINGS[setting]
    source = forms.Source(env, pipe, branches, calibration)
    rule = MagCache(ratios_for(source.model, ratios), default_skip if max_skip is None else max_skip,
                    default_retention if retention is None else retention, convention)
    return forms.make_form(rule, form, default_delta if delta is None else delta, source, threshold_map)


@torch.no_grad()
def fit_ratios(denoiser, pairs) -> list[float]:
    """The authors' calibration on our residual cache: per step and branch, mean over tokens of
    ||r_t||_2 / ||r_{t-1}||_2 for the block-stack residual r of a no-cache run, averaged over the
    (prompt, seed) `pairs` (or dicts of `denoiser.start` arguments); interleaved cond/uncond, the first step
    padded with 1.0. diffusers' `MagCacheConfig(calibrate=True)` measures the same on a pipeline call."""
    per_pair = []
    for pair in pairs:
        denoiser.start(**(pair if isinstance(pair, dict) else {"prompt": pair[0], "seed": pair[1]}))
        previous, ratios = {}, []
        while not denoiser.done:
            i = denoiser.step_index
            denoiser.step(reuse=False)
            residuals = denoiser.cache_for(i).snapshot()["residuals"]
            for branch in ("cond", "uncond"):
                current = residuals.get(branch, residuals["cond"]).float()  # guidance off: one branch
                if branch in previous:
                    norms = current.norm(dim=-1) / previous[branch].norm(dim=-1)
                    ratios.append(float(norms.mean()))
                else:
                    ratios.append(1.0)
                previous[branch] = current
        per_pair.append(ratios)
    return [round(float(r), 6) for r in np.mean(per_pair, axis=0)]
