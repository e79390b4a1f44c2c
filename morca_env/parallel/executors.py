"""Ray scale-out: work items run on Ray actors, one per worker, each holding its own env.

The collection, evaluation and search loops stay where they are; this module only
moves the work. `RayExecutor.map_unordered(factory, args, items, ...)` starts
`workers` actors, builds one `factory(*args)` in each (an env-holding callable:
`morca_env.parallel.workers.map_on_envs` for collection and search), feeds them the items one at a time
(the next item goes to whichever actor finishes first) and yields `(item, result)`
to the driver as results come back. The driver writes every result (staging file,
JSON) itself, so a worker needs no shared disk with it.

A worker that dies (killed, node lost, OOM) or raises stops the feeding: the results
still in flight on the other actors are yielded, then `WorkerFailed` says what
happened; nothing already returned is lost and the caller's resume continues.

Ray is optional (`pip install -e ".[ray]"`) and imported only when a `RayExecutor`
starts. Without an address, a local Ray runtime is started in this process (nothing
to start by hand) and shut down after the run; with `address` (or `RAY_ADDRESS`) the
driver joins that cluster, where every node needs this package installed. An
already initialised Ray (e.g. `ray.init` in a notebook or test) is used as it is.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

from ..utils.extras import require

log = logging.getLogger(__name__)

class WorkerFailed(RuntimeError):
    """One or more Ray workers died or raised; the results they returned before were yielded."""


def import_ray():
    return require("ray", "--ray / RayExecutor")


def check_count(name: str, value, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}={value!r} must be an integer >= {low}")
    return value


class MorcaWorker:
    """The body of one Ray actor: one torch thread count, one object built by `factory`, called per item."""

    def __init__(self, factory: Callable, args: tuple, threads: int):
        import torch

        torch.set_num_threads(threads)  # Ray sets OMP_NUM_THREADS for workers; torch's own pool is set here
        self.target = factory(*args)

    def pid(self) -> int:
        return os.getpid()

    def call(self, item):
        return self.target(item)


class RayExecutor:
    """Run work items on Ray actors (see the module docstring).

    address: a Ray cluster address (`ray://head:10001`, `head:6379`, `auto`); None: `RAY_ADDRESS`
    if set, else a local runtime started here with `num_cpus` (default: enough for the workers).
    """

    def __init__(self, address: str | None = None, num_cpus: int | None = None):
        if address is not None and (not isinstance(address, str) or not address.strip()):
            raise ValueError(f"ray address={address!r} must be a non-empty string such as 'auto', "
                             "'head-node:6379' or 'ray://head-node:10001'")
        if num_cpus is not None:
            check_count("num_cpus", num_cpus)
        self.address = address or os.environ.get("RAY_ADDRESS") or None
        self.num_cpus = num_cpus
        self.ray = import_ray()

    def __repr__(self) -> str:
        return f"RayExecutor(address={self.address!r})"

    @contextmanager
    def runtime(self, cpus_needed: int):
        """Ray initialised for this run (joined, started locally, or already up); shut down if started here."""
        ray = self.ray
        if ray.is_initialized():
            yield
            return
        if self.address:
            ray.init(address=self.address, configure_logging=False, log_to_driver=True)
        else:
            from ..utils.threads import available_cores

            cpus = self.num_cpus or max(available_cores(), cpus_needed)
            ray.init(address="local", num_cpus=cpus, include_dashboard=False, configure_logging=False,
                     log_to_driver=True)
        try:
            yield
        finally:
            ray.shutdown()

    def _check_resources(self, workers: int, cpus: float, gpus: float) -> None:
        total = self.ray.cluster_resources()
        where = f"the Ray cluster at {self.address}" if self.address else "this Ray runtime"
        for name, per_actor in (("CPU", cpus), ("GPU", gpus)):
            if per_actor <= 0:
                continue
            have = float(total.get(name, 0.0))
            fit = int(have // per_actor)
            if fit < workers:
                raise ValueError(f"workers={workers} need {workers * per_actor:g} {name}(s) ({per_actor:g} per worker); "
                                 f"{where} has {have:g}: valid: workers in [1, {max(fit, 1)}]"
                                 + ("" if fit else f" once it has a {name}"))

    def map_unordered(self, factory: Callable, args: tuple, items: Iterable, *, workers: int, threads: int = 1,
                      gpus: float = 0) -> Iterator[tuple[Any, Any]]:
        """Yield `(item, factory(*args)(item))` for every item, computed on `workers` Ray actors.

        Each actor reserves `threads` CPUs and `gpus` GPUs (Ray then sets its CUDA_VISIBLE_DEVICES);
        `factory`, `args`, items and results must pickle (module-level classes and functions do).
        Raises `WorkerFailed` after yielding the in-flight results of the healthy actors when one fails.
        """
        check_count("workers", workers)
        check_count("threads", threads)
        items = list(items)
        if not items:
            return
        workers = min(workers, len(items))
        ray = self.ray
        with self.runtime(workers * threads):
            self._check_resources(workers, threads, gpus)
            actor_class = ray.remote(num_cpus=threads, num_gpus=gpus, max_restarts=0)(MorcaWorker)
            actors = [actor_class.remote(factory, args, threads) for _ in range(workers)]
            queue = list(reversed(items))
            running: dict[Any, tuple[Any, Any]] = {}  # object ref -> (actor, item)
            errors: list[str] = []

            def feed(actor) -> None:
                if queue and not errors:
                    item = queue.pop()
                    running[actor.call.remote(item)] = (actor, item)

            try:
                for actor in actors:
                    feed(actor)
                while running:
                    ready, _ = ray.wait(list(running), num_returns=1)
                    actor, item = running.pop(ready[0])
                    try:
                        result = ray.get(ready[0])
                    except ray.exceptions.RayError as error:  # died (RayActorError) or raised (RayTaskError)
                        errors.append(f"item {item!r}: {_last_line(error)}")
                        ray.kill(actor)
                        continue
                    yield item, result
                    feed(actor)
            finally:
                for actor in actors:
                    ray.kill(actor)
            if errors:
                raise WorkerFailed(f"{len(errors)} Ray worker(s) failed: {'; '.join(errors)}")


def _last_line(error: BaseException) -> str:
    """The exception line of a Ray error (its text holds the remote traceback, which can be long)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    cause = getattr(error, "cause", None)
    if cause is not None and not isinstance(cause, type(error)):
        return f"{type(cause).__name__}: {cause}".splitlines()[0]
    return f"{type(error).__name__}: {lines[-1] if lines else ''}"


