"""MORCA agents: the scheduler network, discrete IQL (offline -> online) and REINFORCE.

Importing this package registers `MorcaEncoderFactory` and `DiscreteIQLConfig`
with d3rlpy, so `agents.checkpoint.load_learnable(path)` rebuilds a checkpoint
(safetensors + JSON config, verified against its checksum) after `import agents`.
"""

from morca_env.utils.extras import require
from morca_env.utils.quiet import quiet_d3rlpy

quiet_d3rlpy("the agents package (IQL, REINFORCE)")  # before d3rlpy is imported below: quiet, or a clear error
require("tensorboard", "the agents package's training logs")

from .iql import DiscreteIQL, DiscreteIQLConfig  # noqa: E402
from .networks import MorcaEncoderFactory, MorcaNetwork, MorcaTrunk
from .policy import MorcaEnsemble, MorcaPolicy, observation_batch
from .offline import OfflineConfig, OfflineTrainer  # noqa: E402
from .online import OnlineConfig, OnlineTrainer  # noqa: E402
from .reinforce import Reinforce, ReinforceConfig, ReinforcePolicy  # noqa: E402  (registers "reinforce"; policy, "morca")

__all__ = ["DiscreteIQL", "DiscreteIQLConfig", "MorcaEncoderFactory", "MorcaEnsemble", "MorcaNetwork", "MorcaPolicy",
           "OfflineConfig", "OfflineTrainer", "OnlineConfig", "OnlineTrainer", "Reinforce", "ReinforceConfig", "ReinforcePolicy"]
