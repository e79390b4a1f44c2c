"""Latent features phi(x) of the scheduler state (paper Sec. 3.2, App. B.1).

phi(x) = (P3(x), P2(mean_T x), P2(var_T x)): a 3D average pool of the latent to
(C, 4, 8, 8) and 2D average pools of its temporal mean and variance to (C, 8, 8).
The observation stacks phi of x_t, x_{t+1} (previous step) and x_{j_t} (last
recompute): `pooled` (3C, 4, 8, 8) and `temporal` (6C, 8, 8) = 3 means then 3 variances.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

POOLED_GRID = (4, 8, 8)
TEMPORAL_GRID = (8, 8)


@dataclass(frozen=True)
class LatentFeatures:
    pooled: torch.Tensor  # (C, 4, 8, 8)
    mean: torch.Tensor  # (C, 8, 8)
    var: torch.Tensor  # (C, 8, 8)


def latent_features(latents: torch.Tensor) -> LatentFeatures:
    """phi(x) for a latent of shape (1, C, F, H, W) or (C, F, H, W); float32 on the latent's device."""
    with torch.no_grad():  # not a decorator: mutmut leaves decorated functions unmutated
        return latent_features_no_grad(latents)


def latent_features_no_grad(latents: torch.Tensor) -> LatentFeatures:
    """`latent_features` without its autograd context, for callers under `torch.no_grad()` or whose latents do
    not require grad (the observation builder: in an episode entering and leaving a context costs ~15 us)."""
    x = latents if latents.dtype == torch.float32 else latents.float()
    if x.ndim == 5:
        if x.shape[0] != 1:
            raise ValueError(f"latent_features expects batch size 1, got shape {tuple(latents.shape)}")
        x = x[0]
    if x.ndim != 4:
        raise ValueError(f"latent must be (C, F, H, W) or (1, C, F, H, W), got shape {tuple(latents.shape)}")
    (pool3, size3), (pool2, size2) = _feature_pools(x.shape)
    pooled = pool3(x, size3)
    # temporal means as sum / F: what mean computes, bitwise, in half its time on CPU (a middle-dim reduction)
    frames = x.shape[1]
    time_mean = x.sum(dim=1, keepdim=True).div_(frames)
    # (x - mean)^2 averaged by hand: torch's var over a middle dim is ~10x slower on CPU
    time_var = (x - time_mean).square_().sum(dim=1).div_(frames)
    mean = pool2(time_mean[:, 0], size2)
    var = pool2(time_var, size2)
    return LatentFeatures(pooled=pooled, mean=mean, var=var)


@functools.lru_cache(maxsize=256)
def _feature_pools(shape: torch.Size) -> tuple:
    """(pool, size) to `POOLED_GRID` and to `TEMPORAL_GRID` for a (C, F, H, W) latent: looked up once per call."""
    return _pool_for(tuple(shape[-3:]), POOLED_GRID), _pool_for(tuple(shape[-2:]), TEMPORAL_GRID)


@functools.lru_cache(maxsize=256)
def _pool_for(sizes: tuple[int, ...], grid: tuple[int, ...]) -> tuple:
    """(pool function, its kernel or output size), chosen once per shape: a fixed-kernel pool where the grid
    divides the sizes (the same numbers, measured ~20% cheaper on CPU), the adaptive pool otherwise; in an
    episode the Python of choosing it each call cost as much as a torch op."""
    if all(size % cells == 0 for size, cells in zip(sizes, grid)):
        return (F.avg_pool3d if len(grid) == 3 else F.avg_pool2d), tuple(size // cells for size, cells in zip(sizes, grid))
    return (F.adaptive_avg_pool3d if len(grid) == 3 else F.adaptive_avg_pool2d), grid


def stack_features(current: LatentFeatures, previous: LatentFeatures, last_recompute: LatentFeatures) -> tuple[np.ndarray, np.ndarray]:
    """The observation's (pooled, temporal) arrays for phi(x_t), phi(x_{t+1}), phi(x_{j_t})."""
    trio = (current, previous, last_recompute)
    pooled = torch.cat([f.pooled for f in trio], dim=0)
    temporal = torch.cat([f.mean for f in trio] + [f.var for f in trio], dim=0)
    if not pooled.is_cpu:
        pooled, temporal = pooled.cpu(), temporal.cpu()
    if pooled.dtype != torch.float32:  # `latent_features` gives float32; features built otherwise are cast
        pooled, temporal = pooled.float(), temporal.float()
    return pooled.numpy(), temporal.numpy()


def feature_shapes(channels: int) -> dict[str, tuple[int, ...]]:
    return {"pooled": (3 * channels, *POOLED_GRID), "temporal": (6 * channels, *TEMPORAL_GRID)}
