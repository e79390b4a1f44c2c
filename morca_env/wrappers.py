"""Small wrappers for RL libraries that take one flat array (and, some, a mask beside it).

The env's observation is a Dict. Libraries that take it as it is: stable-baselines3
(`MultiInputPolicy`), sb3-contrib's MaskablePPO (`env.unwrapped.action_masks()`),
torchrl (`GymEnv` + its `ActionMask` transform reads `action_mask`). For one flat
vector use gymnasium's own `FlattenObservation`: its order is the flat layout's
(`morca_env.observation.FLAT_KEYS`, the one `to_replay_buffer` writes), so a d3rlpy algorithm trained on a dataset reads the same
inputs in the env; the mask is `flat[FLAT_MASK]`, the first two entries. The env's own `flat=True` gives the
same vector without a wrapper (and the `observation="scalars"` track, 9 values).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from .observation import FLAT_MASK


class FlatWithMask(gym.ObservationWrapper):
    """{"obs": the flat observation (`morca_env.observation.FLAT_KEYS`), "mask": the feasible actions (bool)}: tianshou's
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


def sb3_vec_env(envs):
    """A `MorcaVectorEnv` as stable-baselines3's `VecEnv`, so sb3 and sb3-contrib (MaskablePPO reads
    `env_method("action_masks")`) train on one batched transformer call per step instead of a `DummyVecEnv` of
    single envs. sb3's conventions: a finished episode's sub-env returns its next first observation at once, the
    last one in `infos[i]["terminal_observation"]`; infos are one plain dict per sub-env."""
    return _sb3_adapter()(envs)


def _sb3_adapter():
    from stable_baselines3.common.vec_env import VecEnv

    from .vector import final_observation, sub_env_info

    global _SB3_ADAPTER
    if _SB3_ADAPTER is not None:
        return _SB3_ADAPTER

    class MorcaSB3VecEnv(VecEnv):
        def __init__(self, envs):
            if not hasattr(envs, "action_masks") or not hasattr(envs, "num_envs"):
                raise TypeError(f"sb3_vec_env takes a MorcaVectorEnv (gym.make_vec(...)), got {type(envs).__name__}")
            self.envs = envs
            super().__init__(envs.num_envs, envs.single_observation_space, envs.single_action_space)
            self._actions = None

        def reset(self):
            seeds = None if all(s is None for s in self._seeds) else self._seeds
            options = None if not any(self._options) else self._options
            obs, infos = self.envs.reset(seed=seeds, options=options)
            self.reset_infos = [sub_env_info(infos, n) for n in range(self.num_envs)]
            self._reset_seeds()
            self._reset_options()
            return obs

        def step_async(self, actions):
            self._actions = np.asarray(actions).reshape(self.num_envs).astype(np.int64)

        def step_wait(self):
            obs, rewards, terminated, truncated, infos = self.envs.step(self._actions)
            listed = [sub_env_info(infos, n) for n in range(self.num_envs)]
            dones = terminated | truncated
            if dones.any():  # every sub-env ends on the same step: start the next episodes now, as sb3 expects
                for n, info in enumerate(listed):
                    for key in ("final_obs", "final_info"):  # same_step autoreset's; sb3 has its own key
                        info.pop(key, None)
                    last = final_observation(infos, n) if "final_obs" in infos else {k: v[n] for k, v in obs.items()}
                    info["terminal_observation"] = {k: np.array(v) for k, v in last.items()}
                    info["TimeLimit.truncated"] = bool(truncated[n] and not terminated[n])
                if "final_obs" not in infos:  # next_step / disabled autoreset: reset here
                    obs, reset = self.envs.reset()
                    self.reset_infos = [sub_env_info(reset, n) for n in range(self.num_envs)]
            return obs, rewards.astype(np.float32), dones, listed

        def close(self):
            self.envs.close()

        def _targets(self, indices):
            return [self.envs] * len(self._get_indices(indices))

        def get_attr(self, attr_name, indices=None):
            return [getattr(target, attr_name) for target in self._targets(indices)]

        def set_attr(self, attr_name, value, indices=None):
            raise AttributeError(f"the sub-envs of a MorcaVectorEnv share their settings; {attr_name!r} cannot be set "
                                 "per sub-env")

        def env_method(self, method_name, *method_args, indices=None, **method_kwargs):
            rows = list(self._get_indices(indices))
            if method_name == "action_masks":
                masks = self.envs.action_masks()
                return [masks[n] for n in rows]
            result = getattr(self.envs, method_name)(*method_args, **method_kwargs)
            return [result] * len(rows)

        def env_is_wrapped(self, wrapper_class, indices=None):
            return [False] * len(self._get_indices(indices))

    _SB3_ADAPTER = MorcaSB3VecEnv
    return _SB3_ADAPTER


_SB3_ADAPTER = None
