"""What one offline update costs: the MORCA scheduler's discrete IQL against the MLP algorithms of the board,
on the same transitions (MorcaTiny's observation sizes), measured in one run.

    python benchmarks/bench_update_cost.py [--threads 1] [--updates 20] [--channels 3]

Each algorithm is timed in alternating blocks (so a change in the machine's load falls on all of them), at its
leaderboard config (d3rlpy's defaults: DiscreteCQL and DQN at batch 32, DiscreteBC at 100; IQL at its own 256) and at
one common batch of 256. IQL reads the tuple observation through `MorcaEncoder` (two conv branches and an MLP
per network: four networks as the paper trains them, or with `shared_critic_encoder` one encoder under the twin Q
and V heads); the others read the flat observation through d3rlpy's default MLP encoder. The paper's IQL row is
split into its critic step (twin Q and V) and its actor step.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from d3rlpy.constants import ActionSpace
from d3rlpy.dataset import Episode, InfiniteBuffer, ReplayBuffer

from morca_env.observation import as_flat


def episodes(channels: int, count: int = 8, steps: int = 50) -> list[dict]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        mask = np.ones((steps, 2), dtype=np.float32)
        obs = {"pooled": rng.standard_normal((steps, 3 * channels, 4, 8, 8), dtype=np.float32),
               "temporal": rng.standard_normal((steps, 6 * channels, 8, 8), dtype=np.float32),
               "scalars": rng.random((steps, 7), dtype=np.float32), "action_mask": mask}
        rewards = np.zeros((steps, 1), dtype=np.float32)
        rewards[-1] = 20.0
        out.append({"obs": obs, "actions": rng.integers(0, 2, (steps, 1)), "rewards": rewards})
    return out


def buffer(data: list[dict], flat: bool) -> ReplayBuffer:
    keys = ("pooled", "temporal", "scalars", "action_mask")
    made = [Episode(observations=as_flat(e["obs"]) if flat else [e["obs"][k] for k in keys], actions=e["actions"],
                    rewards=e["rewards"], terminated=True) for e in data]
    return ReplayBuffer(InfiniteBuffer(), episodes=made, action_space=ActionSpace.DISCRETE, action_size=2)


def algorithms(batch: int | None):
    import d3rlpy

    import agents

    own = {} if batch is None else {"batch_size": batch}
    return {"IQL (MORCA)": (agents.DiscreteIQLConfig(**own), False),
            "IQL (MORCA), shared critic encoder": (agents.DiscreteIQLConfig(shared_critic_encoder=True, **own), False),
            "DiscreteCQL": (d3rlpy.algos.DiscreteCQLConfig(**own), True),
            "DQN": (d3rlpy.algos.DQNConfig(**own), True),
            "DiscreteBC": (d3rlpy.algos.DiscreteBCConfig(**own), True)}


def time_updates(data, batch: int | None, updates: int, blocks: int = 4) -> dict[str, tuple[float, int]]:
    built = {}
    for name, (config, flat) in algorithms(batch).items():
        algo = config.create(device="cpu")
        replay = buffer(data, flat)
        algo.build_with_dataset(replay)
        algo.update(replay.sample_transition_batch(config.batch_size))  # warm-up
        built[name] = (algo, replay, config.batch_size)
    spent = {name: 0.0 for name in built}
    for _ in range(blocks):
        for name, (algo, replay, size) in built.items():
            batches = [replay.sample_transition_batch(size) for _ in range(updates)]
            t0 = time.perf_counter()
            for b in batches:
                algo.update(b)
            spent[name] += time.perf_counter() - t0
    return {name: (spent[name] / (blocks * updates) * 1e3, built[name][2]) for name in built}


def iql_split(data, updates: int) -> tuple[float, float]:
    """ms per critic step and per actor step of one IQL update (batch 256)."""
    from d3rlpy.torch_utility import TorchMiniBatch

    import agents

    config = agents.DiscreteIQLConfig()
    algo = config.create(device="cpu")
    replay = buffer(data, flat=False)
    algo.build_with_dataset(replay)
    impl = algo.impl
    batches = [TorchMiniBatch.from_batch(replay.sample_transition_batch(config.batch_size), 1, "cpu:0",
                                         algo.observation_scaler, algo.action_scaler, algo.reward_scaler)
               for _ in range(updates + 1)]
    impl.update_critic(batches[0])
    t0 = time.perf_counter()
    for b in batches[1:]:
        impl.update_critic(b)
    critic = (time.perf_counter() - t0) / updates * 1e3
    t0 = time.perf_counter()
    for b in batches[1:]:
        impl.update_actor(b)
    return critic, (time.perf_counter() - t0) / updates * 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--updates", type=int, default=20, help="updates per algorithm and block (4 blocks)")
    p.add_argument("--channels", type=int, default=3, help="latent channels C (MorcaTiny 3, Wan 16)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    data = episodes(args.channels)
    print(f"threads={args.threads}, C={args.channels}, {args.updates} updates x 4 alternating blocks per algorithm")
    for label, batch in (("leaderboard configs", None), ("batch 256 for all", 256)):
        rows = time_updates(data, batch, args.updates)
        cql = rows["DiscreteCQL"][0]
        print(f"\n{label}:\n| algorithm | batch | ms / update | this / DiscreteCQL |\n|---|---|---|---|")
        for name, (ms, size) in rows.items():
            print(f"| {name} | {size} | {ms:.1f} | {ms / cql:.1f}x |")
    critic, actor = iql_split(data, args.updates)
    print(f"\nIQL (MORCA), batch 256: critic step {critic:.1f} ms, actor step {actor:.1f} ms")


if __name__ == "__main__":
    main()
