"""The MORCA scheduler network (paper App. B.1), as a plain torch module and as a d3rlpy encoder.

Input: MorcaEnv's observation as the tuple [pooled, temporal, scalars, action_mask], or flat in
the flat layout (`morca_env.observation.FLAT_KEYS`; `to_replay_buffer`'s default, `FlattenObservation(env)`):

* `pooled` (3C, 4, 8, 8): 3D CNN branch, conv widths (32, 32, 64), adaptive
  average pool to 2x2x2 -> 512 features (C = 16 for Wan);
* `temporal` (6C, 8, 8) (temporal means and variances): 2D CNN branch, widths
  (32, 32, 64), pool to 2x2 -> 256 features;
* the paper does not give strides; ours downsample early (3D: (1,2,2), 2, 1 on
  the 4x8x8 grid; 2D: 1, 2, 2), which cuts the CPU cost ~10x at the same widths
  (measured: a training step on MorcaTiny at batch 256 is dominated by conv3d);
* both -> linear 768 -> 128 + SiLU, the 7 scalars appended (135), then an MLP of
  two 256-unit layers with LayerNorm + SiLU.

Heads (policy: 2 logits, Q: 2 values, V: 1) are linear layers on the 256-d
trunk output; d3rlpy adds them itself around `MorcaEncoderFactory`'s encoder.
The action mask is not a network input: it masks the policy's logits.
`features` selects the latent features for the Table 3 ablation
("p3", "mean", "var", any subset; "" = scalars only).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from d3rlpy.models.encoders import EncoderFactory, register_encoder_factory
from torch import nn

from morca_env.observation import NUM_SCALARS, channels_of_flat, is_flat_shape, split_flat

ALL_FEATURES = ("p3", "mean", "var")
TRUNK_SIZE = 256
MASKED_LOGIT = -1e9


def parse_features(features: str | tuple[str, ...]) -> tuple[str, ...]:
    names = tuple(f for f in (features.split(",") if isinstance(features, str) else features) if f)
    bad = [f for f in names if f not in ALL_FEATURES]
    if bad:
        raise ValueError(f"unknown latent features {bad}; valid: {ALL_FEATURES} (comma separated, or '' for none)")
    return tuple(f for f in ALL_FEATURES if f in names)


def _branch(conv, in_channels: int, pool, strides) -> nn.Sequential:
    """Three convolutions of widths (32, 32, 64) with `strides`, then the adaptive pool."""
    stride1, stride2, stride3 = strides
    return nn.Sequential(
        conv(in_channels, 32, 3, stride=stride1, padding=1), nn.SiLU(),
        conv(32, 32, 3, stride=stride2, padding=1), nn.SiLU(),
        conv(32, 64, 3, stride=stride3, padding=1), nn.SiLU(),
        pool, nn.Flatten(),
    )


class MorcaTrunk(nn.Module):
    """Observation tuple -> 256-d state embedding (App. B.1)."""

    def __init__(self, channels: int, features: str | tuple[str, ...] = ALL_FEATURES, num_scalars: int = NUM_SCALARS):
        super().__init__()
        self.channels = channels
        self.features = parse_features(features)
        self.branch3d = (_branch(nn.Conv3d, 3 * channels, nn.AdaptiveAvgPool3d((2, 2, 2)), ((1, 2, 2), 2, 1))
                         if "p3" in self.features else None)
        temporal_parts = [f for f in ("mean", "var") if f in self.features]
        self.branch2d = (_branch(nn.Conv2d, 3 * channels * len(temporal_parts), nn.AdaptiveAvgPool2d((2, 2)), (1, 2, 2))
                         if temporal_parts else None)
        latent_size = (512 if self.branch3d is not None else 0) + (256 if self.branch2d is not None else 0)
        self.project = nn.Sequential(nn.Linear(latent_size, 128), nn.SiLU()) if latent_size else None
        mlp_in = (128 if latent_size else 0) + num_scalars  # the env's 7, or 8 with the baseline's action
        self.mlp = nn.Sequential(
            nn.Linear(mlp_in, TRUNK_SIZE), nn.LayerNorm(TRUNK_SIZE), nn.SiLU(),
            nn.Linear(TRUNK_SIZE, TRUNK_SIZE), nn.LayerNorm(TRUNK_SIZE), nn.SiLU(),
        )

    def forward(self, pooled: torch.Tensor, temporal: torch.Tensor, scalars: torch.Tensor) -> torch.Tensor:
        parts = []
        if self.branch3d is not None:
            parts.append(self.branch3d(pooled))
        if self.branch2d is not None:
            c3 = 3 * self.channels
            chunks = {"mean": temporal[:, :c3], "var": temporal[:, c3:]}
            parts.append(self.branch2d(torch.cat([chunks[f] for f in ("mean", "var") if f in self.features], dim=1)))
        inputs = [scalars]
        if parts:
            inputs.insert(0, self.project(torch.cat(parts, dim=1)))
        return self.mlp(torch.cat(inputs, dim=1))


def masked_logits(logits: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """Infeasible actions get a logit of -1e9 (probability 0, argmax never picks them)."""
    return logits.masked_fill(action_mask < 0.5, MASKED_LOGIT)


class MorcaNetwork(nn.Module):
    """The plain torch module: trunk + one head ("policy": 2 logits, "q": 2 values, "v": 1 value)."""

    HEAD_SIZES = {"policy": 2, "q": 2, "v": 1}

    def __init__(self, channels: int, head: str = "policy", features: str | tuple[str, ...] = ALL_FEATURES):
        super().__init__()
        if head not in self.HEAD_SIZES:
            raise ValueError(f"head={head!r}; valid: {tuple(self.HEAD_SIZES)}")
        self.head_name = head
        self.trunk = MorcaTrunk(channels, features)
        self.head = nn.Linear(TRUNK_SIZE, self.HEAD_SIZES[head])

    def forward(self, pooled, temporal, scalars, action_mask=None) -> torch.Tensor:
        out = self.head(self.trunk(pooled, temporal, scalars))
        if self.head_name == "policy" and action_mask is not None:
            out = masked_logits(out, action_mask)
        return out


class MorcaEncoder(nn.Module):
    """d3rlpy encoder: a tuple observation [pooled, temporal, scalars, action_mask] or a flat one -> 256 features."""

    def __init__(self, channels: int, features: str | tuple[str, ...], flat: bool = False,
                 num_scalars: int = NUM_SCALARS):
        super().__init__()
        self.trunk = MorcaTrunk(channels, features, num_scalars)
        self.flat = flat

    def forward(self, x) -> torch.Tensor:
        if self.flat:
            parts = split_flat(x, self.trunk.channels)
            return self.trunk(parts["pooled"], parts["temporal"], parts["scalars"])
        return self.trunk(x[0], x[1], x[2])


class SharedEncoder(nn.Module):
    """One encoder read by several heads (twin Q and V): a call with the very inputs, parameters and grad mode of
    the last call returns the last output, so the heads of one loss cost one encoder pass. A parameter update or a
    new batch changes the key, and the encoder runs again."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder
        self._last = None  # (inputs, their key, output) of the last call

    def _key(self, x) -> tuple:
        parts = tuple(x) if isinstance(x, (list, tuple)) else (x,)
        return (tuple(t._version for t in parts), torch.is_grad_enabled(),
                tuple(p._version for p in self.encoder.parameters()))

    def forward(self, x) -> torch.Tensor:
        key = self._key(x)
        if self._last is not None and self._last[0] is x and self._last[1] == key:
            return self._last[2]
        out = self.encoder(x)
        self._last = (x, key, out)  # holds x, so its id is never another batch's
        return out


