"""MORCA agents: the scheduler network, discrete IQL (offline -> online) and REINFORCE.

Importing this package registers `MorcaEncoderFactory` and `DiscreteIQLConfig`
with d3rlpy, so `d3rlpy.load_learnable(path)` works after `import agents`.
"""

from .iql import DiscreteIQL, DiscreteIQLConfig
from .networks import MorcaEncoderFactory, MorcaNetwork, MorcaTrunk
from .policy import MorcaPolicy, observation_batch

__all__ = ["DiscreteIQL", "DiscreteIQLConfig", "MorcaEncoderFactory", "MorcaNetwork", "MorcaPolicy", "MorcaTrunk",
           "observation_batch"]
