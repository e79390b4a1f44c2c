"""Shared pieces of the training loops: replay buffers from episodes, IQL epochs, checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from d3rlpy.constants import ActionSpace
from d3rlpy.dataset import Episode, InfiniteBuffer, ReplayBuffer
from tqdm import tqdm

from morca_env.data import transition_picker
from morca_env.utils.io import atomic_write_text, writable_directory

from .checkpoint import save_learnable
from .sampling import TransitionSampler

from morca_env.observation import OBS_KEYS, as_tuple, channels_of_flat, split_flat


def episode_from_trajectory(trajectory) -> Episode:
    """A terminated d3rlpy episode from a recorded `morca_env.rollout.Trajectory` (o_0..o_{N-1};
    the terminal o_N is not needed)."""
    n = len(trajectory.actions)
    obs = as_tuple({k: trajectory.observations[k][:n] for k in OBS_KEYS})
    return Episode(observations=obs, actions=trajectory.actions.astype(np.int64).reshape(n, 1),
                   rewards=trajectory.rewards.astype(np.float32).reshape(n, 1), terminated=True)


def tuple_episode(episode: Episode) -> Episode:
    """`episode` with tuple observations: a flat one (to_replay_buffer's default) is split by the flat layout
    (`morca_env.observation.FLAT_KEYS`), so buffers of either form can be merged with the online episodes (tuple)."""
    if isinstance(episode.observations, (list, tuple)):
        return episode
    flat = np.asarray(episode.observations)
    parts = split_flat(flat, channels_of_flat(flat.shape[1]))
    return Episode(observations=[np.ascontiguousarray(parts[k]) for k in OBS_KEYS], actions=episode.actions,
                   rewards=episode.rewards, terminated=episode.terminated)


def make_buffer(episodes: list[Episode], n_step: int = 1) -> ReplayBuffer:
    return ReplayBuffer(InfiniteBuffer(), episodes=episodes, action_space=ActionSpace.DISCRETE, action_size=2,
                        transition_picker=transition_picker(n_step))


def observation_shapes(env) -> list[tuple[int, ...]]:
    space = env.observation_space
    return [tuple(space[k].shape) for k in OBS_KEYS]


def batch_source(buffer: ReplayBuffer, algo) -> TransitionSampler | ReplayBuffer:
    """What `run_updates` samples from: a `TransitionSampler` (the same batches, without d3rlpy's
    per-transition work) unless the algorithm reads returns-to-go, which only d3rlpy's batches carry.
    Build it once per buffer: it reads every transition."""
    return buffer if algo.need_returns_to_go else TransitionSampler(buffer)


def run_updates(algo, batches: TransitionSampler | ReplayBuffer, steps: int, writer=None, tag: str = "train",
                desc: str = "update", progress: bool = True) -> dict[str, float]:
    """`steps` IQL updates on batches sampled from `batches` (`batch_source`); returns the mean metrics."""
    sample = batches.sample if isinstance(batches, TransitionSampler) else batches.sample_transition_batch
    totals: dict[str, float] = {}
    for _ in tqdm(range(steps), desc=desc, unit="step", leave=False, disable=not progress):
        metrics = algo.update(sample(algo.config.batch_size))
        for k, v in metrics.items():
            totals[k] = totals.get(k, 0.0) + float(v)
        if writer is not None:
            for k, v in metrics.items():
                writer.add_scalar(f"{tag}/{k}", float(v), algo.grad_step)
    return {k: v / max(1, steps) for k, v in totals.items()}


def steps_per_epoch(buffer: ReplayBuffer, batch_size: int, cap: int | None = None) -> int:
    steps = max(1, buffer.transition_count // batch_size)
    return min(steps, cap) if cap else steps


class CheckpointDir:
    """`<dir>/checkpoints/NNNN.safetensors` written atomically with its checksum, and `latest.json` naming the
    last complete one; `training` (the run's arguments) goes into every checkpoint's header."""

    def __init__(self, directory: str | Path, training: dict | None = None):
        self.directory = Path(directory)
        self.training = training
        writable_directory(self.directory / "checkpoints", "run directory")

    def save(self, algo, index: int, state: dict | None = None) -> Path:
        path = self.directory / "checkpoints" / f"{index:04d}.safetensors"
        save_learnable(algo, path, self.training)
        atomic_write_text(self.directory / "latest.json", json.dumps({"index": index, "path": str(path.name),
                                                                      **(state or {})}) + "\n")
        return path

    def latest(self) -> tuple[Path, dict] | None:
        marker = self.directory / "latest.json"
        if not marker.exists():
            return None
        state = json.loads(marker.read_text())
        return self.directory / "checkpoints" / state["path"], state

    def save_final(self, algo) -> Path:
        """`<dir>/final.safetensors`: what a run leaves for `MorcaPolicy.load` and `morca evaluate`."""
        return save_learnable(algo, self.directory / FINAL, self.training)


FINAL = "final.safetensors"
