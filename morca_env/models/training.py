"""Training of the packaged pixel models (MorcaTiny, MorcaScenes): rectified flow with Wan's conventions.

x_s = (1 - s) x0 + s eps; the model predicts eps - x0 at timestep 1000 s, with s drawn
from the shift-3 transform of U(0, 1) (the shift the sampler uses). Prompts drop to "" a
share of the time so classifier-free guidance works; the word-level text encoder trains
jointly; the saved weights are an EMA. Videos are rendered on the fly from the model's
grammar. A run is seeded and resumable: its checkpoint (tensors and RNG states only,
loaded with ``weights_only=True``) is written atomically every ``checkpoint_every``
steps and when the run is interrupted (SIGINT / SIGTERM), so a stopped run loses nothing.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import torch
from tqdm import tqdm

from ..utils.io import atomic_path, atomic_write_text
from . import pixel_model


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 4000
    batch_size: int = 32
    lr: float = 1e-3
    warmup: int = 200
    shift: float = 3.0
    high_noise_fraction: float = 0.0  # share of a batch with sigma from U(high_noise_min, 1): the first steps
    high_noise_min: float = 0.95
    prompt_dropout: float = 0.1
    ema: float = 0.999
    seed: int = 0
    checkpoint_every: int = 250

    def __post_init__(self):
        checks = [("steps", self.steps >= 1, ">= 1"), ("batch_size", self.batch_size >= 1, ">= 1"),
                  ("lr", self.lr > 0, "> 0"), ("warmup", self.warmup >= 0, ">= 0"),
                  ("high_noise_fraction", 0.0 <= self.high_noise_fraction <= 1.0, "in [0, 1]"),
                  ("high_noise_min", 0.0 <= self.high_noise_min < 1.0, "in [0, 1)"),
                  ("prompt_dropout", 0.0 <= self.prompt_dropout < 1.0, "in [0, 1)"),
                  ("ema", 0.0 <= self.ema < 1.0, "in [0, 1)"), ("checkpoint_every", self.checkpoint_every >= 1, ">= 1")]
        for name, ok, valid in checks:
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)} must be {valid}")


def lr_at(step: int, config: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to 5% of the peak."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - config.warmup)
    return config.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))


def encode(pipe, prompts: list[str], max_length: int) -> torch.Tensor:
    """Exactly WanPipeline._get_t5_prompt_embeds, with gradients: zeros past each prompt's length."""
    tokens = pipe.tokenizer(prompts, padding="max_length", max_length=max_length, truncation=True,
                            add_special_tokens=True, return_attention_mask=True, return_tensors="pt")
    device = pipe.transformer.device
    hidden = pipe.text_encoder(tokens.input_ids.to(device), tokens.attention_mask.to(device)).last_hidden_state
    return hidden * tokens.attention_mask[..., None].to(device=device, dtype=hidden.dtype)


