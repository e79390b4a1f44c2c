"""The MORCA scheduler's own cost on the CPU: per-step inference at Wan2.1's and MorcaTiny's feature sizes,
and discrete-IQL training throughput, measured in one run.

    python benchmarks/bench_scheduler.py [--threads 1] [--repeats 200] [--updates 30]

Inference = one policy forward (batch 1, masked logits, no grad), as the env
calls it once per denoising step. Wan2.1 has C = 16 latent channels, so the
observation is pooled (48, 4, 8, 8), temporal (96, 8, 8); MorcaTiny has C = 3.
Training = `DiscreteIQL.update` on batches of 256 random transitions of the
same shapes (critics + policy, the offline stage). Goal: inference
<= 2 ms per step at Wan2.1's sizes.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from d3rlpy.constants import ActionSpace
from d3rlpy.dataset import Episode, InfiniteBuffer, ReplayBuffer

from agents import DiscreteIQLConfig, MorcaNetwork


def observation(channels: int, batch: int) -> list[torch.Tensor]:
    mask = torch.ones(batch, 2)
    return [torch.randn(batch, 3 * channels, 4, 8, 8), torch.randn(batch, 6 * channels, 8, 8),
            torch.rand(batch, 7), mask]


def inference_ms(channels: int, repeats: int) -> float:
    net = MorcaNetwork(channels, head="policy").eval()
    obs = observation(channels, 1)
    with torch.no_grad():
        for _ in range(10):
            net(*obs)
        t0 = time.perf_counter()
        for _ in range(repeats):
            net(*obs).argmax(dim=1)
    return (time.perf_counter() - t0) / repeats * 1e3


def training_rate(channels: int, updates: int, batch_size: int = 256) -> float:
    rng = np.random.default_rng(0)
    episodes = []
    for _ in range(8):
        n = 50
        obs = [rng.standard_normal((n, 3 * channels, 4, 8, 8), dtype=np.float32),
               rng.standard_normal((n, 6 * channels, 8, 8), dtype=np.float32),
               rng.random((n, 7), dtype=np.float32), np.ones((n, 2), dtype=np.float32)]
        rewards = np.zeros((n, 1), dtype=np.float32)
        rewards[-1] = 20.0
        episodes.append(Episode(observations=obs, actions=rng.integers(0, 2, (n, 1)), rewards=rewards,
                                terminated=True))
    buffer = ReplayBuffer(InfiniteBuffer(), episodes=episodes, action_space=ActionSpace.DISCRETE, action_size=2)
    algo = DiscreteIQLConfig(batch_size=batch_size).create(device="cpu")
    algo.build_with_dataset(buffer)
    algo.update(buffer.sample_transition_batch(batch_size))  # warm-up
    t0 = time.perf_counter()
    for _ in range(updates):
        algo.update(buffer.sample_transition_batch(batch_size))
    return updates / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--updates", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"threads={args.threads}")
    for name, channels in (("Wan2.1 (C=16)", 16), ("MorcaTiny (C=3)", 3)):
        ms = inference_ms(channels, args.repeats)
        rate = training_rate(channels, args.updates)
        goal = f"   (goal <= 2 ms: {'met' if ms <= 2.0 else 'NOT met'})" if channels == 16 else ""
        print(f"{name:16s} inference {ms:6.2f} ms/step{goal}")
        print(f"{'':16s} IQL training {rate:6.2f} updates/s = {rate * 256:7.0f} transitions/s (batch 256)")


if __name__ == "__main__":
    main()