def channels_of(observation_shape) -> int:
    """Latent channels C from a tuple observation shape ((3C, 4, 8, 8), (6C, 8, 8), (7,), (2,)) or a flat one."""
    try:
        if is_flat_shape(observation_shape):
            if len(observation_shape) != 1:
                raise TypeError
            return channels_of_flat(int(observation_shape[0]))
        pooled_shape = observation_shape[0]
        if len(pooled_shape) != 4 or pooled_shape[0] % 3:
            raise TypeError
    except (TypeError, IndexError, ValueError):
        raise ValueError(f"MorcaEncoderFactory needs MORCA observations, flat (to_replay_buffer's default) or the "
                         f"tuple [pooled, temporal, scalars, action_mask]; got shape {observation_shape!r}") from None
    return pooled_shape[0] // 3


@dataclass()
class MorcaEncoderFactory(EncoderFactory):
    """d3rlpy encoder factory for MORCA observations (`features`: comma-separated subset of p3,mean,var)."""

    features: str = "p3,mean,var"

    def create(self, observation_shape) -> MorcaEncoder:
        flat = is_flat_shape(observation_shape)
        return MorcaEncoder(channels_of(observation_shape), parse_features(self.features), flat=flat,
                            num_scalars=NUM_SCALARS if flat else int(observation_shape[2][0]))

    def create_with_action(self, observation_shape, action_size: int, discrete_action: bool = False):
        raise NotImplementedError("MORCA's networks condition on the state only; Q heads output one value per action")

    @staticmethod
    def get_type() -> str:
        return "morca"


register_encoder_factory(MorcaEncoderFactory)
