"""What the scripts share: argparse types (a bad value is a usage error naming the value and what is valid),
and where the library's messages go."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

_LIBRARY_LOGGERS = ("morca_env", "agents")


class _StdoutHandler(logging.StreamHandler):
    """Writes to whatever `sys.stdout` is when a message is emitted (a redirect or a test's capture since)."""

    _morca_script = True

    def __init__(self):
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value):  # StreamHandler assigns one at construction; the current sys.stdout is used instead
        pass


def show_library_messages(level: int = logging.INFO) -> None:
    """Print the package's progress messages (`logging` under `morca_env` and `agents`) on stdout, message only.

    The library logs and never prints; a script decides where that goes. Idempotent.
    """
    for name in _LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(level)
        if not any(getattr(handler, "_morca_script", False) for handler in logger.handlers):
            logger.addHandler(_StdoutHandler())


def _integer_at_least(text: str, minimum: int, name: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{text!r} is not a {name} (valid: {minimum}, {minimum + 1}, ...)")
    return value


def positive_int(text: str) -> int:
    return _integer_at_least(text, 1, "positive integer")


def nonnegative_int(text: str) -> int:
    return _integer_at_least(text, 0, "non-negative integer")


MAX_WORKERS = 1024  # processes or Ray actors; beyond this an OS limit fails first, with a raw OverflowError


def worker_count(text: str) -> int:
    """A number of parallel workers: 1 .. MAX_WORKERS."""
    value = _integer_at_least(text, 1, "positive integer")
    if value > MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"{text!r} workers is more than any machine runs (valid: 1 .. {MAX_WORKERS})")
    return value


MAX_THREADS = 1024  # torch refuses counts beyond a C int with a raw "Overflow when unpacking long"


def thread_count(text: str) -> int:
    """A number of torch threads: 1 .. MAX_THREADS."""
    value = _integer_at_least(text, 1, "positive integer")
    if value > MAX_THREADS:
        raise argparse.ArgumentTypeError(f"{text!r} threads is more than any machine runs (valid: 1 .. {MAX_THREADS})")
    return value


def env_id(text: str) -> str:
    """A registered MORCA env id (gymnasium's own error suggests unrelated envs, e.g. 'Hopper')."""
    from .registration import ENV_IDS

    if text not in ENV_IDS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a MORCA env; valid: {', '.join(ENV_IDS)}")
    return text


