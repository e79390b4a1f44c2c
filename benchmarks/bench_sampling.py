"""How much of an offline IQL update is batch sampling, with d3rlpy's sampler and with `TransitionSampler`?

    python benchmarks/bench_sampling.py [--episodes 400] [--updates 200] [--threads 1]

The buffer is the quickstart's: MorcaTiny-shaped episodes of 50 steps with the terminal PSNR as
the only reward, n_step=50 returns, the scalar-state network, batches of 256. Both samplers run
in this process, alternating, fastest of `--repeats`; the script prints per-batch and per-update
times and their ratios, measured in one run (the machine is noisy), after checking that both
give the same batch from the same seed.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from morca_env.utils.threads import configure_threads


def quickstart_like_buffer(episodes: int, steps: int = 50):
    from d3rlpy.dataset import Episode

    from agents.training import make_buffer

    rng = np.random.default_rng(0)
    out = []
    for _ in range(episodes):
        obs = [rng.standard_normal((steps, 9, 4, 8, 8)).astype(np.float32),
               rng.standard_normal((steps, 18, 8, 8)).astype(np.float32),
               rng.random((steps, 7)).astype(np.float32), np.ones((steps, 2), np.float32)]
        rewards = np.zeros((steps, 1), np.float32)
        rewards[-1] = rng.uniform(15, 35)
        out.append(Episode(observations=obs, actions=rng.integers(0, 2, (steps, 1)), rewards=rewards, terminated=True))
    return make_buffer(out, n_step=50)


def fastest(fn, count: int, repeats: int) -> float:
    """Seconds per call, fastest of `repeats` runs of `count` calls."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(count):
            fn()
        best = min(best, (time.perf_counter() - t0) / count)
    return best


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=400)
    p.add_argument("--updates", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    print(f"torch threads: {configure_threads(args.threads)}")
    from agents.iql import DiscreteIQLConfig
    from agents.networks import MorcaEncoderFactory
    from agents.sampling import TransitionSampler

    buffer = quickstart_like_buffer(args.episodes)
    t0 = time.perf_counter()
    sampler = TransitionSampler(buffer)
    build = time.perf_counter() - t0
    np.random.seed(0)
    theirs = buffer.sample_transition_batch(256)
    np.random.seed(0)
    ours = sampler.sample(256)
    assert all(np.array_equal(a, b) for a, b in zip(ours.observations + ours.next_observations,
                                                   theirs.observations + theirs.next_observations))
    assert np.array_equal(ours.rewards, theirs.rewards) and np.array_equal(ours.terminals, theirs.terminals)

    encoder = MorcaEncoderFactory(features="")
    algo = DiscreteIQLConfig(actor_encoder_factory=encoder, critic_encoder_factory=encoder,
                             value_encoder_factory=encoder, batch_size=256).create(device="cpu")
    algo.build_with_dataset(buffer)
    for _ in range(10):  # warm-up
        algo.update(sampler.sample(256))
    sample_d3, sample_ours, update_d3, update_ours = (float("inf"),) * 4
    for _ in range(args.repeats):  # alternate, so a slow spell of the machine hits both
        sample_d3 = min(sample_d3, fastest(lambda: buffer.sample_transition_batch(256), 50, 1))
        sample_ours = min(sample_ours, fastest(lambda: sampler.sample(256), 50, 1))
        update_d3 = min(update_d3, fastest(lambda: algo.update(buffer.sample_transition_batch(256)), args.updates, 1))
        update_ours = min(update_ours, fastest(lambda: algo.update(sampler.sample(256)), args.updates, 1))
    print(f"buffer: {args.episodes} episodes, {buffer.transition_count} transitions, n_step 50, batch 256")
    print(f"TransitionSampler built in {build:.2f} s (once per buffer: offline run, online round)")
    print(f"{'':24}{'d3rlpy':>12}{'TransitionSampler':>20}{'ratio':>8}")
    print(f"{'sample a batch (ms)':24}{sample_d3 * 1e3:12.2f}{sample_ours * 1e3:20.2f}{sample_d3 / sample_ours:8.1f}")
    print(f"{'sample + update (ms)':24}{update_d3 * 1e3:12.2f}{update_ours * 1e3:20.2f}{update_d3 / update_ours:8.2f}")
    print(f"sampling share of an update with d3rlpy's batches: {sample_d3 / update_d3:.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
