"""stable-baselines3 PPO and DQN on MORCA, unchanged: the Dict observation goes to `MultiInputPolicy`.

    pip install 'morca-gym[sb3]'
    python examples/sb3_ppo_dqn.py                     # MorcaTiny-v0, 2000 steps each, then the benchmark

Neither algorithm knows the action mask: the env turns an infeasible action into the
feasible one (counted in `info["projected"]`), so they are held to the budget anyway.
"""

from __future__ import annotations

import sys

import torch

import morca_env  # noqa: F401  (registers the envs)
from morca_env.evaluation import benchmark


def main(env_id: str = "MorcaTiny-v0", steps: int = 2000, score: bool = True, **env_kwargs) -> dict:
    from stable_baselines3 import DQN, PPO

    torch.set_num_threads(1)
    results = {}
    for algo, options in ((PPO, {"n_steps": 64, "batch_size": 64}), (DQN, {"learning_starts": 64, "buffer_size": 10_000})):
        env = benchmark.training_env(env_id, **env_kwargs)
        model = algo("MultiInputPolicy", env, seed=0, verbose=0, device="cpu", **options)
        model.learn(total_timesteps=steps)
        env.close()
        if score:
            results[algo.__name__] = result = benchmark.evaluate(model, env_id, name=algo.__name__)
            print(result.table())
        else:
            results[algo.__name__] = model
    return results


if __name__ == "__main__":
    main(steps=int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
