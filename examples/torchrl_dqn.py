"""torchrl on MORCA: its Gymnasium wrapper, its action-mask transform and a DQN loop from its parts.

    pip install morca-gym torchrl                       # torchrl needs gymnasium >= 1.1: the core install allows it
    python examples/torchrl_dqn.py                      # MorcaTiny-v0, 2000 frames, then the benchmark

`GymEnv(..., categorical_action_encoding=True)` keeps the Dict observation's keys; `mask_dtype="bool"` (the one
argument beyond torchrl's docs) gives the mask in torchrl's dtype, so `ActionMask()` reads it into the action spec
and random, epsilon-greedy and `QValueModule(action_mask_key=...)` actions are all feasible.
"""

from __future__ import annotations

import sys

import torch

import morca_env  # noqa: F401  (registers the envs with gymnasium, which torchrl's GymEnv reads)
from morca_env.evaluation import benchmark

FEATURES = ("pooled", "scalars", "temporal")


class Concat(torch.nn.Module):
    """The feature arrays, each flattened after the batch dims, side by side."""

    def __init__(self, ranks: dict):
        super().__init__()
        self.ranks = ranks

    def forward(self, *parts):
        return torch.cat([p.float().flatten(p.dim() - self.ranks[k]) for k, p in zip(FEATURES, parts)], dim=-1)


def main(env_id: str = "MorcaTiny-v0", frames: int = 2000, score: bool = True, **env_kwargs):
    from tensordict.nn import TensorDictModule, TensorDictSequential
    from torchrl.collectors import Collector
    from torchrl.data import LazyTensorStorage, ReplayBuffer
    from torchrl.envs import ActionMask, GymEnv, TransformedEnv
    from torchrl.modules import MLP, EGreedyModule, QValueModule
    from torchrl.objectives import DQNLoss, SoftUpdate

    torch.set_num_threads(1)
    kwargs = benchmark.training_kwargs(env_id, **env_kwargs)  # training prompts, speedups across the targets
    env = TransformedEnv(GymEnv(env_id, categorical_action_encoding=True, mask_dtype="bool", **kwargs), ActionMask())
    ranks = {k: len(env.observation_spec[k].shape) for k in FEATURES}
    policy = TensorDictSequential(
        TensorDictModule(Concat(ranks), in_keys=list(FEATURES), out_keys=["features"]),
        TensorDictModule(MLP(out_features=2, num_cells=[64, 64]), in_keys=["features"], out_keys=["action_value"]),
        QValueModule(spec=env.action_spec, action_mask_key="action_mask"))
    explore = TensorDictSequential(policy, EGreedyModule(env.action_spec, eps_init=0.5, eps_end=0.05,
                                                         annealing_num_steps=frames, action_mask_key="action_mask"))
    loss = DQNLoss(policy, action_space=env.action_spec, delay_value=True)
    loss.make_value_estimator(gamma=1.0)  # only the terminal PSNR is rewarded
    target = SoftUpdate(loss, eps=0.99)
    optim = torch.optim.Adam(loss.parameters(), lr=1e-3)
    buffer = ReplayBuffer(storage=LazyTensorStorage(10_000), batch_size=64)
    collector = Collector(env, explore, frames_per_batch=50, total_frames=frames)
    for batch in collector:
        buffer.extend(batch.reshape(-1))
        for _ in range(4):
            optim.zero_grad()
            loss(buffer.sample())["loss"].backward()
            optim.step()
            target.step()
        explore[-1].step(batch.numel())
    collector.shutdown()
    env.close()

    if not score:
        return policy
    result = benchmark.evaluate(policy, env_id, name="torchrl DQN")
    print(result.table())
    return result


if __name__ == "__main__":
    main(frames=int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
