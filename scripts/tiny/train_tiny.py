"""Train MorcaTiny, the embedded CPU text-to-video model (flow matching, Wan's conventions).

    python scripts/tiny/train_tiny.py                      # ~25 min on 2 CPU cores, writes the packaged weights
    python scripts/tiny/train_tiny.py --steps 50 --out /tmp/tiny   # smoke run

Rectified flow as in Wan: x_s = (1 - s) x0 + s eps, the model predicts eps - x0
at timestep 1000 s, with s drawn from the shift-3 transform of U(0, 1) (the same
shift the sampler uses). Prompts are dropped to "" 10% of the time so classifier-
free guidance works. The tokenizer is a word-level one over the grammar; the
small UMT5 text encoder is trained jointly. The saved weights are an EMA.
Seeded and resumable (`--resume`, checkpoints every `--checkpoint-every` steps).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from morca_env.io import atomic_path
from morca_env.models import tiny
from morca_env.models.tiny_data import all_scenes, render


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=4000)  # the shipped weights: 25.3 min on 2 cores
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--shift", type=float, default=3.0)
    p.add_argument("--high-noise-fraction", type=float, default=0.0,
                   help="share of each batch with sigma drawn from U(--high-noise-min, 1): the sampler's first steps, "
                        "where the prompt alone must fix what x_t cannot yet show (e.g. the direction of motion)")
    p.add_argument("--high-noise-min", type=float, default=0.95)
    p.add_argument("--init", type=Path, help="start from these weights (a MorcaTiny weights directory) instead of scratch")
    p.add_argument("--prompt-dropout", type=float, default=0.1)
    p.add_argument("--ema", type=float, default=0.999)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--run-dir", type=Path, default=Path("runs/train_tiny"))
    p.add_argument("--out", type=Path, default=None, help="weights directory (default: the packaged weights)")
    p.add_argument("--checkpoint-every", type=int, default=250)
    p.add_argument("--resume", action="store_true")
    args = p.parse_args(argv)
    if not 0.0 <= args.high_noise_fraction <= 1.0:
        p.error(f"--high-noise-fraction {args.high_noise_fraction} must be in [0, 1]")
    if not 0.0 <= args.high_noise_min < 1.0:
        p.error(f"--high-noise-min {args.high_noise_min} must be in [0, 1)")
    return args


def encode(pipe, prompts: list[str]) -> torch.Tensor:
    """Exactly WanPipeline._get_t5_prompt_embeds, with gradients: zeros past each prompt's length."""
    tokens = pipe.tokenizer(prompts, padding="max_length", max_length=tiny.MAX_SEQUENCE_LENGTH, truncation=True,
                            add_special_tokens=True, return_attention_mask=True, return_tensors="pt")
    hidden = pipe.text_encoder(tokens.input_ids, tokens.attention_mask).last_hidden_state
    return hidden * tokens.attention_mask[..., None].to(hidden.dtype)


def lr_at(step: int, args) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))


def save_weights(ema_pipe, out: Path, info: dict) -> None:
    """Write to a sibling temp dir, then swap it in: a crash never leaves half a model."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tiny.save_morca_tiny(ema_pipe, tmp, extra={"training": info})
    old = out.with_name(out.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out = args.out or tiny.weights_dir()
    args.run_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = args.run_dir / "checkpoint.pt"

    pipe = tiny.load_morca_tiny(directory=args.init) if args.init else tiny.build_untrained(seed=args.seed)
    modules = torch.nn.ModuleDict({"transformer": pipe.transformer, "text_encoder": pipe.text_encoder}).train()
    ema = copy.deepcopy(modules).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(modules.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=0.01)
    data_gen = torch.Generator().manual_seed(args.seed + 1)
    rng = np.random.default_rng(args.seed + 2)
    start, elapsed = 0, 0.0
    if args.resume and checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False)
        modules.load_state_dict(state["modules"])
        ema.load_state_dict(state["ema"])
        optimizer.load_state_dict(state["optimizer"])
        data_gen.set_state(state["data_gen"])
        rng.bit_generator.state = state["rng"]
        torch.set_rng_state(state["torch_rng"])
        start, elapsed = state["step"], state["elapsed"]
        print(f"resumed from step {start}")

    scenes = all_scenes()
    writer = SummaryWriter(str(args.run_dir / "tb"))
    bar = tqdm(range(start, args.steps), initial=start, total=args.steps, desc="train MorcaTiny", unit="step")
    t0 = time.perf_counter() - elapsed
    losses = []
    for step in bar:
        batch = [scenes[i] for i in rng.integers(len(scenes), size=args.batch_size)]
        x0 = render(batch, data_gen)
        prompts = ["" if rng.random() < args.prompt_dropout else s.prompt for s in batch]
        u = torch.rand(args.batch_size, generator=data_gen)
        sigma = args.shift * u / (1 + (args.shift - 1) * u)
        if args.high_noise_fraction > 0:
            high = torch.rand(args.batch_size, generator=data_gen) < args.high_noise_fraction
            sigma = torch.where(high, args.high_noise_min + (1 - args.high_noise_min) * u, sigma)
        noise = torch.randn(x0.shape, generator=data_gen)
        s = sigma[:, None, None, None, None]
        x_t = (1 - s) * x0 + s * noise
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args)
        pred = pipe.transformer(hidden_states=x_t, timestep=sigma * 1000, encoder_hidden_states=encode(pipe, prompts),
                                return_dict=False)[0]
        loss = torch.nn.functional.mse_loss(pred, noise - x0)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(modules.parameters(), 1.0)
        optimizer.step()
        decay = min(args.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            for p_ema, p in zip(ema.parameters(), modules.parameters()):
                p_ema.lerp_(p, 1 - decay)
        losses.append(loss.item())
        writer.add_scalar("train/loss", losses[-1], step)
        writer.add_scalar("train/grad_norm", float(grad_norm), step)
        writer.add_scalar("train/lr", lr_at(step, args), step)
        bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}")
        if (step + 1) % args.checkpoint_every == 0 or step + 1 == args.steps:
            state = {"modules": modules.state_dict(), "ema": ema.state_dict(), "optimizer": optimizer.state_dict(),
                     "data_gen": data_gen.get_state(), "rng": rng.bit_generator.state,
                     "torch_rng": torch.get_rng_state(), "step": step + 1, "elapsed": time.perf_counter() - t0}
            with atomic_path(checkpoint) as tmp:
                torch.save(state, tmp)
    writer.close()
    elapsed = time.perf_counter() - t0
    final_pipe = tiny.build_untrained(seed=args.seed)
    final_pipe.transformer.load_state_dict(ema["transformer"].state_dict())
    final_pipe.text_encoder.load_state_dict(ema["text_encoder"].state_dict())
    info = {"steps": args.steps, "batch_size": args.batch_size, "lr": args.lr, "shift": args.shift,
            "prompt_dropout": args.prompt_dropout, "ema": args.ema, "high_noise_fraction": args.high_noise_fraction,
            "high_noise_min": args.high_noise_min, "init": str(args.init) if args.init else None, "seed": args.seed, "threads": args.threads,
            "train_minutes": round(elapsed / 60, 1), "final_loss_mean_last_100": round(float(np.mean(losses[-100:])), 5)
            if losses else None}
    save_weights(final_pipe, Path(out), info)
    (args.run_dir / "train_info.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"saved MorcaTiny weights to {out} after {elapsed / 60:.1f} min: {json.dumps(info)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
