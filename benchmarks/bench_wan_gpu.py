"""Wan2.1-T2V-1.3B in MorcaEnv on a GPU, with random weights (nothing to download).

    python benchmarks/bench_wan_gpu.py                  # CUDA, 480p x 81 frames, 50 steps, bf16
    python benchmarks/bench_wan_gpu.py --steps 20 --ks 0 6 12 18 --out runs/bench_wan_gpu.json
    python benchmarks/bench_wan_gpu.py --tiny           # a tiny size on the CPU (the test runs this)

The transformer is diffusers' `WanTransformer3DModel` at the Wan2.1-T2V-1.3B config
(`WAN21_T2V_1_3B`: 30 blocks, 12 heads x 128, FFN 8960, text dim 4096; 1.42B
parameters), built directly on the device with random weights, and the VAE is
`AutoencoderKLWan` at its default (Wan2.1) config, also random. The umT5-XXL text
encoder (5.7B) is replaced by a one-layer random UMT5 with the same 4096-dim output
and the same 512-token padded context, so cross-attention costs what it costs with
the real encoder; prompt encoding happens once per video and is not in a step.
They are put together as a `WanPipeline` and injected into `MorcaWan21-v0`, so every
number comes from the env's own code path (cache hooks, SeaCache signal, latent
features, observation, solver, decode).

Measured, for each K in `--ks` (uniform schedule, one episode each after a warm-up):
the episode latency (`info["latency_s"]`), the realised speedup against the env's
stock generation, the env's overhead share (`info["overhead_s"] / info["latency_s"]`:
signal + features + observation, as benchmarks/bench_env.py reports it), and every
step's own latency split by action (a full step runs both CFG branches through the
30 blocks; a reuse step only the head and tail). Printed: one full / reuse step's
latency, the overhead share, the latency-vs-K line (least squares, with its
residual) and the speedup ceiling it implies at the largest feasible K.
Numbers from random weights time the same kernels as the real model (same shapes,
dtypes and code); the videos and PSNRs are meaningless.

`--batches 1 2 4`: then `MorcaVectorEnv` batches of those sizes on the same pipeline (`gym.make_vec`: one
transformer call per CFG branch and step for the batch, uniform schedules at the middle K), one batch of
episodes after a warm-up batch each: videos per second, their ratio to the batch of one, and the peak
device memory per video (CUDA). `python benchmarks/bench_vector.py --device cuda` measures MorcaTiny's batches,
where a GPU is latency-bound and batching pays most.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

# diffusers' config of Wan-AI/Wan2.1-T2V-1.3B-Diffusers, transformer/config.json
WAN21_T2V_1_3B = dict(
    patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
    text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
    eps=1e-6, image_dim=None, added_kv_proj_dim=None, rope_max_seq_len=1024,
)
PROMPT = "a corgi running along a beach at sunset, waves rolling in, cinematic lighting"


def count_parameters(config: dict) -> int:
    """Parameters of a `WanTransformer3DModel(**config)`, counted on the meta device (no memory, no time)."""
    from diffusers import WanTransformer3DModel

    with torch.device("meta"):
        model = WanTransformer3DModel(**config)
    return sum(p.numel() for p in model.parameters())


def real_pipeline(device: str, dtype: torch.dtype):
    """A random-weights WanPipeline with Wan2.1-T2V-1.3B's transformer and VAE, built on `device`."""
    from diffusers import AutoencoderKLWan, WanPipeline, WanTransformer3DModel

    from morca_env.models.random_wan import wan21_scheduler
    from morca_env.models.text import build_text_encoder, build_word_tokenizer, words_of

    torch.manual_seed(0)
    with torch.device(device):
        transformer = WanTransformer3DModel(**WAN21_T2V_1_3B).to(dtype).eval()
        vae = AutoencoderKLWan().to(torch.float32).eval()  # the official pipeline decodes in float32
        tokenizer = build_word_tokenizer(words_of([PROMPT]))
        text_encoder = build_text_encoder(len(tokenizer), d_model=WAN21_T2V_1_3B["text_dim"], heads=32).to(dtype)
    pipe = WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, scheduler=wan21_scheduler(),
                       transformer=transformer)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def tiny_pipeline():
    from morca_env.models.random_wan import build_tiny_wan_pipeline
    from morca_env.models.text import words_of

    return build_tiny_wan_pipeline("wan21", with_text_encoder=True, with_vae=True, vocabulary=words_of([PROMPT]))


