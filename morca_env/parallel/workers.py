"""Worker processes for jobs that each need an env: one home for starting them, their env, and mapping jobs over
them, in this process, in local processes or on Ray actors (`morca_env.parallel.executors.RayExecutor`).

    for result in map_on_envs(play_one, jobs, "MorcaTiny-v0", {"lpips": False}, workers=2):
        ...   # play_one(env, job) ran in a worker that holds one env for all its jobs

`play_one` and the jobs must pickle (module-level functions, plain data). A local
worker ends with the process that started it, even on SIGKILL, so no orphan runs on.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable, Iterable, Iterator

from ..registration import register_envs

_ENV = None  # this worker process's env (`init_env_worker`)
# episodes a worker or trainer plays as one batch in a MorcaVectorEnv (`--num-envs`): on the 2-core CPU, 8 gave
# 1.39x the episodes/s of one env at 1 thread and 2.04x at 2 (16: 1.25x / 2.16x), benchmarks/bench_vector.py
DEFAULT_NUM_ENVS = 8


def exit_with_parent(parent_pid: int) -> None:
    """End this worker when the process that started it dies, even by SIGKILL (no orphans running on)."""
    import signal
    import threading

    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    else:
        def watch():
            while os.getppid() == parent_pid:
                time.sleep(1.0)
            os._exit(1)

        threading.Thread(target=watch, daemon=True).start()
    if os.getppid() != parent_pid:  # the parent died before the death signal was armed
        os._exit(1)


def start_method(threads: int) -> str:
    """`fork` where it is safe (Linux, one torch thread per worker, as DataLoader workers run):
    a worker then starts in ~1 s instead of ~7 s of imports, which matters for throughput;
    `spawn` otherwise."""
    return "fork" if sys.platform.startswith("linux") and threads == 1 else "spawn"


def needs_gpu(env_id: str, env_kwargs: dict) -> bool:
    """Whether a worker of this env wants a GPU of its own: the Wan models (not MorcaTiny), unless the
    kwargs pin `device` to the CPU."""
    import gymnasium as gym

    from ..models.presets import get_preset

    register_envs()
    spec = gym.spec(env_id)
    preset = get_preset(env_kwargs.get("model", spec.kwargs.get("model")))  # the kwargs override the registration, as in gym.make
    device = str(env_kwargs.get("device") or "")
    return bool(preset.prefers_gpu) and not device.startswith("cpu")


def default_num_envs(env_id: str, env_kwargs: dict) -> int:
    """Episodes per batch where the caller names none: `DEFAULT_NUM_ENVS` for the small CPU models, whose steps a
    batch shares in part (the project's vector benchmark); 1 for the Wan models on a GPU, where one video's calls
    already fill the device and a batch only multiplies the memory."""
    return 1 if needs_gpu(env_id, env_kwargs) else DEFAULT_NUM_ENVS


def make_worker_env(env_id: str, env_kwargs: dict, threads: int, num_envs: int = 1):
    """A fresh env for a worker, with its torch threads set (importing gymnasium's registry of our envs): a
    `MorcaVectorEnv` of `num_envs` episodes when > 1."""
    import gymnasium as gym
    import torch

    register_envs()
    torch.set_num_threads(threads)
    if num_envs == 1:
        return gym.make(env_id, **env_kwargs)
    return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **env_kwargs)


def init_env_worker(env_id: str, env_kwargs: dict, threads: int, parent_pid: int | None = None,
                    num_envs: int = 1) -> None:
    """Give this process its env (a pool's initializer; `parent_pid`: end with that process)."""
    global _ENV
    if parent_pid is not None:
        exit_with_parent(parent_pid)
    _ENV = make_worker_env(env_id, env_kwargs, threads, num_envs)


def worker_env():
    """This worker's env (set by `init_env_worker`)."""
    if _ENV is None:
        raise RuntimeError("no env in this process: run the job through map_on_envs (or call init_env_worker)")
    return _ENV


def _call(task):
    function, job = task
    return function(worker_env(), job)


class _OnActor:
    """A Ray actor's job runner: its own env, then `function(env, job)` per job."""

    def __init__(self, function: Callable, env_id: str, env_kwargs: dict, threads: int, num_envs: int = 1):
        self.function, self.env = function, make_worker_env(env_id, env_kwargs, threads, num_envs)

    def __call__(self, job):
        return self.function(self.env, job)


def map_on_envs(function: Callable[[Any, Any], Any], jobs: Iterable, env_id: str, env_kwargs: dict,
                workers: int = 1, threads: int = 1, executor=None, num_envs: int = 1) -> Iterator[Any]:
    """Yield `function(env, job)` for every job (in completion order when parallel), each worker holding one env
    (a `MorcaVectorEnv` of `num_envs` episodes when > 1).

    `workers == 1`: in this process; else local worker processes; `executor` (a `RayExecutor`): Ray actors,
    one GPU each for a Wan env. A failed job raises here after the results that came before it (Ray:
    `executors.WorkerFailed`), and a worker that dies (killed, out of memory) raises `WorkerDied` instead of
    hanging the pool, so a resumable caller keeps what it already wrote."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    jobs = list(jobs)
    if not jobs:
        return
    if executor is not None:
        gpus = 1 if needs_gpu(env_id, env_kwargs) else 0
        for _, result in executor.map_unordered(_OnActor, (function, env_id, env_kwargs, threads, num_envs), jobs,
                                                workers=workers, threads=threads, gpus=gpus):
            yield result
    elif workers == 1 or len(jobs) == 1:
        env = make_worker_env(env_id, env_kwargs, threads, num_envs)
        try:
            for job in jobs:
                yield function(env, job)
        finally:
            env.close()
    else:
        pool = ProcessPoolExecutor(min(workers, len(jobs)), mp_context=mp.get_context(start_method(threads)),
                                   initializer=init_env_worker,
                                   initargs=(env_id, env_kwargs, threads, os.getpid(), num_envs))
        try:
            futures = [pool.submit(_call, (function, job)) for job in jobs]
            for future in as_completed(futures):
                try:
                    yield future.result()
                except BrokenProcessPool:
                    raise WorkerDied(f"a worker process of {env_id} died (killed, or out of memory?) with "
                                     f"{sum(not f.done() for f in futures)} of {len(jobs)} jobs unfinished") from None
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


class WorkerDied(RuntimeError):
    """A local worker process ended without finishing its job."""
