"""The one episode loop: every consumer (collection, training, evaluation, search, calibration) plays through it.

    trajectory = rollout(env, policy, options={"prompt": p, "seed": s, "budget": 39})
    trajectory.reward, trajectory.schedule, trajectory.info["psnr"]

`policy` follows the scheduler protocol (`reset(obs, info)`, `policy(obs) -> action`).
`record=True` keeps every observation o_0 .. o_N (stacked per key) for datasets
and replay buffers; without it only actions, rewards and the final info are kept,
which is what evaluation and search need.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Trajectory:
    """One finished episode: executed actions, rewards, the final info and (when recorded) observations."""

    actions: np.ndarray  # (N,) int64, executed (after any projection)
    rewards: np.ndarray  # (N,) float32: 0 ... 0, then the terminal reward
    info: dict[str, Any]  # the env's final info (psnr, schedule, latency_s, ...)
    reset_info: dict[str, Any]
    observations: dict[str, np.ndarray] | None = None  # key -> (N + 1, ...) when recorded
    policy_seconds: float = 0.0  # time inside policy(obs) calls, summed over the episode
    setup_seconds: float = 0.0  # time inside policy.reset(...)
    requested: list[int] = field(default_factory=list)  # the policy's own actions, before projection

    @property
    def reward(self) -> float:
        return float(self.rewards.sum())

    @property
    def schedule(self) -> list[int]:
        return [int(a) for a in self.actions]

    @property
    def num_reuse(self) -> int:
        return int(self.actions.sum())


def rollout(env, policy, options: dict | None = None, seed: int | None = None, record: bool = False) -> Trajectory:
    """Play one episode of `env` with `policy`; see the module docstring."""
    if isinstance(policy, type) or not callable(getattr(policy, "reset", None)):
        raise TypeError(f"policy={policy!r}: pass a scheduler instance with reset(obs, info) and __call__(obs), e.g. "
                        f"{policy.__name__ + '()' if isinstance(policy, type) else 'morca_env.make_scheduler(name)'}")
    obs, reset_info = env.reset(seed=seed, options=options)
    view = getattr(env.unwrapped, "run_view", None)  # the run played, for run-time rules (the env's info stays plain)
    t0 = time.perf_counter()
    policy.reset(obs, reset_info if view is None else {**reset_info, "run_view": view})
    setup = time.perf_counter() - t0
    kept = {k: [v] for k, v in obs.items()} if record else None
    actions, rewards, requested = [], [], []
    policy_time = 0.0
    done = truncated = False
    info: dict[str, Any] = {}
    while not (done or truncated):
        t0 = time.perf_counter()
        action = policy(obs)
        policy_time += time.perf_counter() - t0
        obs, reward, done, truncated, info = env.step(action)
        if truncated:
            raise RuntimeError("MorcaEnv episodes never truncate; a wrapper truncated this one")
        requested.append(int(info.get("requested_action", action)))
        actions.append(int(info["action"]))
        rewards.append(float(reward))
        if kept is not None:
            for k, v in obs.items():
                kept[k].append(v)
    observations = {k: np.stack(v) for k, v in kept.items()} if kept is not None else None
    return Trajectory(actions=np.asarray(actions, dtype=np.int64), rewards=np.asarray(rewards, dtype=np.float32),
                      info=info, reset_info=reset_info, observations=observations, policy_seconds=policy_time,
                      setup_seconds=setup, requested=requested)