def make_executor(ray: bool = False, address: str | None = None) -> RayExecutor | None:
    """The executor the scripts' `--ray` / `--ray-address` ask for (None: local multiprocessing)."""
    if address is not None and not ray:
        raise ValueError(f"--ray-address {address!r} given without --ray; add --ray to run on that Ray cluster "
                         "(without --ray, collection runs on local processes)")
    return RayExecutor(address) if ray else None


def add_ray_arguments(parser) -> None:
    """`--ray` and `--ray-address` for a script's argparse parser."""
    parser.add_argument("--ray", action="store_true",
                        help="run the workers as Ray actors (one env each): a local Ray runtime is started here, or "
                             "the cluster at --ray-address / $RAY_ADDRESS is joined (pip install -e '.[ray]')")
    parser.add_argument("--ray-address", default=None, metavar="ADDR",
                        help="Ray cluster to join with --ray (e.g. auto, head-node:6379, ray://head-node:10001); "
                             "default: $RAY_ADDRESS, else a local runtime")


def executor_from_args(parser, args) -> RayExecutor | None:
    """The executor of parsed `--ray` / `--ray-address`, or a parser error naming what is wrong."""
    try:
        return make_executor(args.ray, args.ray_address)
    except (ValueError, ImportError) as error:
        parser.error(str(error))
