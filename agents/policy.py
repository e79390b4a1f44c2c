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
        self._on_cpu = torch.device(self._device).type == "cpu"
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
        # the scheduler's time is paid in speedup (MorcaTiny: ~0.35 ms a call in an episode, 1.5% of a stock step):
        # a step with one feasible action needs no network, and a scalar-state network no latent features
        mask = obs["action_mask"]
        if self.deterministic and not (mask[0] and mask[1]):
            return 0 if mask[0] else 1  # what the masked argmax picks
        if self._network is not None:
            batch = observation_batch(obs) if self.reads_latents else [
                None, None, np.asarray(obs["scalars"], np.float32)[None], np.asarray(mask, np.float32)[None]]
            logits = self._network([x if x is None else torch.from_numpy(x) if self._on_cpu
                                    else torch.from_numpy(x).to(self._device) for x in batch])
            if self.deterministic:  # both actions feasible: argmax, ties to recompute as argmax breaks them
                recompute, reuse = logits[0].tolist()
                action = int(reuse > recompute)
            else:
                action = int(torch.distributions.Categorical(logits=logits).sample()[0])
        else:
            batch = observation_batch(obs)
            action = self.algo.predict(batch) if self.deterministic else self.algo.sample_action(batch)
            action = int(action[0])
        if not obs["action_mask"][action]:  # cannot happen with masked logits; guard for foreign algorithms
            action = 1 - action
        return action
