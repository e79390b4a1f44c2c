"""A trained scheduler as a plain policy: `policy(obs) -> action` for MorcaEnv and evaluation."""

from __future__ import annotations

import numpy as np
import torch

from morca_env.observation import OBS_KEYS, as_tuple  # noqa: F401 (OBS_KEYS re-exported)


def observation_batch(obs: dict) -> list[np.ndarray]:
    """One env observation -> the tuple [pooled, temporal, scalars, action_mask] with a batch axis (float32)."""
    return [x[None] for x in as_tuple(obs)]


class MorcaPolicy:
    """Wraps a d3rlpy algorithm trained on tuple observations (e.g. `DiscreteIQL`).

    Follows the rule policies' protocol (`reset(obs, info)`, `__call__(obs)`);
    `deterministic=False` samples from the masked policy (online data collection).
    Actions are always feasible: the policy's logits are masked.
    """

    learned = True  # evaluation times its per-step cost and counts it in the speedup

    def __init__(self, algo, deterministic: bool = True):
        self.algo = algo
        self.deterministic = deterministic
        # our DiscreteIQL: call its masked policy network directly. d3rlpy's predict() costs ~0.3 ms
        # per call in conversions and checks, as much as MorcaTiny's scalar-state network itself
        # several times over, and a scheduler's own time is paid in speedup.
        impl = getattr(algo, "impl", None)
        network = getattr(impl, "policy", None) if impl is not None else None
        self._network = network if isinstance(network, torch.nn.Module) else None
        self._device = getattr(impl, "device", "cpu")
        factory = getattr(getattr(algo, "config", None), "actor_encoder_factory", None)
        self.reads_latents = bool(getattr(factory, "features", "p3"))  # unknown encoders: assume they do

    @classmethod
    def load(cls, path, device: str = "cpu", deterministic: bool = True) -> "MorcaPolicy":
        import agents  # noqa: F401  (registers our config and encoder with d3rlpy)

        from .checkpoint import load_learnable

        return cls(load_learnable(path, device=device), deterministic)

    def reset(self, obs, info) -> None:
        # latent features of a noisy latent are never all zero: zeros mean MorcaEnv(latent_features=False)
        if self.reads_latents and not np.any(obs["pooled"]):
            raise ValueError("this scheduler reads latent features (pooled/temporal) but the observation has none: "
                             "the env was made with latent_features=False; use latent_features=True")

    @torch.no_grad()
    def __call__(self, obs) -> int:
        batch = observation_batch(obs)
        if self._network is not None:
            logits = self._network([torch.from_numpy(x).to(self._device) for x in batch])
            action = (int(logits.argmax(dim=1)[0]) if self.deterministic
                      else int(torch.distributions.Categorical(logits=logits).sample()[0]))
        else:
            action = self.algo.predict(batch) if self.deterministic else self.algo.sample_action(batch)
            action = int(action[0])
        if not obs["action_mask"][action]:  # cannot happen with masked logits; guard for foreign algorithms
            action = 1 - action
        return action
