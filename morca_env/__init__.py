"""MORCA gym: learned cache scheduling for Wan video diffusion as a Gymnasium environment.

    import gymnasium as gym, morca_env
    env = gym.make("MorcaTiny-v0", speedup=3.0)     # packaged CPU model
    env = gym.make("MorcaWan21-v0", speedup=3.0)    # Wan2.1-T2V-1.3B (GPU + weights)

The public face: the env (`MorcaEnv`, its batched form `MorcaVectorEnv`, `ENV_IDS`), the scheduler registry (`make_scheduler`,
`scheduler_names`), `rollout` / `Trajectory`, `accelerate` (a stock pipeline under a scheduler),
and the datasets (`collect_dataset`, `to_replay_buffer`). Everything else stays importable from
its module.
"""

from .utils.quiet import quiet_legacy_gym

quiet_legacy_gym()  # before anything imports the legacy gym package and prints its notice

from .utils import deprecated_paths  # noqa: E402

deprecated_paths.install()  # the modules that moved into families answer at their old paths for one release

from .registration import ENV_IDS, register_envs  # noqa: E402

register_envs()

from .accelerate import AccelerateResult, accelerate  # noqa: E402
from .budget import BudgetSpec  # noqa: E402
from .rollout import Trajectory, rollout  # noqa: E402
from .schedulers import make as make_scheduler, names as scheduler_names  # noqa: E402
from .speedup.calibration import SpeedupCalibration  # noqa: E402

__version__ = "0.1.0"


def __getattr__(name: str):
    """The env and the dataset tools load on first use: their imports (torchmetrics, minari) cost ~3 s."""
    if name == "MorcaEnv":
        from .env import MorcaEnv

        return MorcaEnv
    if name == "MorcaVectorEnv":
        from .vector import MorcaVectorEnv

        return MorcaVectorEnv
    if name in ("CollectionRecipe", "collect_dataset", "to_replay_buffer"):
        from . import data

        return getattr(data, name)
    raise AttributeError(f"module 'morca_env' has no attribute {name!r}")


__all__ = ["AccelerateResult", "BudgetSpec", "CollectionRecipe", "ENV_IDS", "MorcaEnv", "MorcaVectorEnv",
           "SpeedupCalibration", "Trajectory", "accelerate", "collect_dataset", "make_scheduler", "rollout",
           "scheduler_names", "to_replay_buffer"]
