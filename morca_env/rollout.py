"""The one episode loop: every consumer (collection, training, evaluation, search, calibration) plays through it.

    trajectory = rollout(env, policy, options={"prompt": p, "seed": s, "budget": 39})
    trajectory.reward, trajectory.schedule, trajectory.info["psnr"]

`policy` follows the scheduler protocol (`reset(obs, info)`, `policy(obs) -> action`).
`record=True` keeps every observation o_0 .. o_N (stacked per key) for datasets
and replay buffers; without it only actions, rewards and the final info are kept,
which is what evaluation and search need.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .observation import parse_action


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


def rollout_batch(envs, policies: list, seed: int | list[int] | None = None, options=None,
                  record: bool = False) -> list[Trajectory]:
    """Play one episode per sub-env of a `MorcaVectorEnv` in lockstep, sub-env n driven by `policies[n]` (its own
    scheduler instance): the trajectories `rollout` gives for the single env's episodes of the same seeds, up to
    float32 rounding (`morca_env.vector`). `seed` and `options` are the vector env's. Run-time rules (those that
    read `info["run_view"]`) need the single env: here their view raises, naming why."""
    from .schedulers.rules.runtime import BatchRunView
    from .vector import sub_env_info

    if len(policies) != envs.num_envs:
        raise ValueError(f"{len(policies)} policies for {envs.num_envs} sub-envs; valid: one per sub-env")
    for policy in policies:
        if isinstance(policy, type) or not callable(getattr(policy, "reset", None)):
            raise TypeError(f"policy={policy!r}: pass scheduler instances with reset(obs, info) and __call__(obs)")
    obs, infos = envs.reset(seed=seed, options=options)
    count = envs.num_envs
    reset_infos = [sub_env_info(infos, n) for n in range(count)]
    setup = [0.0] * count
    for n, policy in enumerate(policies):
        t0 = time.perf_counter()
        policy.reset(_row(obs, n), {**reset_infos[n], "run_view": BatchRunView()})
        setup[n] = time.perf_counter() - t0
    kept = [{k: [v[n]] for k, v in obs.items()} for n in range(count)] if record else None
    actions, rewards, requested = [], [], []
    policy_time = [0.0] * count
    done = False
    while not done:
        chosen = []
        for n, policy in enumerate(policies):
            t0 = time.perf_counter()
            chosen.append(parse_action(policy(_row(obs, n))))  # the int64 batch would truncate 0.9 to 0
            policy_time[n] += time.perf_counter() - t0
        obs, reward, terminated, truncated, infos = envs.step(np.asarray(chosen, dtype=np.int64))
        if truncated.any():
            raise RuntimeError("MorcaVectorEnv episodes never truncate; a wrapper truncated these")
        done = bool(terminated.all())
        if terminated.any() and not done:
            raise RuntimeError("the sub-envs of a MorcaVectorEnv end together; these ended apart")
        requested.append(infos["requested_action"].copy())
        actions.append(infos["action"].copy())
        rewards.append(np.asarray(reward, dtype=np.float32))
        if kept is not None:
            for n in range(count):
                for k, v in obs.items():
                    kept[n][k].append(v[n])
    actions, rewards, requested = np.stack(actions), np.stack(rewards), np.stack(requested)
    return [Trajectory(actions=actions[:, n].astype(np.int64), rewards=rewards[:, n], info=sub_env_info(infos, n),
                       reset_info=reset_infos[n],
                       observations={k: np.stack(v) for k, v in kept[n].items()} if kept is not None else None,
                       policy_seconds=policy_time[n], setup_seconds=setup[n],
                       requested=[int(a) for a in requested[:, n]]) for n in range(count)]


def _row(obs: dict, n: int) -> dict:
    """Sub-env n's observation of a batched one (views, no copies)."""
    return {k: v[n] for k, v in obs.items()}


def episodes_per_batch(env) -> int:
    """How many episodes `env` plays at once: a `MorcaVectorEnv`'s (or a vector wrapper's) `num_envs`, else 1."""
    return int(env.num_envs) if hasattr(env, "num_envs") and hasattr(env, "action_masks") else 1


def rollout_many(env, policies: list, options: list, seeds: list | None = None, record: bool = False,
                 progress: str | None = None) -> list[Trajectory]:
    """Episode i with `policies[i]`, `options[i]` (and `seeds[i]`), for every i: one at a time through `rollout`
    in a single env, or `num_envs` at a time through `rollout_batch` in a `MorcaVectorEnv` (a short last batch is
    padded with copies of its last episode, played and dropped). `progress`: a tqdm bar's label, or None."""
    from tqdm.auto import tqdm

    seeds = list(seeds) if seeds is not None else [None] * len(policies)
    if not len(policies) == len(options) == len(seeds):
        raise ValueError(f"{len(policies)} policies, {len(options)} options and {len(seeds)} seeds: one each per episode")
    size = episodes_per_batch(env)
    trajectories: list[Trajectory] = []
    with tqdm(total=len(policies), desc=progress, unit="episode", leave=False, disable=progress is None) as bar:
        for start in range(0, len(policies), size):
            chunk = range(start, min(start + size, len(policies)))
            if size == 1:
                trajectories.append(rollout(env, policies[start], options[start], seeds[start], record))
            else:
                padded = list(chunk) + [chunk[-1]] * (size - len(chunk))
                # a padding episode gets its own copy of the policy: a shared one would draw from its random state
                # between the real episode's steps
                members = [policies[i] if k < len(chunk) else copy.deepcopy(policies[i]) for k, i in enumerate(padded)]
                played = rollout_batch(env, members, [seeds[i] for i in padded]
                                       if any(s is not None for s in seeds) else None,
                                       [options[i] for i in padded], record)
                trajectories += played[:len(chunk)]
            bar.update(len(chunk))
    return trajectories
