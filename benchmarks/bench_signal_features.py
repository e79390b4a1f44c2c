"""Per-step cost of the scheduler's inputs at Wan2.1's latent size (1, 16, 21, 60, 104), on the CPU.

    python benchmarks/bench_signal_features.py [--threads 1] [--repeats 20]

Times, per denoising step: the SEA-filtered step distance on the raw latent
(`latent` signal: filter + relative L1 against the previous step) and phi(x)
(P3 pool + temporal mean/variance pools). The `official` signal filters block 0's
modulated input (21 x 30 x 52 tokens x 1536 channels), which is GPU work on real
Wan; its CPU cost is printed for reference only. Ratios are to one MorcaTiny
transformer forward measured in the same run.
"""

from __future__ import annotations

import argparse
import time

import torch

from morca_env.diffusion.features import latent_features
from morca_env.diffusion.signals import relative_l1, sea_filter


def per_call(fn, repeats: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--official", action="store_true", help="also time the official signal's filter (slow on CPU)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    latent = torch.randn(1, 16, 21, 60, 104, generator=g)
    previous = sea_filter(torch.randn(1, 16, 21, 60, 104, generator=g), 0.5, (2, 3, 4))

    signal = per_call(lambda: relative_l1(sea_filter(latent, 0.5, (2, 3, 4)), previous), args.repeats)
    features = per_call(lambda: latent_features(latent), args.repeats)

    from morca_env.models.tiny import TRANSFORMER_CONFIG
    from morca_env.models.tiny_data import FRAMES, HEIGHT, WIDTH
    from diffusers import WanTransformer3DModel

    tiny = WanTransformer3DModel(**TRANSFORMER_CONFIG).eval()
    x, t, e = torch.randn(1, 3, FRAMES, HEIGHT, WIDTH), torch.tensor([500.0]), torch.randn(1, 16, TRANSFORMER_CONFIG["text_dim"])
    with torch.no_grad():
        forward = per_call(lambda: tiny(x, t, e, return_dict=False), args.repeats)

    total = signal + features
    print(f"threads={args.threads} latent=(1, 16, 21, 60, 104)")
    print(f"  signal (SEA filter + d_t):      {signal * 1e3:8.2f} ms")
    print(f"  features phi(x):                {features * 1e3:8.2f} ms")
    print(f"  signal + features per step:     {total * 1e3:8.2f} ms   (goal <= 5 ms: {'met' if total <= 5e-3 else 'NOT met'})")
    print(f"  MorcaTiny forward (1 call):     {forward * 1e3:8.2f} ms")
    print(f"  ratio (signal+features)/forward: {total / forward:8.2f}")
    if args.official:
        u = torch.randn(1, 21, 30, 52, 1536, generator=g)
        official = per_call(lambda: sea_filter(u, 0.5, (1, 2, 3)), 2)
        print(f"  official signal filter (CPU, reference only): {official * 1e3:8.1f} ms")


if __name__ == "__main__":
    main()
