"""The env ids, registered with gymnasium: one per model preset (`morca_env.models.presets`)."""

from __future__ import annotations

from gymnasium.envs.registration import register, registry

from .models.presets import PRESETS

ENV_IDS = tuple(preset.env_id for preset in PRESETS.values())


def register_envs() -> None:
    """Register every env id, its batched form (`gym.make_vec`) included (idempotent: importing `morca_env` does it, and so does each worker process)."""
    for preset in PRESETS.values():
        if preset.env_id not in registry:
            register(id=preset.env_id, entry_point="morca_env.env:MorcaEnv",
                     vector_entry_point="morca_env.vector:MorcaVectorEnv", kwargs={"model": preset.name})
