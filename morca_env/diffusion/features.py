"""Latent features phi(x) of the scheduler state (paper Sec. 3.2, App. B.1).

phi(x) = (P3(x), P2(mean_T x), P2(var_T x)): a 3D average pool of the latent to
(C, 4, 8, 8) and 2D average pools of its temporal mean and variance to (C, 8, 8).
The observation stacks phi of x_t, x_{t+1} (previous step) and x_{j_t} (last
recompute): `pooled` (3C, 4, 8, 8) and `temporal` (6C, 8, 8) = 3 means then 3 variances.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

POOLED_GRID = (4, 8, 8)
TEMPORAL_GRID = (8, 8)


class LatentFeatures(NamedTuple):
    """phi(x), each pool in the latent's own (1, C, time, H, W) layout: `pooled` (1, C, 4, 8, 8), `mean` and
    `var` (1, C, 1, 8, 8) (time reduced to one). Kept so, with no view dropping the singleton axes (in an episode
    every torch call pays for cold code; `stack_features` drops them in numpy), and a named tuple, not a frozen
    dataclass. With every pool a 3D pool, the features' share of a 3x episode fell from 1.42 to 1.14%, their
    stacking's rose from 0.42 to 0.59% (the project's env-overhead benchmark, two runs each alternating with the code
    before this change and three smaller ones in the signal and the step distance)."""

    pooled: torch.Tensor
    mean: torch.Tensor
    var: torch.Tensor


def latent_features(latents: torch.Tensor) -> LatentFeatures:
    """phi(x) for a latent of shape (1, C, F, H, W) or (C, F, H, W); float32 on the latent's device."""
    with torch.no_grad():  # not a decorator: mutmut leaves decorated functions unmutated
        return latent_features_no_grad(latents)


def latent_features_no_grad(latents: torch.Tensor) -> LatentFeatures:
    """`latent_features` without its autograd context, for callers under `torch.no_grad()` or whose latents do
    not require grad (the observation builder: in an episode entering and leaving a context costs ~15 us)."""
    x = latents if latents.dtype == torch.float32 else latents.float()
    if x.ndim == 4:
        x = x.unsqueeze(0)
    if x.ndim != 5:
        raise ValueError(f"latent must be (C, F, H, W) or (1, C, F, H, W), got shape {tuple(latents.shape)}")
    if x.shape[0] != 1:
        raise ValueError(f"latent_features expects batch size 1, got shape {tuple(latents.shape)}; "
                         "batch_latent_features takes a batch")
    return _pools_of(x)


def batch_latent_features(latents: torch.Tensor) -> LatentFeatures:
    """phi(x) of each video of a batch (B, C, F, H, W), no autograd: row n equals `latent_features(latents[n:n+1])`
    (the same pools and reductions, each over its own row)."""
    if latents.ndim != 5:
        raise ValueError(f"batch_latent_features expects (B, C, F, H, W), got shape {tuple(latents.shape)}")
    with torch.no_grad():
        return _pools_of(latents if latents.dtype == torch.float32 else latents.float())


def _pools_of(x: torch.Tensor) -> LatentFeatures:
    (pool3, size3), (pool2, size2) = _feature_pools(x.shape)
    # every pool a 3D pool (the temporal ones over one frame, bitwise the 2D pool): one kind of op fewer per step
    pooled = pool3(x, size3)
    # temporal means as sum / F: what mean computes, bitwise, in half its time on CPU (a middle-dim reduction)
    frames = x.shape[2]
    time_mean = x.sum(dim=2, keepdim=True).div_(frames)
    # (x - mean)^2 averaged by hand: torch's var over a middle dim is ~10x slower on CPU
    time_var = (x - time_mean).square_().sum(dim=2, keepdim=True).div_(frames)
    return LatentFeatures(pooled, pool2(time_mean, size2), pool2(time_var, size2))


@functools.lru_cache(maxsize=256)
def _feature_pools(shape: torch.Size) -> tuple:
    """(pool, size) to `POOLED_GRID` and to `TEMPORAL_GRID` (over one frame) for a (1, C, F, H, W) latent: looked
    up once per call."""
    return _pool_for(tuple(shape[-3:]), POOLED_GRID), _pool_for((1, *shape[-2:]), (1, *TEMPORAL_GRID))


@functools.lru_cache(maxsize=256)
def _pool_for(sizes: tuple[int, int, int], grid: tuple[int, int, int]) -> tuple:
    """(3D pool function, its kernel or output size), chosen once per shape: a fixed-kernel pool where the grid
    divides the sizes (the same numbers, measured ~20% cheaper on CPU), the adaptive pool otherwise; in an
    episode the Python of choosing it each call cost as much as a torch op."""
    if all(size % cells == 0 for size, cells in zip(sizes, grid)):
        return F.avg_pool3d, tuple(size // cells for size, cells in zip(sizes, grid))
    return F.adaptive_avg_pool3d, grid


def stack_features(current: LatentFeatures, previous: LatentFeatures, last_recompute: LatentFeatures) -> tuple[np.ndarray, np.ndarray]:
    """The observation's (pooled, temporal) arrays for phi(x_t), phi(x_{t+1}), phi(x_{j_t}): (3C, 4, 8, 8) and
    (6C, 8, 8), float32, the concatenations' own buffers (their singleton axes dropped by numpy, free)."""
    trio = (current, previous, last_recompute)
    pooled = torch.cat([f.pooled for f in trio], dim=1)
    temporal = torch.cat([f.mean for f in trio] + [f.var for f in trio], dim=1)
    if not pooled.is_cpu:
        pooled, temporal = pooled.cpu(), temporal.cpu()
    if pooled.dtype != torch.float32:  # `latent_features` gives float32; features built otherwise are cast
        pooled, temporal = pooled.float(), temporal.float()
    shape = pooled.shape
    return pooled.numpy().reshape(shape[1:]), temporal.numpy().reshape(2 * shape[1], *shape[-2:])


def stack_batch_features(current: LatentFeatures, previous: LatentFeatures,
                         last_recompute: LatentFeatures) -> tuple[np.ndarray, np.ndarray]:
    """`stack_features` of a batch: (B, 3C, 4, 8, 8) and (B, 6C, 8, 8) float32."""
    trio = (current, previous, last_recompute)
    pooled = torch.cat([f.pooled for f in trio], dim=1).float().cpu()
    temporal = torch.cat([f.mean for f in trio] + [f.var for f in trio], dim=1).float().cpu()
    return pooled.numpy(), temporal.numpy().reshape(temporal.shape[0], temporal.shape[1], *temporal.shape[-2:])


def feature_shapes(channels: int) -> dict[str, tuple[int, ...]]:
    return {"pooled": (3 * channels, *POOLED_GRID), "temporal": (6 * channels, *TEMPORAL_GRID)}
