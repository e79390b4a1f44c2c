"""Small wrappers for RL libraries that take one flat array (and, some, a mask beside it).

The env's observation is a Dict. Libraries that take it as it is: stable-baselines3
(`MultiInputPolicy`), sb3-contrib's MaskablePPO (`env.unwrapped.action_masks()`),
torchrl (`GymEnv` + its `ActionMask` transform reads `action_mask`). For one flat
vector use gymnasium's own `FlattenObservation`: its order (sorted keys: action_mask,
pooled, scalars, temporal) is `morca_env.observation.FLAT_KEYS`, the one
`to_replay_buffer` writes, so a d3rlpy algorithm trained on a dataset reads the same
inputs in the env; the mask is `flat[FLAT_MASK]`, the first two entries.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from .observation import FLAT_MASK


class FlatWithMask(gym.ObservationWrapper):
    """{"obs": the flat observation (gymnasium's flatten order), "mask": the feasible actions (bool)}: tianshou's
    convention (its DQN masks Q values with `obs.mask` and feeds `obs.obs` to the network)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self._dict_space = env.observation_space
        flat = spaces.flatten_space(self._dict_space)
        self.observation_space = spaces.Dict({"mask": spaces.MultiBinary(2), "obs": flat})

    def observation(self, observation):
        flat = spaces.flatten(self._dict_space, observation)
        return {"mask": (flat[FLAT_MASK] > 0).astype(np.int8), "obs": flat}


def mask_of_flat(flat: np.ndarray) -> np.ndarray:
    """The feasible-action mask (bool, (..., 2)) inside flat observations, e.g. a CleanRL loop's batch."""
    return np.asarray(flat)[..., FLAT_MASK] > 0
