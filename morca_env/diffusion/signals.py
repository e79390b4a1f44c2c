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

Since G is real, even and separable, the filter is applied as one real matrix per axis.
"""

from __future__ import annotations

import functools
import math
import weakref
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from diffusers.models.normalization import FP32LayerNorm

SignalKind = Literal["official", "latent"]
SIGNAL_KINDS = ("official", "latent")
_EPS = 1e-16


@functools.lru_cache(maxsize=1024)
def _axis_operator(size: int, sigma: float, power_exp: float, device: torch.device) -> torch.Tensor:
    """The SEA gain along one axis as the real (size, size) matrix that applies it, divided by the gain's mean.

    G_k is real and even, so IFFT(G_k * FFT(.)) along an axis is a real symmetric circulant
    matrix, and the separable G = prod_k G_k (and its mean) factor per axis. Built in float64
    once per (size, sigma): a sampler visits the same sigmas every video.
    """
    freqs = torch.fft.fftfreq(size, dtype=torch.float64)
    spectrum = 1.0 / (freqs.abs().pow(power_exp) + _EPS)
    a, b = 1.0 - sigma, sigma
    gain = a * spectrum / (a * a * spectrum + b * b + _EPS)
    operator = torch.fft.ifft(gain[:, None] * torch.fft.fft(torch.eye(size, dtype=torch.float64), dim=0), dim=0).real
    if float(gain.mean()) > 0:
        operator = operator / gain.mean()
    return operator.to(device=device, dtype=torch.float32)


# Consecutive filtered axes are applied as one operator (their Kronecker product) while it has at most this
# many rows: on small grids each op's fixed cost dominates, and on MorcaTiny's (4, 8, 8) grid merging the
# first two axes halved the filter's time (45 vs 87 us, one CPU thread); Wan's axes (21, 30, 52) stay apart.
_MERGED_AXES_SIZE = 32


@functools.lru_cache(maxsize=1024)
def _group_operator(sizes: tuple[int, ...], sigma: float, power_exp: float, device: torch.device) -> torch.Tensor:
    """The filter along consecutive axes of these sizes as one matrix (row-major flattening of the axes)."""
    operator = _axis_operator(sizes[0], sigma, power_exp, device)
    for size in sizes[1:]:
        operator = torch.kron(operator, _axis_operator(size, sigma, power_exp, device))
    return operator


def _axis_groups(shape: tuple[int, ...], axes: list[int]) -> list[list[int]]:
    """`axes` (sorted) split into runs of consecutive axes whose merged size stays within `_MERGED_AXES_SIZE`."""
    groups: list[list[int]] = []
    for axis in axes:
        if groups and groups[-1][-1] == axis - 1 and math.prod(shape[a] for a in groups[-1]) * shape[axis] <= _MERGED_AXES_SIZE:
            groups[-1].append(axis)
        else:
            groups.append([axis])
    return groups


@functools.lru_cache(maxsize=4096)
def _filter_plan(shape: tuple[int, ...], axes: tuple[int, ...], sigma: float, power_exp: float,
                 device: torch.device) -> tuple:
    """The matrix products that filter a tensor of `shape`: (operator, leading rows or None to right-multiply,
    merged size) per axis group, a left operator already expanded to its rows (one row too). Planned once per (shape,
    sigma): a sampler visits the same sigmas every video, and in an episode the per-call Python of planning
    cost ~40 us on MorcaTiny."""
    plan = []
    for group in _axis_groups(shape, sorted({a % len(shape) for a in axes})):
        size = math.prod(shape[a] for a in group)
        operator = _group_operator(tuple(shape[a] for a in group), sigma, power_exp, device)
        # the operator is symmetric: right-multiplying applies it along the last axes
        rows = None if group[-1] == len(shape) - 1 else math.prod(shape[:group[0]])
        plan.append((operator if rows is None else operator.expand(rows, size, size), rows, size))
    return tuple(plan)


def _sea_sigma(sigma: float) -> float:
    return min(max(float(sigma), 1e-6), 1.0 - 1e-6)


def _apply_filter_plan(x: torch.Tensor, plan: tuple) -> torch.Tensor:
    """x (float32) filtered by `plan`, in the layout of the plan's last product (reshape to x's shape)."""
    out = x
    # mm and bmm, not matmul: a 2-d operator times a 3-d tensor made matmul fold it through transposed copies
    # (measured 71 vs 56 us per filter on MorcaTiny's grid, bitwise the same result); a single left product is a
    # batch of one (bitwise mm's result)
    for operator, rows, size in plan:
        if rows is None:
            out = torch.mm(out.reshape(-1, size), operator)
        else:
            out = torch.bmm(operator, out.reshape(rows, size, -1))
    return out


def sea_filter(x: torch.Tensor, sigma: float, axes: tuple[int, ...], power_exp: float = 3.0) -> torch.Tensor:
    """Apply the SEA filter to `x` over `axes` at noise level `sigma` (returns float32).

    One small matrix product per axis (`_axis_operator`, small neighbouring axes merged) on a
    reshaped view, no FFT and no transposed copies: the same linear map, measured 10x faster
    than rfftn + inverse on MorcaTiny's (4, 8, 8) x 96 token grid and 2-3x on Wan2.1's
    (21, 30, 52) on one CPU thread.
    """
    if x.dtype != torch.float32:
        x = x.float()
    plan = _filter_plan(tuple(x.shape), tuple(axes), _sea_sigma(sigma), float(power_exp), x.device)
    return _apply_filter_plan(x, plan).reshape(x.shape)


def relative_l1(current: torch.Tensor, previous: torch.Tensor) -> float:
    """mean|current - previous| / (mean|previous| + 1e-16), averaged over the batch dimension."""
    if current.shape[0] == 1:
        return _relative_l1_of_one(current, previous)
    size = current[0].numel()
    cur = current.reshape(current.shape[0], -1)
    prev = previous.reshape(previous.shape[0], -1)
    # both sums in one tensor, read back once (measured: a third of this function's cost was the reads)
    differences, magnitudes = torch.stack([(cur - prev).abs_().sum(dim=1), prev.abs().sum(dim=1)]).tolist()
    return sum(d / size / (m / size + _EPS) for d, m in zip(differences, magnitudes)) / len(differences)


def _relative_l1_of_one(current: torch.Tensor, previous: torch.Tensor) -> float:
    """`relative_l1` of one video in any layout: no per-item sums (in an episode each torch op costs 10-40 us)."""
    # two reads: cheaper than stacking the sums
    difference, magnitude = (current - previous).abs().sum().item(), previous.abs().sum().item()
    size = current.numel()
    return difference / size / (magnitude / size + _EPS)


def latent_signal_input(latents: torch.Tensor) -> torch.Tensor:
    """The raw latent (B, C, F, H, W); filtered over (F, H, W)."""
    return latents


def official_signal_input(transformer, latents: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
    """Block 0's modulated normalised input u = norm1(h) (1 + scale) + shift on the token grid.

    Returns (B, F', H', W', D). Runs only the patch embedding and block 0's first norm (the
    time modulation is kept per timestep, `_block0_modulation`): a small fraction of one
    transformer call. The patch embedding is called as the transformer's module, so where a
    `ResidualCache` is installed (the env, `accelerate`) the transformer's own calls on the
    same input get it from the cache's memo instead of computing it again.
    """
    with torch.no_grad():  # not a decorator: mutmut leaves decorated functions unmutated
        dtype = transformer.patch_embedding.weight.dtype  # ModelMixin.dtype walks all modules
        shift, gain = _block0_modulation(transformer, timestep, latents.shape[0], dtype)
        return _modulated_block0_input(transformer, transformer.patch_embedding(latents.to(dtype)), shift, gain)


_READ_NOW = object()


def _modulated_block0_input(transformer, patches: torch.Tensor, shift: torch.Tensor, gain: torch.Tensor,
                            norm=_READ_NOW) -> torch.Tensor:
    """norm1(patches as tokens) * gain + shift, as (B, F', H', W', D); `patches` is the patch embedding's
    output (B, D, F', H', W').

    `norm`: what `_plain_norm1` read of this transformer (the caller's, read once per video, or
    read now); for one video the modulated norm is then one layer_norm with the modulation as its affine.
    """
    if norm is _READ_NOW:
        norm = _plain_norm1(transformer)
    batch = patches.shape[0]
    if norm is not None and batch == 1:
        # tokens last as a view (contiguous when the patches come token-major from the cache's memo; else
        # layer_norm copies it), in the (B, F', H', W', D) layout returned
        hidden = patches.permute(0, 2, 3, 4, 1)
        if hidden.dtype != torch.float32:
            hidden = hidden.float()
        if gain.dim() != 1:  # `_VideoSignal` keeps them flat already: two ops fewer per step
            gain, shift = gain.reshape(-1), shift.reshape(-1)
        return F.layer_norm(hidden, norm[0], gain, shift, norm[1])
    hidden = patches.flatten(2).transpose(1, 2)
    modulated = transformer.blocks[0].norm1(hidden.float()) * gain + shift
    return modulated.reshape(batch, *patches.shape[2:], -1)


_MODULATION_MEMO: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _module_weights(module: torch.nn.Module, found: list) -> list:
    """`found` extended by every parameter of `module` and its children, read from the live attribute dicts
    (a replaced parameter or child shows); a third of `Module.parameters()`'s cost, measured."""
    found.extend(w for w in module._parameters.values() if w is not None)
    for child in module._modules.values():
        if child is not None:
            _module_weights(child, found)
    return found


def _modulation_weights_key(transformer) -> tuple:
    """The storage and in-place version of every weight block 0's modulation reads: a moved, cast, reloaded
    or trained weight gives another key."""
    embedder = transformer.condition_embedder
    weights = _module_weights(embedder.time_embedder,
                              _module_weights(embedder.time_proj, [transformer.blocks[0].scale_shift_table]))
    return tuple((id(w), w.data_ptr(), w._version) for w in weights)


def _block0_modulation(transformer, timestep: torch.Tensor, batch: int, dtype: torch.dtype,
                       weights_key: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Block 0's (shift, 1 + scale) at `timestep`, float32, as the transformer computes them.

    They depend on the timestep and the weights only, so they are kept per transformer and
    timestep (a sampler visits the same timesteps in every video; measured: the time
    embedding was half of the signal's cost on MorcaTiny) and recomputed when any weight
    they read is replaced or written in place (`weights_key`: the caller's, or read now).
    """
    embedder = transformer.condition_embedder
    block = transformer.blocks[0]
    memo = _MODULATION_MEMO.setdefault(transformer, {})
    key = (tuple(timestep.reshape(-1).tolist()), batch, dtype, weights_key or _modulation_weights_key(transformer))
    if key not in memo:
        t = timestep.reshape(-1).expand(batch) if timestep.numel() == 1 else timestep
        t_freq = embedder.timesteps_proj(t)
        time_dtype = next(iter(embedder.time_embedder.parameters())).dtype
        temb = embedder.time_embedder(t_freq.to(time_dtype)).to(dtype)
        timestep_proj = embedder.time_proj(embedder.act_fn(temb)).unflatten(1, (6, -1))
        if len(memo) >= 1024:  # another sampler or weights: start over rather than grow
            memo.clear()
        shift, scale = (block.scale_shift_table + timestep_proj.float()).chunk(6, dim=1)[:2]
        memo[key] = shift, 1 + scale
    return memo[key]


class _VideoSignal:
    """The official signal of each step of one denoiser's videos, reading the transformer once per video.

    A diffusers pipeline call reads its weights once per video too; here per step that reading
    (checking the weights behind the memoised time modulation, looking up modules and
    parameters through `nn.Module.__getattr__`) cost about as much as the arithmetic inside a
    MorcaTiny episode. A weight replaced or written in place mid-video is seen from the next
    video on; `official_signal_input` checks at every call. The patch embedding is the
    denoiser's (`StepwiseDenoiser.patch_embedding`): the step's own, computed once.
    """

    def __init__(self):
        self.run_id: int | None = None
        self.weights_keys: tuple = ()
        self.modulation: dict = {}  # (step, batch) -> (shift, gain), kept while the weights stay
        self.norms: list = []  # per expert: block 0's norm1 as (layer-norm shape, eps), or None

    def _read_transformers(self, denoiser) -> None:
        keys = tuple(_modulation_weights_key(model) for model in denoiser.experts)
        if keys != self.weights_keys:
            self.modulation.clear()
        self.run_id, self.weights_keys = denoiser.run_id, keys
        self.norms = [_plain_norm1(model) for model in denoiser.experts]

    def __call__(self, denoiser) -> torch.Tensor:
        if self.run_id != denoiser.run_id:
            self._read_transformers(denoiser)
        i = denoiser.step_index
        expert = denoiser.expert_of_step[i]
        model, patches = denoiser.experts[expert], denoiser.patch_embedding()
        batch = patches.shape[0]
        entry = (i, batch)
        if entry not in self.modulation:
            with torch.no_grad():  # it reads weights that require grad
                shift, gain = _block0_modulation(model, denoiser.timestep(i), batch, denoiser.transformer_dtype,
                                                 self.weights_keys[expert])
            # one video: flat (D,), the fused norm's affine as it is (and broadcast alike on the generic path)
            self.modulation[entry] = (shift.reshape(-1), gain.reshape(-1)) if batch == 1 else (shift, gain)
        shift, gain = self.modulation[entry]
        norm = self.norms[expert]
        if norm is None or batch != 1:  # the generic path calls norm1, whose weights may require grad
            with torch.no_grad():
                return _modulated_block0_input(model, patches, shift, gain, norm)
        # one layer_norm of tensors that require no grad (the patches come from `patch_embedding`'s no_grad): no
        # autograd context, whose entry and exit cost ~15 us per step in an episode
        return _modulated_block0_input(model, patches, shift, gain, norm)


def _plain_norm1(model) -> tuple | None:
    """Block 0's norm1 as (normalized shape, eps) when it is an affine-free `LayerNorm` / `FP32LayerNorm`
    without hooks (Wan's; on a float32 input both are one layer_norm), so that the modulation can be its
    affine; None for anything else, which is called as a module."""
    norm = model.blocks[0].norm1
    if type(norm) in (torch.nn.LayerNorm, FP32LayerNorm) and norm.weight is None and norm.bias is None \
            and not (norm._forward_hooks or norm._forward_pre_hooks):
        return norm.normalized_shape, norm.eps
    return None


_VIDEO_SIGNALS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def signal_input_for_step(kind: SignalKind, denoiser) -> torch.Tensor:
    """The signal input of the denoiser's current step (before its decision); for the official kind, equal to
    `official_signal_input` of `denoiser.step_input(...)` with the transformer read once per video."""
    if kind != "official":
        return latent_signal_input(denoiser.latents)
    signal = _VIDEO_SIGNALS.get(denoiser)
    if signal is None:
        signal = _VIDEO_SIGNALS[denoiser] = _VideoSignal()
    return signal(denoiser)  # enters no_grad itself where a step needs it


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
        """d_t of this step's signal input (also kept in `distance`; `accumulated` is D_t)."""
        with torch.no_grad():  # not a decorator: mutmut leaves decorated functions unmutated
            return self.observe_no_grad(signal_input, sigma)

    def observe_no_grad(self, signal_input: torch.Tensor, sigma: float) -> float:
        """`observe` without its autograd context, for callers under `torch.no_grad()` or whose signal does not
        require grad (the observation builder). `sea_filter` and `relative_l1` with the filtered signal kept in
        the filter's layout (one video): in an episode the reshapes and per-item sums the public functions make
        per call were a sixth of the cost."""
        plan = _filter_plan(tuple(signal_input.shape), signal_axes(self.kind), _sea_sigma(sigma), float(self.power_exp),
                            signal_input.device)
        filtered = _apply_filter_plan(signal_input if signal_input.dtype == torch.float32
                                      else signal_input.float(), plan)
        if self._previous is None:
            self.distance = 0.0
        elif signal_input.shape[0] == 1:
            self.distance = _relative_l1_of_one(filtered, self._previous)
        else:
            self.distance = relative_l1(filtered.reshape(signal_input.shape), self._previous.reshape(signal_input.shape))
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


class BatchStepDistanceTracker:
    """`StepDistanceTracker` for a batch of videos run in lockstep (`MorcaVectorEnv`): d_t and D_t per sample.

    The SEA filter runs once on the whole batch (its matrix products act on each sample's own rows), and the
    distances are summed per sample, so sample n's values equal those of a tracker fed that sample alone up to
    float32 summation order (the vector env's tests check it).
    """

    def __init__(self, kind: SignalKind = "official", power_exp: float = 3.0):
        if kind not in SIGNAL_KINDS:
            raise ValueError(f"signal kind {kind!r} is not one of {SIGNAL_KINDS}")
        self.kind, self.power_exp = kind, power_exp
        self.reset(1)

    def reset(self, batch: int) -> None:
        self.distance = np.zeros(batch)
        self.accumulated = np.zeros(batch)
        self._since_recompute = np.zeros(batch)
        self._previous: torch.Tensor | None = None

    def observe(self, signal_input: torch.Tensor, sigma: float) -> np.ndarray:
        """d_t of every sample (also kept in `distance`; `accumulated` is D_t), no autograd."""
        with torch.no_grad():
            plan = _filter_plan(tuple(signal_input.shape), signal_axes(self.kind), _sea_sigma(sigma),
                                float(self.power_exp), signal_input.device)
            filtered = _apply_filter_plan(signal_input.float(), plan).reshape(signal_input.shape[0], -1)
            if self._previous is None:
                self.distance = np.zeros(signal_input.shape[0])
            else:
                size = filtered.shape[1]
                differences, magnitudes = torch.stack([(filtered - self._previous).abs().sum(dim=1),
                                                       self._previous.abs().sum(dim=1)]).double().cpu().numpy()
                self.distance = differences / size / (magnitudes / size + _EPS)
        self._previous = filtered
        self.accumulated = self._since_recompute + self.distance
        return self.distance

    def record(self, actions) -> None:
        """The executed actions of the step (one per sample): a recompute (0) starts D_t again."""
        self._since_recompute = np.where(np.asarray(actions) == 0, 0.0, self.accumulated)