def json_dict(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON ({error}); valid: a JSON object of env kwargs")
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object of env kwargs")
    return value


def _first_existing(path: Path) -> Path | None:
    return next((p for p in (path, *path.parents) if p.exists()), None)


def output_directory(text: str) -> Path:
    """A directory to write into, refused at once (not after the work) when a file stands there or above it."""
    path = Path(text)
    existing = _first_existing(path)
    if existing is not None and not existing.is_dir():
        where = "is a file" if existing == path else f"lies under the file {existing}"
        raise argparse.ArgumentTypeError(f"{text!r} {where}: give a directory")
    return path


def output_file(text: str) -> Path:
    """A file to write, refused at once when a directory stands there or a file above it."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory: give a file path in it, e.g. "
                                         f"{path / 'out.safetensors'}")
    output_directory(str(path.parent))
    return path


def torch_device(text: str) -> str:
    """A torch device this machine has: 'cpu', or 'cuda' / 'cuda:<index>' below its CUDA device count."""
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a torch device; valid: cpu, cuda, cuda:<index>")
    count = torch.cuda.device_count() if device.type == "cuda" else 0
    if device.type == "cuda" and count == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: this machine has no CUDA device; valid here: cpu")
    if device.type == "cuda" and device.index is not None and device.index >= count:
        raise argparse.ArgumentTypeError(f"{text!r}: this machine has {count} CUDA device(s); valid: cpu, cuda, "
                                         f"cuda:0 .. cuda:{count - 1}")
    return text


def speedup(text: str) -> float:
    """A target speedup: a number >= 1 (the env checks the upper end against its calibration)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value >= 1.0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a speedup (valid: a number >= 1, e.g. 2.5)")
    return value


def experiment_parser(description: str, env: str = "MorcaTiny-v0") -> argparse.ArgumentParser:
    """A parser holding what every headroom experiment takes (the env and its kwargs, the parallel workers,
    their torch threads, the output folder); the script adds its own arguments."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", type=env_id, default=env)
    p.add_argument("--env-kwargs", type=json_dict, default={}, help="extra gym.make keyword arguments, as JSON")
    p.add_argument("--workers", type=worker_count, default=1, help="parallel worker processes")
    p.add_argument("--threads", type=thread_count, default=None,
                   help="torch threads per worker (default: from the cores free now and the workers)")
    p.add_argument("--out", type=Path, required=True, help="output folder (a rerun resumes from it)")
    return p


def add_training_env_arguments(p: argparse.ArgumentParser, env: str = "MorcaTiny-v0") -> None:
    """--env, --env-kwargs, --prompts and --num-envs of a trainer that plays episodes (see `make_training_env`)."""
    from .parallel.workers import DEFAULT_NUM_ENVS

    p.add_argument("--env", type=env_id, default=env)
    p.add_argument("--num-envs", type=positive_int, default=None,
                   help="episodes played as one batch (a MorcaVectorEnv; 1: the single env); default "
                        f"{DEFAULT_NUM_ENVS} for MorcaTiny (measured fastest on a CPU), 1 for the Wan models")
    p.add_argument("--env-kwargs", type=json_dict, default={}, help="JSON dict of env kwargs")
    p.add_argument("--prompts", help="training prompt suite (default: the model's datasets' prompts, whose "
                                     "references are cached, e.g. tiny-train:250 for MorcaTiny-v0)")


def training_env_kwargs(args) -> dict:
    """The env kwargs a trainer's episodes run with: --env-kwargs, the training prompts, no LPIPS."""
    kwargs = {"lpips": False, **args.env_kwargs}
    from .models.presets import preset_for_env

    prompts = args.prompts or preset_for_env(args.env).prompts.trainers
    if prompts:
        kwargs["prompts"] = prompts
    return kwargs


def make_training_env(args):
    """The env a trainer plays its episodes in: a `MorcaVectorEnv` of --num-envs episodes (1: the single env)."""
    import gymnasium as gym

    from .registration import register_envs

    from .parallel.workers import default_num_envs

    register_envs()
    kwargs = training_env_kwargs(args)
    num_envs = args.num_envs or default_num_envs(args.env, kwargs)
    if num_envs == 1:
        return gym.make(args.env, **kwargs)
    return gym.make_vec(args.env, num_envs=num_envs, vectorization_mode="vector_entry_point", **kwargs)


def add_run_arguments(p: argparse.ArgumentParser, run_dir: str, resume: str = "continue the run in --run-dir",
                      device: bool = True) -> None:
    """What every training run takes: its folder, --resume, the device, torch threads and the seed."""
    p.add_argument("--run-dir", type=output_directory, default=Path(run_dir))
    p.add_argument("--resume", action="store_true", help=resume)
    if device:
        p.add_argument("--device", type=torch_device, default="cpu")
    p.add_argument("--threads", type=thread_count, default=None,
                   help="torch threads (default: chosen from the free cores, see morca_env.utils.threads)")
    p.add_argument("--seed", type=int, default=0)


def refuse_to_overwrite(run_dir: Path, marker: str, resume: bool) -> None:
    """Stop before a new run writes over the one in `run_dir` (its `marker` file exists) unless resuming it."""
    if (run_dir / marker).exists() and not resume:
        raise SystemExit(f"{run_dir} already holds a run; pass --resume to continue it or use another --run-dir")


# what a resumed run may change: how long it runs and where, not what it computes
RESUMABLE_CHANGES = frozenset({"resume", "threads", "device", "epochs", "rounds", "run_dir", "num_envs"})


def check_run_arguments(run_dir: Path, args: argparse.Namespace, may_change=RESUMABLE_CHANGES) -> None:
    """On `--resume`, refuse arguments that differ from the run's own `args.json` (a resumed run keeps its
    checkpoint's network and optimiser, so a new learning rate or feature set would be recorded without being
    applied). Extending a run (`--epochs`, `--rounds`) or moving it (`--threads`, `--device`) is fine."""
    path = Path(run_dir) / "args.json"
    if not (getattr(args, "resume", False) and path.exists()):
        return
    try:
        before = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise SystemExit(f"--resume: {path} is damaged ({error.msg}); use another --run-dir") from None
    now = {k: str(v) for k, v in vars(args).items()}
    changed = [f"--{k.replace('_', '-')} {before[k]} -> {now[k]}" for k in sorted(set(before) & set(now))
               if k not in may_change and before[k] != now[k]]
    if changed:
        raise SystemExit(f"--resume: {run_dir} was run with other arguments ({'; '.join(changed)}); a resumed run "
                         "keeps its checkpoint's network and optimiser, so rerun with the recorded values "
                         f"({path}) or start a new --run-dir")


def record_run_arguments(run_dir: Path, args: argparse.Namespace, may_change=RESUMABLE_CHANGES) -> None:
    """`check_run_arguments`, then write `<run_dir>/args.json` (atomically): call it once the run's inputs have
    loaded, so a call that fails on them leaves an earlier run's record alone."""
    from .utils.io import atomic_write_text

    check_run_arguments(run_dir, args, may_change)
    atomic_write_text(Path(run_dir) / "args.json",
                      json.dumps({k: str(v) for k, v in vars(args).items()}, indent=1) + "\n")
