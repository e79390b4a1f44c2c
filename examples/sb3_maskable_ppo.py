"""sb3-contrib MaskablePPO on MORCA: it reads the feasible actions from `env.action_masks()`.

    pip install 'morca-gym[sb3]'
    python examples/sb3_maskable_ppo.py                # MorcaTiny-v0, 2000 steps, then the benchmark
"""

from __future__ import annotations

import sys

import torch

import morca_env  # noqa: F401  (registers the envs)
from morca_env.evaluation import benchmark


def main(env_id: str = "MorcaTiny-v0", steps: int = 2000, score: bool = True, **env_kwargs):
    from sb3_contrib import MaskablePPO

    torch.set_num_threads(1)
    env = benchmark.training_env(env_id, **env_kwargs)
    model = MaskablePPO("MultiInputPolicy", env, n_steps=64, batch_size=64, seed=0, verbose=0, device="cpu")
    model.learn(total_timesteps=steps)
    env.close()
    if not score:
        return model
    result = benchmark.evaluate(model, env_id, name="MaskablePPO")  # predicts with the observation's mask
    print(result.table())
    return result


if __name__ == "__main__":
    main(steps=int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
