"""Offline discrete IQL on a replay buffer (MORCA Sec. 3.3, Table 6), as a resumable trainer beside `OnlineTrainer`.

    trainer = OfflineTrainer(buffer, OfflineConfig(epochs=20), "runs/offline")
    algo = trainer.run(resume=True)       # continues after the last finished epoch

Every epoch is checkpointed (`<run_dir>/checkpoints/NNNN.safetensors` with `latest.json`),
logged to TensorBoard (`<run_dir>/tb`), and the end writes `<run_dir>/final.safetensors`.
An epoch is one pass over the buffer's transitions in batches (or `max_steps_per_epoch` updates).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from .anchored import ANCHOR
from .checkpoint import load_learnable
from .iql import DiscreteIQL, DiscreteIQLConfig
from .networks import MorcaEncoderFactory
from .training import CheckpointDir, batch_source, run_updates, steps_per_epoch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OfflineConfig:
    """Offline IQL settings (defaults: paper Table 6)."""

    epochs: int = 200
    learning_rate: float = 1e-4  # of every network
    batch_size: int = 256
    beta: float = 1.5  # advantage-weighting coefficient
    max_weight: float = 30.0  # policy weight cap
    expectile: float = 0.7
    features: str = "p3,mean,var"  # latent features in the state ("" = the scalar state)
    max_steps_per_epoch: int | None = None  # cap on the updates per epoch (None: a full pass)
    shared_critic_encoder: bool = False  # twin Q and V on one encoder: about half the CPU cost (the paper: four nets)
    device: str = "cpu"

    def __post_init__(self):
        for name in ("epochs", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        if not 0.0 < self.expectile < 1.0:  # outside it the V regression's weights turn negative
            raise ValueError(f"expectile={self.expectile!r} must lie in (0, 1) (the paper's 0.7)")
        for name in ("learning_rate", "beta", "max_weight"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be > 0")

    def create(self) -> DiscreteIQL:
        encoder = MorcaEncoderFactory(features=self.features)
        return DiscreteIQLConfig(actor_learning_rate=self.learning_rate, critic_learning_rate=self.learning_rate,
                                 batch_size=self.batch_size, weight_temp=self.beta, max_weight=self.max_weight,
                                 expectile=self.expectile, actor_encoder_factory=encoder,
                                 critic_encoder_factory=encoder, value_encoder_factory=encoder,
                                 shared_critic_encoder=self.shared_critic_encoder).create(device=self.device)


class OfflineTrainer:
    """Trains `config.create()` on `buffer` for `config.epochs`, checkpointing every epoch under `run_dir`."""

    def __init__(self, buffer, config: OfflineConfig = OfflineConfig(), run_dir: str | Path = "runs/offline",
                 anchor: dict | None = None):
        self.buffer, self.config, self.run_dir = buffer, config, Path(run_dir)
        steps = {len(e.rewards) for e in buffer.episodes}  # the data's step count N, checked where a policy plays
        record = {"trainer": "offline", **asdict(config), "num_steps": steps.pop() if len(steps) == 1 else None}
        if anchor is not None:  # an anchored buffer (agents.anchored): its checkpoints say so, with their baseline
            record[ANCHOR] = anchor
        self.checkpoints = CheckpointDir(self.run_dir, record)
        self.algo = config.create()
        self.algo.build_with_dataset(buffer)
        self.start = 0

    def resume(self) -> int:
        """Load the last finished epoch's checkpoint, if any; -> the first epoch still to run."""
        found = self.checkpoints.latest()
        if found is not None:
            path, state = found
            self.algo = load_learnable(path, device=self.config.device)
            self.start = state["index"] + 1
            log.info("resumed from %s (epoch %d)", path, self.start)
        return self.start

    def run(self, resume: bool = False) -> DiscreteIQL:
        if resume:
            self.resume()
        config = self.config
        epoch_steps = steps_per_epoch(self.buffer, config.batch_size, config.max_steps_per_epoch)
        log.info("%d episodes, %d transitions; %d updates per epoch, epochs %d..%d", self.buffer.size(),
                 self.buffer.transition_count, epoch_steps, self.start + 1, config.epochs)
        writer = SummaryWriter(str(self.run_dir / "tb"))
        batches = batch_source(self.buffer, self.algo)
        try:
            for epoch in range(self.start, config.epochs):
                t0 = time.perf_counter()
                metrics = run_updates(self.algo, batches, epoch_steps, writer, "offline", f"epoch {epoch + 1}/{config.epochs}")
                seconds = time.perf_counter() - t0
                self.checkpoints.save(self.algo, epoch, {"metrics": metrics})
                log.info("epoch %d: %s | %.0f transitions/s, %.2f updates/s", epoch + 1,
                         ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()),
                         epoch_steps * config.batch_size / seconds, epoch_steps / seconds)
        finally:
            writer.close()
        final = self.checkpoints.save_final(self.algo)
        log.info("saved %s", final)
        return self.algo