def save_weights(model: pixel_model.PixelModel, pipe, out: Path, info: dict) -> None:
    """Write to a sibling temp dir, then swap it in: a crash never leaves half a model."""
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    pixel_model.save(model, pipe, tmp, extra={"training": info})
    old = out.with_name(out.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def train(model: pixel_model.PixelModel, world: ModuleType, config: TrainConfig, run_dir: Path, out: Path,
          resume: bool = False, init: Path | None = None, device: str = "cpu", progress: bool = True) -> dict:
    """Train `model` on videos of `world` (a module with `training_scenes()` and `render(scenes, generator)`).

    Writes `run_dir/checkpoint.pt` (resumable), `run_dir/loss.jsonl` (one row per logged step) and, at the
    end, the EMA weights to `out` with the run's settings in their manifest. Returns those settings.
    """
    run_dir = Path(run_dir)
    checkpoint = run_dir / "checkpoint.pt"
    settings_path = run_dir / "config.json"
    settings = {"model": model.name, **asdict(config), "init": str(init) if init else None}
    if checkpoint.exists() and not resume:
        raise FileExistsError(f"{run_dir} already holds a training run; pass --resume to continue it or use "
                              "another --run-dir")
    if resume and settings_path.exists():
        before = json.loads(settings_path.read_text())
        changed = {k: (before.get(k), v) for k, v in settings.items() if k != "checkpoint_every" and before.get(k) != v}
        if changed:
            raise ValueError(f"--resume: {run_dir} was started with other settings "
                             f"({', '.join(f'{k}: {a} -> {b}' for k, (a, b) in changed.items())}); rerun with them")
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(settings_path, json.dumps(settings, indent=1) + "\n")

    torch.manual_seed(config.seed)
    pipe = (pixel_model.load(model, directory=init) if init else pixel_model.build_untrained(model, config.seed))
    pipe.to(device)
    modules = torch.nn.ModuleDict({"transformer": pipe.transformer, "text_encoder": pipe.text_encoder}).train()
    ema = copy.deepcopy(modules).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(modules.parameters(), lr=config.lr, betas=(0.9, 0.99), weight_decay=0.01)
    data_gen = torch.Generator().manual_seed(config.seed + 1)
    rng = np.random.default_rng(config.seed + 2)
    start, elapsed = 0, 0.0
    if resume and checkpoint.exists():
        state = torch.load(checkpoint, weights_only=True, map_location=device)
        modules.load_state_dict(state["modules"])
        ema.load_state_dict(state["ema"])
        optimizer.load_state_dict(state["optimizer"])
        data_gen.set_state(state["data_gen"].cpu())
        rng.bit_generator.state = json.loads(state["rng"])
        torch.set_rng_state(state["torch_rng"].cpu())
        start, elapsed = int(state["step"]), float(state["elapsed"])
        print(f"resumed {model.title} training from step {start} of {config.steps}")

    t0 = time.perf_counter() - elapsed

    def save_checkpoint(step: int) -> None:
        state = {"modules": modules.state_dict(), "ema": ema.state_dict(), "optimizer": optimizer.state_dict(),
                 "data_gen": data_gen.get_state(), "rng": json.dumps(rng.bit_generator.state),
                 "torch_rng": torch.get_rng_state(), "step": step, "elapsed": time.perf_counter() - t0}
        with atomic_path(checkpoint) as tmp:
            torch.save(state, tmp)

    stop_requested: list[int] = []  # a signal asks; the loop stops between two steps, never inside one
    previous = {s: signal.signal(s, lambda signum, frame: stop_requested.append(signum))
                for s in (signal.SIGINT, signal.SIGTERM)}
    log_path = run_dir / "loss.jsonl"
    if log_path.exists():  # rows past the checkpoint are redone: keep the log in step with it
        rows = [line for line in log_path.read_text().splitlines()
                if line.strip().startswith("{") and line.strip().endswith("}") and json.loads(line)["step"] <= start]
        atomic_write_text(log_path, "".join(row + "\n" for row in rows))
    scenes = world.training_scenes()
    losses: list[float] = []
    step = start
    log = open(log_path, "a")
    bar = tqdm(range(start, config.steps), initial=start, total=config.steps, desc=f"train {model.title}",
               unit="step", disable=not progress)
    try:
        for step in bar:
            if stop_requested:
                save_checkpoint(step)
                print(f"\ninterrupted at step {step}: checkpoint saved, continue with --resume")
                raise KeyboardInterrupt
            batch = [scenes[i] for i in rng.integers(len(scenes), size=config.batch_size)]
            x0 = world.render(batch, data_gen).to(device)
            prompts = ["" if rng.random() < config.prompt_dropout else s.prompt for s in batch]
            u = torch.rand(config.batch_size, generator=data_gen)
            sigma = config.shift * u / (1 + (config.shift - 1) * u)
            if config.high_noise_fraction > 0:
                high = torch.rand(config.batch_size, generator=data_gen) < config.high_noise_fraction
                sigma = torch.where(high, config.high_noise_min + (1 - config.high_noise_min) * u, sigma)
            noise = torch.randn(x0.shape, generator=data_gen).to(device)
            sigma = sigma.to(device)
            s = sigma[:, None, None, None, None]
            x_t = (1 - s) * x0 + s * noise
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, config)
            pred = pipe.transformer(hidden_states=x_t, timestep=sigma * 1000,
                                    encoder_hidden_states=encode(pipe, prompts, model.max_sequence_length),
                                    return_dict=False)[0]
            loss = torch.nn.functional.mse_loss(pred, noise - x0)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(modules.parameters(), 1.0)
            optimizer.step()
            decay = min(config.ema, (1 + step) / (10 + step))
            with torch.no_grad():
                for p_ema, p in zip(ema.parameters(), modules.parameters()):
                    p_ema.lerp_(p, 1 - decay)
            losses.append(loss.item())
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}")
            if (step + 1) % 10 == 0:
                log.write(json.dumps({"step": step + 1, "loss": round(float(np.mean(losses[-10:])), 5),
                                      "minutes": round((time.perf_counter() - t0) / 60, 2)}) + "\n")
                log.flush()
            if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps:
                save_checkpoint(step + 1)
    finally:
        log.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    elapsed = time.perf_counter() - t0
    final = pixel_model.build_untrained(model, config.seed)
    final.transformer.load_state_dict(ema["transformer"].state_dict())
    final.text_encoder.load_state_dict(ema["text_encoder"].state_dict())
    info = {**settings, "device": device, "train_minutes": round(elapsed / 60, 1),
            "final_loss_mean_last_100": round(float(np.mean(losses[-100:])), 5) if losses else None}
    save_weights(model, final.to("cpu"), Path(out), info)
    atomic_write_text(run_dir / "train_info.json", json.dumps(info, indent=2) + "\n")
    return info
