"""A CleanRL-style loop on MORCA: the batched vector env, gymnasium's own flatten, a masked policy gradient in one file.

    pip install morca-gym
    python examples/cleanrl_reinforce.py                # MorcaTiny-v0, 2000 steps, then the benchmark

`FlattenObservation` orders the flat vector as `morca_env.observation.FLAT_KEYS` (the mask first:
`FLAT_MASK`); `morca_env.wrappers.mask_of_flat` reads the mask back,
so the policy never samples an infeasible action. The reward is the terminal PSNR:
REINFORCE with a running-mean baseline, one update per batch of finished episodes.
"""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import morca_env  # noqa: F401  (registers the envs)
from morca_env.evaluation import benchmark
from morca_env.observation import as_flat
from morca_env.wrappers import mask_of_flat


def masked_logits(net: nn.Module, flat: torch.Tensor) -> torch.Tensor:
    mask = torch.as_tensor(mask_of_flat(flat.numpy()))
    return net(flat).masked_fill(~mask, -1e9)


def main(env_id: str = "MorcaTiny-v0", steps: int = 2000, num_envs: int = 2, lr: float = 3e-4, score: bool = True,
         **env_kwargs):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    kwargs = benchmark.training_kwargs(env_id, **env_kwargs)  # training prompts, speedups across the targets
    # the batched env (one transformer call per step for all sub-envs), flattened by gymnasium's vector wrapper
    envs = gym.wrappers.vector.FlattenObservation(gym.make_vec(env_id, num_envs=num_envs, **kwargs))
    size = envs.single_observation_space.shape[0]
    net = nn.Sequential(nn.Linear(size, 64), nn.Tanh(), nn.Linear(64, 2))
    optim = torch.optim.Adam(net.parameters(), lr=lr)
    obs, _ = envs.reset(seed=0)
    log_probs = [[] for _ in range(num_envs)]
    finished, baseline, step = [], None, 0
    resetting = np.zeros(num_envs, dtype=bool)  # gymnasium's default autoreset: the step after an end only resets
    while step < steps:
        dist = torch.distributions.Categorical(logits=masked_logits(net, torch.as_tensor(obs, dtype=torch.float32)))
        action = dist.sample()
        for i, lp in enumerate(dist.log_prob(action)):
            if not resetting[i]:  # that env ignores this action
                log_probs[i].append(lp)
        obs, reward, terminated, truncated, _ = envs.step(action.numpy())
        step += num_envs
        resetting = terminated | truncated
        for i in np.flatnonzero(resetting):
            finished.append((torch.stack(log_probs[i]).sum(), float(reward[i])))
            log_probs[i] = []
        if len(finished) >= num_envs:
            returns = torch.tensor([r for _, r in finished])
            baseline = returns.mean() if baseline is None else 0.9 * baseline + 0.1 * returns.mean()
            loss = -torch.stack([lp * (r - baseline) for lp, r in finished]).mean()
            optim.zero_grad()
            loss.backward()
            optim.step()
            finished = []
    envs.close()

    def act(obs) -> int:  # greedy, on the flat vector gymnasium's flatten would give
        flat = as_flat({k: np.asarray(v)[None] for k, v in obs.items()})  # = gymnasium's spaces.flatten
        with torch.no_grad():
            return int(masked_logits(net, torch.as_tensor(flat)).argmax())
    if not score:
        return act
    result = benchmark.evaluate(act, env_id, name="CleanRL-style REINFORCE")
    print(result.table())
    return result


if __name__ == "__main__":
    main(steps=int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
