"""MORCA gym: learned cache scheduling for Wan video diffusion as a Gymnasium environment.

    import gymnasium as gym, morca_env
    env = gym.make("MorcaTiny-v0", speedup=3.0)     # packaged CPU model
    env = gym.make("MorcaWan21-v0", speedup=3.0)    # Wan2.1-T2V-1.3B (GPU + weights)
"""

from .quiet import quiet_legacy_gym

quiet_legacy_gym()  # before anything imports the legacy gym package and prints its notice

from gymnasium.envs.registration import register, registry  # noqa: E402

from .accelerate import AccelerateResult, accelerate  # noqa: E402
from .budget import BudgetSpec, SpeedupCalibration, forced_recompute_steps  # noqa: E402
from .denoiser import DenoiserConfig, StepwiseDenoiser  # noqa: E402
from .models.presets import PRESETS  # noqa: E402

__version__ = "0.1.0"

ENV_IDS = tuple(preset.env_id for preset in PRESETS.values())

for _preset in PRESETS.values():
    if _preset.env_id not in registry:
        register(id=_preset.env_id, entry_point="morca_env.env:MorcaEnv", kwargs={"model": _preset.name})

__all__ = ["AccelerateResult", "BudgetSpec", "accelerate", "DenoiserConfig", "ENV_IDS", "SpeedupCalibration", "StepwiseDenoiser",
           "forced_recompute_steps"]