class StepTimer:
    """Per-step denoiser latency split by action, read from the denoiser's own clock (it syncs CUDA)."""

    def __init__(self, env):
        self.env = env
        self.times: dict[int, list[float]] = {0: [], 1: []}
        denoiser = env.denoiser
        step = denoiser.step

        def timed_step(reuse: bool):
            before = denoiser.elapsed_s
            out = step(reuse)
            self.times[int(bool(reuse))].append(denoiser.elapsed_s - before)
            return out

        denoiser.step = timed_step

    def reset(self):
        self.times = {0: [], 1: []}


def fit_line(ks, latencies) -> tuple[float, float, float]:
    """(intercept s, slope s per reuse, max |residual| s) of latency = intercept + slope * K."""
    slope, intercept = np.polyfit(np.asarray(ks, float), np.asarray(latencies, float), 1)
    residual = np.asarray(latencies) - (intercept + slope * np.asarray(ks, float))
    return float(intercept), float(slope), float(np.abs(residual).max())


def run(args) -> dict | None:
    import gymnasium as gym

    import morca_env  # noqa: F401
    from morca_env.speedup.measure import run_uniform_episode

    if args.tiny:
        device, dtype = "cpu", torch.float32
        pipe = tiny_pipeline()
        size = dict(height=32, width=32, num_frames=9)
        params = sum(p.numel() for p in pipe.transformer.parameters())
    else:
        if not torch.cuda.is_available():  # `make bench` on a CPU machine: say so and skip
            print("bench_wan_gpu: no CUDA device here (torch.cuda.is_available() is False): skipped; "
                  "run it on a GPU machine, or --tiny for the CPU smoke size")
            return None
        device, dtype = "cuda", getattr(torch, args.dtype)
        t0 = time.perf_counter()
        pipe = real_pipeline(device, dtype)
        print(f"built the random Wan2.1-T2V-1.3B pipeline on {torch.cuda.get_device_name()} in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
        size = dict(height=480, width=832, num_frames=81)
        params = sum(p.numel() for p in pipe.transformer.parameters())
    steps = args.steps or (8 if args.tiny else 50)
    refs = args.reference_cache_dir or tempfile.mkdtemp(prefix="morca-bench-wan-refs-")
    env = gym.make("MorcaWan21-v0", pipeline=pipe, budget=0, num_inference_steps=steps, prompts=[PROMPT],
                   lpips=False, reference_cache_dir=refs, **size).unwrapped
    spec = env.budget_spec
    ks = sorted(set(args.ks)) if args.ks else sorted({0, spec.max_budget // 4, spec.max_budget // 2,
                                                      3 * spec.max_budget // 4, spec.max_budget})
    for k in ks:
        spec.check_budget(k)  # a clear error naming the valid range
    timer = StepTimer(env)
    t0 = time.perf_counter()
    run_uniform_episode(env, {"seed": 0, "budget": ks[-1]})  # warm-up: reference + stock timing + kernels
    print(f"warm-up (reference generation, stock timing, one episode): {time.perf_counter() - t0:.1f} s", flush=True)
    timer.reset()
    rows = []
    for k in ks:
        info = run_uniform_episode(env, {"seed": 0, "budget": k})
        rows.append({"K": k, "latency_s": info["latency_s"], "speedup": info["speedup"],
                     "overhead_share": info["overhead_s"] / info["latency_s"]})
        print(f"K={k:3d}: {info['latency_s']:8.3f} s  speedup {info['speedup']:.2f}x  "
              f"env overhead {100 * rows[-1]['overhead_share']:.2f}%", flush=True)
    env.close()
    full, reuse = np.median(timer.times[0]), np.median(timer.times[1]) if timer.times[1] else float("nan")
    intercept, slope, residual = fit_line([r["K"] for r in rows], [r["latency_s"] for r in rows])
    kmax = spec.max_budget
    result = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "dtype": str(dtype),
        "size": size, "steps": steps, "transformer_parameters": params, "tiny": bool(args.tiny),
        "full_step_s": float(full), "reuse_step_s": float(reuse), "reference_latency_s": env.reference_latency,
        "overhead_share_mean": float(np.mean([r["overhead_share"] for r in rows])),
        "line": {"intercept_s": intercept, "slope_s_per_reuse": slope, "max_residual_s": residual},
        "max_budget": kmax, "ceiling_speedup": intercept / (intercept + slope * kmax), "episodes": rows,
    }
    print(f"\n{result['device']}, {dtype}, {size['num_frames']}x{size['height']}x{size['width']}, {steps} steps, "
          f"transformer {params / 1e9:.3f}B parameters")
    print(f"one step: {1e3 * full:.1f} ms full (both CFG branches), {1e3 * reuse:.1f} ms reuse "
          f"({100 * reuse / full:.1f}% of a full step)")
    print(f"env overhead (signal + features + observation): {100 * result['overhead_share_mean']:.2f}% of an "
          "episode (mean over K)")
    print(f"latency vs K: {intercept:.3f} s {slope:+.4f} s per reuse (max residual {residual:.3f} s); "
          f"ceiling at K={kmax}: {result['ceiling_speedup']:.2f}x")
    if args.batches:
        result["batches"] = run_batches(pipe, size, steps, refs, args.batches, kmax // 2, device)
    return result


def run_batches(pipe, size: dict, steps: int, refs: str, batches: list[int], budget: int, device: str) -> list[dict]:
    """Videos/s and peak memory per video of MorcaVectorEnv batches of `batches` sizes at K = `budget`."""
    import gymnasium as gym

    from morca_env.rollout import rollout_batch
    from morca_env.schedulers.fixed import UniformInterval

    rows = []
    print(f"\nbatched episodes (MorcaVectorEnv), uniform schedules at K={budget}:")
    for n in batches:
        envs = gym.make_vec("MorcaWan21-v0", num_envs=n, pipeline=pipe, budget=budget, num_inference_steps=steps,
                            prompts=[PROMPT], lpips=False, reference_cache_dir=refs, **size)
        rollout_batch(envs, [UniformInterval() for _ in range(n)], seed=1000)  # warm-up: references, stock timing
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        rollout_batch(envs, [UniformInterval() for _ in range(n)], seed=2000)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated() / n / 2**30 if device == "cuda" else float("nan")
        rows.append({"num_envs": n, "videos_per_s": n / seconds, "seconds": seconds, "peak_gib_per_video": peak})
        envs.close()
        print(f"N={n:3d}: {rows[-1]['videos_per_s']:.3f} videos/s ({rows[-1]['videos_per_s'] / rows[0]['videos_per_s']:.2f}x "
              f"N={rows[0]['num_envs']}), peak {peak:.2f} GiB per video", flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="a tiny random pipeline on the CPU (smoke test, seconds)")
    p.add_argument("--steps", type=int, default=None, help="denoising steps (default 50; --tiny: 8)")
    p.add_argument("--ks", type=int, nargs="+", default=None,
                   help="reuse counts K to time (default: 0, 1/4, 1/2, 3/4 and all of the feasible maximum)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                   help="transformer dtype on CUDA")
    p.add_argument("--reference-cache-dir", default=None, help="default: a fresh temporary directory")
    p.add_argument("--out", type=Path, default=None, help="also write the numbers as JSON here")
    p.add_argument("--batches", type=int, nargs="+", default=None,
                   help="also time MorcaVectorEnv batches of these sizes (gym.make_vec), e.g. 1 2 4")
    args = p.parse_args(argv)
    if args.batches and min(args.batches) < 1:
        p.error(f"--batches {args.batches}: valid: integers >= 1")
    if args.steps is not None and args.steps < 3:
        p.error(f"--steps {args.steps}: valid: an integer >= 3 (the first and last steps are forced)")
    torch.set_num_threads(1 if args.tiny else torch.get_num_threads())
    result = run(args)
    if args.out and result is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
