"""SeaCache's step-error proxy: the SEA filter, the step distance d_t and the threshold rule.

SeaCache (Chung et al., CVPR 2026) filters a step's input in the Fourier domain
with a per-axis Wiener-like gain that suppresses noise-dominated frequencies:

    a = 1 - sigma, b = sigma, S(f) = 1 / (|f|^p + 1e-16)          (p = power_exp = 3)
    G_k = a S / (a^2 S + b^2 + 1e-16),  G = prod_k G_k,  G /= mean(G)
    x~ = Re(IFFT(FFT(u) * G))

and measures the step distance d_t = mean|x~_t - x~_{t+1}| / (mean|x~_{t+1}| + 1e-16)
against the previous step's filtered input. Two choices of u:

* ``"official"``: block 0's modulated, normalised input on the (F', H', W') token
  grid, as the authors' Wan2.1 code does;
* ``"latent"``: the raw latent, as diffusers' ``SeaCacheConfig`` does.

Since G is real and even in every frequency, the filter is computed with real FFTs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

SignalKind = Literal["official", "latent"]
SIGNAL_KINDS = ("official", "latent")
_EPS = 1e-16


def _axis_power(size: int, power_exp: float, device: torch.device, half: bool) -> torch.Tensor:
    freqs = torch.fft.rfftfreq(size, device=device) if half else torch.fft.fftfreq(size, device=device)
    return 1.0 / (freqs.abs().pow(power_exp) + _EPS)


def sea_filter(x: torch.Tensor, sigma: float, axes: tuple[int, ...], power_exp: float = 3.0) -> torch.Tensor:
    """Apply the SEA filter to `x` over `axes` at noise level `sigma` (returns float32)."""
    x = x.float()
    axes = tuple(a % x.ndim for a in axes)
    sigma = min(max(float(sigma), 1e-6), 1.0 - 1e-6)
    a, b = 1.0 - sigma, sigma
    spectrum = torch.fft.rfftn(x, dim=axes)
    gain = None
    mean_gain = 1.0
    for k, axis in enumerate(axes):
        last = k == len(axes) - 1
        full = _axis_power(x.shape[axis], power_exp, x.device, half=False)
        g_full = a * full / (a * a * full + b * b + _EPS)
        mean_gain *= float(g_full.mean())
        if last:
            half = _axis_power(x.shape[axis], power_exp, x.device, half=True)
            g = a * half / (a * a * half + b * b + _EPS)
        else:
            g = g_full
        shape = [1] * x.ndim
        shape[axis] = g.shape[0]
        gain = g.reshape(shape) if gain is None else gain * g.reshape(shape)
    if mean_gain > 0:
        gain = gain / mean_gain
    spectrum.mul_(gain)
    # inverse in two stages: measured 2-3x faster than irfftn over all axes on CPU
    if len(axes) > 1:
        spectrum = torch.fft.ifftn(spectrum, dim=axes[:-1])
    return torch.fft.irfft(spectrum, n=x.shape[axes[-1]], dim=axes[-1])


def relative_l1(current: torch.Tensor, previous: torch.Tensor) -> float:
    """mean|current - previous| / (mean|previous| + 1e-16), averaged over the batch dimension."""
    cur = current.flatten(1)
    prev = previous.flatten(1)
    per_item = (cur - prev).abs().mean(dim=1) / (prev.abs().mean(dim=1) + _EPS)
    return float(per_item.mean())



def latent_signal_input(latents: torch.Tensor) -> torch.Tensor:
    """The raw latent (B, C, F, H, W); filtered over (F, H, W)."""
    return latents


def official_signal_input(transformer, latents: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
    """Block 0's modulated normalised input u = norm1(h) (1 + scale) + shift on the token grid.

    Returns (B, F', H', W', D). Runs only the patch embedding, the time embedding and
    block 0's first norm: a small fraction of one transformer call.
    """
    dtype = transformer.patch_embedding.weight.dtype  # ModelMixin.dtype walks all modules
    batch = latents.shape[0]
    p_t, p_h, p_w = transformer.config.patch_size
    grid = (latents.shape[2] // p_t, latents.shape[3] // p_h, latents.shape[4] // p_w)
    hidden = transformer.patch_embedding(latents.to(dtype)).flatten(2).transpose(1, 2)
    embedder = transformer.condition_embedder
    t = timestep.reshape(-1).expand(batch) if timestep.numel() == 1 else timestep
    t_freq = embedder.timesteps_proj(t)
    time_dtype = next(iter(embedder.time_embedder.parameters())).dtype
    temb = embedder.time_embedder(t_freq.to(time_dtype)).to(dtype)
    timestep_proj = embedder.time_proj(embedder.act_fn(temb)).unflatten(1, (6, -1))
    block = transformer.blocks[0]
    shift, scale = (block.scale_shift_table + timestep_proj.float()).chunk(6, dim=1)[:2]
    modulated = block.norm1(hidden.float()) * (1 + scale) + shift
    return modulated.reshape(batch, *grid, -1)


def signal_input_for_step(kind: SignalKind, denoiser) -> torch.Tensor:
    """The signal input of the denoiser's current step (before its decision)."""
    if kind == "official":
        i = denoiser.step_index
        return official_signal_input(denoiser.expert(i), denoiser.latents, denoiser.timestep(i))
    return latent_signal_input(denoiser.latents)


def signal_axes(kind: SignalKind) -> tuple[int, int, int]:
    """The (F, H, W) axes of each signal layout."""
    return (2, 3, 4) if kind == "latent" else (1, 2, 3)


@dataclass
class StepDistanceTracker:
    """Keeps the previous filtered signal; yields d_t and D_t (distance accumulated since the last recompute).

    `observe` is called once per step with the step's signal input before the
    decision; `record(action)` afterwards resets D_t on a recompute. The previous
    filtered signal is updated on every step, forced ones included (the official
    code stores the unfiltered input on forced steps; we treat that as a bug).
    """

    kind: SignalKind = "official"
    power_exp: float = 3.0
    distance: float = 0.0
    accumulated: float = 0.0
    _previous: torch.Tensor | None = field(default=None, repr=False)
    _since_recompute: float = 0.0

    def __post_init__(self):
        if self.kind not in SIGNAL_KINDS:
            raise ValueError(f"signal kind {self.kind!r} is not one of {SIGNAL_KINDS}")

    def reset(self) -> None:
        self.distance = self.accumulated = self._since_recompute = 0.0
        self._previous = None

    def observe(self, signal_input: torch.Tensor, sigma: float) -> float:
        with torch.no_grad():  # not a decorator: mutmut leaves decorated functions unmutated
            filtered = sea_filter(signal_input, sigma, signal_axes(self.kind), self.power_exp)
            self.distance = 0.0 if self._previous is None else relative_l1(filtered, self._previous)
            self._previous = filtered
            self.accumulated = self._since_recompute + self.distance
            return self.distance

    def record(self, action: int) -> None:
        self._since_recompute = 0.0 if action == 0 else self.accumulated


def seacache_reuses(accumulated: float, threshold: float) -> bool:
    """SeaCache's rule: reuse while the accumulated distance stays below the threshold."""
    return accumulated < threshold


@torch.no_grad()
def head_block_residual(model, cache, branch: str, hidden_states: torch.Tensor, timestep: torch.Tensor,
                        depth: int = 1) -> torch.Tensor:
    """FirstBlockCache's probe: blocks[:depth]'s output minus input (float32, tokens); see `head_block`."""
    tokens, output = head_block(model, cache, branch, hidden_states, timestep, depth)
    return output - tokens


@torch.no_grad()
def head_block(model, cache, branch: str, hidden_states: torch.Tensor, timestep: torch.Tensor,
               depth: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """The probe of FirstBlockCache and DiCache: blocks[:depth]'s (input tokens, output), float32, for `branch`
    at the model input `hidden_states` (B, C, F, H, W) and `timestep`, run before the step is decided.

    It repeats what a Wan transformer call does up to those blocks: the patch embedding, the
    time projection, and the blocks with the branch's text context and rotary embedding,
    which `cache` (`ResidualCache`) observed at that branch's latest call of this video (they
    do not change between steps). The blocks run with the cache bypassed. Costs `depth` blocks
    (plus the patch and time embeddings) per branch.
    """
    arguments = cache.head_arguments(branch)
    if arguments is None:
        raise RuntimeError(f"no call of branch {branch!r} observed yet in this video: the probe needs one computed "
                           "step of the same transformer first")
    if not 1 <= depth <= len(model.blocks):
        raise ValueError(f"probe depth={depth!r} must be in [1, {len(model.blocks)}] (blocks of this transformer)")
    tokens = model.patch_embedding(hidden_states).flatten(2).transpose(1, 2).contiguous()
    embedder = model.condition_embedder
    freq = embedder.timesteps_proj(timestep.reshape(-1))
    time_dtype = next(iter(embedder.time_embedder.parameters())).dtype
    if freq.dtype != time_dtype and time_dtype != torch.int8:
        freq = freq.to(time_dtype)
    temb = embedder.time_embedder(freq).type_as(arguments["encoder_hidden_states"])
    arguments = dict(arguments, temb=embedder.time_proj(embedder.act_fn(temb)).unflatten(1, (6, -1)))
    out = tokens
    with cache.bypassed():
        for block in model.blocks[:depth]:
            out = block(out, **arguments)
    return tokens.float(), out.float()
