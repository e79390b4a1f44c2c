"""tianshou 2.x DQN on MORCA, with the action mask.

    pip install morca-gym tianshou
    python examples/tianshou_dqn.py                     # MorcaTiny-v0, 2000 steps, then the benchmark

tianshou's DQN masks Q values with `obs.mask` and feeds `obs.obs` to the network:
`morca_env.wrappers.FlatWithMask` gives exactly that (the flat observation,
`morca_env.observation.FLAT_KEYS`, and the feasible actions). The env's `info` has the same plain keys
at every step, which tianshou's buffers need.
"""

from __future__ import annotations

import sys

import gymnasium as gym
import torch

import morca_env  # noqa: F401  (registers the envs)
from morca_env.evaluation import benchmark
from morca_env.wrappers import FlatWithMask


def main(env_id: str = "MorcaTiny-v0", steps: int = 2000, score: bool = True, **env_kwargs):
    from tianshou.algorithm import DQN
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.data import Collector, VectorReplayBuffer
    from tianshou.env import DummyVectorEnv
    from tianshou.trainer import OffPolicyTrainerParams
    from tianshou.utils.net.common import Net

    torch.set_num_threads(1)
    torch.manual_seed(0)
    train_env = FlatWithMask(benchmark.training_env(env_id, **env_kwargs))  # the one wrapper tianshou needs
    envs = DummyVectorEnv([lambda: train_env])
    net = Net(state_shape=train_env.observation_space["obs"].shape, action_shape=2, hidden_sizes=[64, 64])
    policy = DiscreteQLearningPolicy(model=net, action_space=gym.spaces.Discrete(2), eps_training=0.2)
    algorithm = DQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3), gamma=1.0, target_update_freq=50)
    collector = Collector(algorithm, envs, VectorReplayBuffer(10_000, 1), exploration_noise=True)
    collector.reset()
    collector.collect(n_step=64)
    algorithm.run_training(OffPolicyTrainerParams(
        training_collector=collector, max_epochs=1, epoch_num_steps=steps, collection_step_num_env_steps=16,
        update_step_num_gradient_steps_per_sample=0.25, batch_size=64, test_collector=None, show_progress=False,
        verbose=False))
    envs.close()
    policy.eval()

    if not score:
        return policy
    result = benchmark.evaluate(policy, env_id, name="tianshou DQN")
    print(result.table())
    return result


if __name__ == "__main__":
    main(steps=int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
