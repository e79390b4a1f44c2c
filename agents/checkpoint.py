"""Checkpoints that cannot run code: safetensors weights and a JSON header, with a sha256 sidecar.

Why: d3rlpy's `.d3` is a pickle, and `torch.load(weights_only=False)` unpickles: loading either runs whatever
code the file's author put in it, and a checksum proves a file intact, not safe (whoever shares a checkpoint
shares its sidecar). Every checkpoint this project writes is one `.safetensors` file: the tensors by name, and
in its header (strings only, parsed as JSON) the format version, the scheduler that reads it, the algorithm's
config, the observation layout it was trained on, its training arguments and a digest of its tensors. Every
load first checks the sidecar `<file>.sha256` and refuses a mismatch naming the file.

Legacy pickles load only with `trusted=True` (or once through `morca convert-checkpoint`), and the refusal
says why; a legacy REINFORCE `.pt` loads with torch's `weights_only=True`, which unpickles no code.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from morca_env.utils.io import atomic_path, atomic_write_text
from morca_env.observation import LAYOUT

SUFFIX = ".sha256"
FORMAT = "morca-checkpoint"
FORMAT_VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint that is missing its checksum, does not match it, or cannot be read."""


class UntrustedCheckpointError(CheckpointError):
    """A pickle-based checkpoint loaded without `trusted=True`: unpickling it could run code."""


def checksum_path(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.name + SUFFIX)


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_checksum(path: str | Path, source: str | Path | None = None) -> Path:
    """Record the sha256 of `source` (default: `path` itself) as `path`'s checksum.

    Also the way to vouch for a checkpoint written before checksums existed.
    """
    path = Path(path)
    side = checksum_path(path)
    atomic_write_text(side, f"{file_sha256(source or path)}  {path.name}\n")
    return side


def verify(path: str | Path) -> Path:
    """Raise `CheckpointError` (naming the file) unless `path` matches its recorded sha256."""
    if path is None or not isinstance(path, (str, Path)):
        raise TypeError(f"checkpoint path={path!r}: give the path of a checkpoint file (.safetensors)")
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"checkpoint {path} is a directory, not a checkpoint file: give a file in it, e.g. "
                                f"{path / 'final.safetensors'}")
    if path.exists() and not path.is_file():
        raise CheckpointError(f"checkpoint {path} is not a regular file (a FIFO, socket or device): give a "
                              "checkpoint file (.safetensors)")
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    side = checksum_path(path)
    if not side.is_file():
        raise CheckpointError(f"checkpoint {path} has no checksum file {side.name}, so its integrity cannot be "
                              "checked; if you trust it, record one with "
                              f"agents.checkpoint.write_checksum({str(path)!r})")
    # one digest per line; two only while a save replaces the file (`_replacing_with_checksum`)
    recorded = [line.split()[0] for line in side.read_text().splitlines() if line.split()]
    expected = recorded[0] if recorded else ""
    actual = file_sha256(path)
    if actual not in recorded:
        raise CheckpointError(f"checkpoint {path} is damaged: its sha256 {actual[:12]}... does not match "
                              f"{expected[:12] or '(empty)'}... in {side.name} (changed bytes, truncation or an "
                              "interrupted save); restore it or train again")
    return path


# ----------------------------------------------------------------- the safe format
def is_safe_format(path: str | Path) -> bool:
    """True when `path` starts as a safetensors file does (an 8-byte header length, then a JSON object)."""
    with open(path, "rb") as f:
        head = f.read(9)
    return len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < Path(path).stat().st_size


def _encode(value, key: str, tensors: dict, seen: dict | None = None):
    """A nested state (dicts, lists, tuples, tensors, arrays, numbers, strings) as JSON with tagged tensors.

    A tensor equal to one already stored (dtype, shape and bytes) is stored once and referenced by that one's name:
    an encoder shared by IQL's critics and value appears in each network's state dict, and would be stored each
    time (loading copies values into each network, so sharing the read tensor is safe)."""
    seen = {} if seen is None else seen
    if isinstance(value, (torch.Tensor, np.ndarray)):
        tensor = (value.detach().cpu().contiguous().clone() if isinstance(value, torch.Tensor)  # clone: safetensors
                  else torch.from_numpy(np.ascontiguousarray(value).copy()))  # refuses shared storage
        fingerprint = (str(tensor.dtype), tuple(tensor.shape),
                       hashlib.sha256(tensor.reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest())
        name = seen.setdefault(fingerprint, key)
        if name == key:
            tensors[key] = tensor
        return {"tensor" if isinstance(value, torch.Tensor) else "ndarray": name}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {"dict": {k: _encode(v, f"{key}/{k}", tensors, seen) for k, v in value.items()}}
        return {"items": [[_encode(k, f"{key}/key{i}", tensors, seen), _encode(v, f"{key}/{k}", tensors, seen)]
                          for i, (k, v) in enumerate(value.items())]}
    if isinstance(value, tuple):
        return {"tuple": [_encode(v, f"{key}/{i}", tensors, seen) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, f"{key}/{i}", tensors, seen) for i, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise CheckpointError(f"state entry {key!r} is a {type(value).__name__}, which a safe checkpoint cannot hold "
                          "(tensors, arrays, numbers, strings, lists, tuples and dicts only)")


def _decode(value, tensors: dict, handed: set | None = None):
    """The state `_encode` wrote; a tensor stored once for several entries is a separate copy in each, so that an
    in-place update of one (an optimizer's step counter) never changes another."""
    handed = set() if handed is None else handed
    if isinstance(value, list):
        return [_decode(v, tensors, handed) for v in value]
    if not isinstance(value, dict):
        return value
    (tag, inner), = value.items()
    if tag in ("tensor", "ndarray"):
        tensor = tensors[inner].clone() if inner in handed else tensors[inner]
        handed.add(inner)
        return tensor if tag == "tensor" else tensor.numpy()
    if tag == "dict":
        return {k: _decode(v, tensors, handed) for k, v in inner.items()}
    if tag == "items":
        return {_decode(k, tensors, handed): _decode(v, tensors, handed) for k, v in inner}
    if tag == "tuple":
        return tuple(_decode(v, tensors, handed) for v in inner)
    raise ValueError(f"unknown entry tag {tag!r}")


def tensors_sha256(tensors: dict) -> str:
    """A digest of named tensors (names, dtypes, shapes, bytes): recorded in the header, checked on load."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class SafeCheckpoint:
    """What a safe checkpoint holds: its state (tensors in place) and its header's records."""

    state: Any
    scheduler: str
    config: Any
    training: Any


def save_state(state, path: str | Path, scheduler: str, config=None, training=None) -> Path:
    """Write `state` (nested dicts/lists of tensors and plain values) as a safe checkpoint, atomically, with its
    checksum; `scheduler` names the registered scheduler that reads it, `config` and `training` are JSON."""
    path = Path(path)
    tensors: dict = {}
    structure = _encode(state, "state", tensors)
    header = {"format": FORMAT, "format_version": str(FORMAT_VERSION), "scheduler": scheduler,
              "observation_layout": LAYOUT, "state": json.dumps(structure), "config": json.dumps(config),
              "training": json.dumps(training, default=str), "tensors_sha256": tensors_sha256(tensors)}
    with _replacing_with_checksum(path) as tmp:
        save_file(tensors, str(tmp), metadata=header)
    return path


@contextlib.contextmanager
def _replacing_with_checksum(path: Path):
    """Write a checkpoint and its sidecar so that a kill at any moment leaves a pair that verifies.

    Two renames cannot be one atomic step, so the sidecar first records the new digest *and* the old file's, then
    the file is replaced, then the sidecar keeps the new digest alone: at every point, the file on disk matches a
    digest its sidecar records (overwriting in place used to leave the old file beside the new sidecar)."""
    side = checksum_path(path)
    with atomic_path(path) as tmp:
        yield tmp
        new = file_sha256(tmp)
        old = [file_sha256(path)] if path.is_file() else []
        atomic_write_text(side, "".join(f"{digest}  {path.name}\n" for digest in [new, *old]))
    atomic_write_text(side, f"{new}  {path.name}\n")


def read_header(path: str | Path) -> dict:
    """The string header of a safe checkpoint (no tensors read); an error naming the file if it is not one."""
    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
    except Exception as error:
        raise CheckpointError(f"checkpoint {path} is not a readable safetensors file: {error}") from error
    if header.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} is a safetensors file but not a MORCA checkpoint (its header has "
                              f"format={header.get('format')!r}, expected {FORMAT!r})")
    if header.get("format_version") != str(FORMAT_VERSION):
        raise CheckpointError(f"checkpoint {path} has format version {header.get('format_version')!r}; this "
                              f"version of morca-gym reads version {FORMAT_VERSION}")
    return header


def load_state(path: str | Path) -> SafeCheckpoint:
    """Read a safe checkpoint after verifying its checksum, its tensors' digest and its observation layout."""
    return _read_verified(verify(path))


def _read_verified(path: Path) -> SafeCheckpoint:
    """`load_state` of a file whose checksum was just verified (hashing it once is enough)."""
    if not is_safe_format(path):
        raise untrusted_error(path)
    header = read_header(path)
    if header.get("observation_layout") != LAYOUT:
        raise CheckpointError(f"checkpoint {path} was trained on the observation layout "
                              f"{header.get('observation_layout')!r}, and this version observes {LAYOUT!r}: its "
                              "network would read values in the wrong places; train it again on this version")
    tensors = load_file(str(path), device="cpu")
    if tensors_sha256(tensors) != header.get("tensors_sha256"):
        raise CheckpointError(f"checkpoint {path}: its tensors do not match the digest in its own header "
                              "(the file was changed after it was written)")
    try:
        return SafeCheckpoint(_decode(json.loads(header["state"]), tensors), header["scheduler"],
                              json.loads(header["config"]), json.loads(header["training"]))
    except (KeyError, ValueError, TypeError, RecursionError) as error:  # a crafted header nests JSON past the stack
        raise CheckpointError(f"checkpoint {path} has a malformed header: {type(error).__name__}: "
                              f"{str(error)[:200]}") from error


def untrusted_error(path) -> CheckpointError:
    """Why a file that is not a safe checkpoint cannot be read: a damaged or foreign file is named as such (calling
    it a pickle would send its owner to `trusted=True` for a file that no loader can read)."""
    with open(path, "rb") as f:
        head = f.read(9)
    size = Path(path).stat().st_size
    if size == 0:
        return CheckpointError(f"checkpoint {path} is empty (0 bytes): an interrupted copy or save; restore it or "
                               "train again")
    if len(head) == 9 and head[8:9] == b"{":
        claimed = int.from_bytes(head[:8], "little")
        return CheckpointError(f"checkpoint {path} is a damaged safetensors file: its header claims {claimed} bytes "
                               f"and the file has {size} (truncated or overwritten); restore it or train again")
    if not (head[:1] == b"\x80" or head[:2] == b"PK"):  # pickle protocol 2+, or torch.save's zip
        return CheckpointError(f"checkpoint {path} is neither a safetensors checkpoint nor a pickle (it starts with "
                               f"{head[:8]!r}); give a .safetensors file written by morca")
    return UntrustedCheckpointError(
        f"checkpoint {path} is a pickle (d3rlpy .d3 or torch .pt), and unpickling runs any code its author put in "
        "it; a checksum proves it intact, not safe. If you trust its source, convert it once to the safe format "
        f"(`morca convert-checkpoint {path}`) or load it with trusted=True")


# ----------------------------------------------------------------- d3rlpy algorithms
def _modules(algo) -> dict:
    impl = algo.impl
    if impl is None:
        raise ValueError(f"{type(algo).__name__} has no networks yet: fit it (or build it with a dataset) first")
    return impl.modules.create_checkpointer(str(impl.device)).modules


def save_learnable(algo, path: str | Path, training=None, optimizers: bool = True) -> Path:
    """A fitted d3rlpy algorithm (networks, and optimizers unless `optimizers=False`: a scheduler to ship, which
    plays but cannot resume training, at under half the size) as a safe checkpoint read by the scheduler "morca"."""
    from d3rlpy.base import LearnableConfigWithShape

    state = {name: module.state_dict() for name, module in _modules(algo).items()
             if optimizers or not _is_optimizer(name)}
    config = LearnableConfigWithShape(observation_shape=algo.impl.observation_shape,
                                      action_size=algo.impl.action_size, config=algo.config)
    return save_state(state, path, "morca", json.loads(config.serialize()), training)


def load_learnable(path: str | Path, device: Any = None, trusted: bool = False):
    """A d3rlpy algorithm from a safe checkpoint; a legacy `.d3` pickle only with `trusted=True`.

    Import `agents` first: it registers our algorithm and encoder with d3rlpy."""
    import d3rlpy
    from d3rlpy.base import LearnableConfigWithShape

    verify(path)
    if not is_safe_format(path):
        if not trusted:
            raise untrusted_error(path)
        try:
            return d3rlpy.load_learnable(str(path), device=device)
        except Exception as error:
            raise CheckpointError(f"checkpoint {path} could not be loaded: {type(error).__name__}: {error}") from error
    checkpoint = _read_verified(Path(path))
    if checkpoint.scheduler != "morca":
        raise CheckpointError(f"checkpoint {path} holds a {checkpoint.scheduler!r} scheduler, not a d3rlpy "
                              f"algorithm: load it with morca_env.schedulers.make({checkpoint.scheduler!r}, path=...)")
    try:
        algo = LearnableConfigWithShape.deserialize(json.dumps(checkpoint.config)).create(device)
        for name, module in _modules(algo).items():
            if name in checkpoint.state or not _is_optimizer(name):  # a shipped scheduler holds no optimizer state
                if not _is_optimizer(name):
                    check_weights(module, checkpoint.state[name], path, name)
                module.load_state_dict(checkpoint.state[name])
    except CheckpointError:
        raise
    except Exception as error:
        raise CheckpointError(f"checkpoint {path} could not be rebuilt: {type(error).__name__}: {error}") from error
    return algo


def check_weights(module: torch.nn.Module, state: dict, path, name: str = "network") -> None:
    """Refuse, by name, weights that `load_state_dict` would take silently and then play wrongly: another dtype
    than the module's (it casts) and NaN or Inf values (the logits turn NaN and the scheduler always recomputes)."""
    own = module.state_dict()
    for key, value in (state.items() if isinstance(state, dict) else ()):
        if key not in own or not isinstance(value, torch.Tensor):
            continue  # missing or unexpected keys: load_state_dict names them
        if value.dtype != own[key].dtype:
            raise CheckpointError(f"checkpoint {path}: {name}.{key} is {value.dtype}, and this network holds "
                                  f"{own[key].dtype}; a cast would change what it plays: save it again in "
                                  f"{own[key].dtype}")
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            bad = int((~torch.isfinite(value)).sum())
            raise CheckpointError(f"checkpoint {path}: {name}.{key} holds {bad} NaN or Inf value(s) of "
                                  f"{value.numel()}; the run that wrote it diverged: use an earlier checkpoint")


def _is_optimizer(name: str) -> bool:
    return name.endswith("optim")


# ----------------------------------------------------------------- torch state dicts (REINFORCE)
def load_torch_state(path: str | Path, trusted: bool = False):
    """The state of a torch checkpoint: a safe checkpoint, or a legacy `.pt` (weights only unless `trusted`)."""
    verify(path)
    if is_safe_format(path):
        return _read_verified(Path(path)).state
    try:
        return torch.load(path, weights_only=not trusted)
    except Exception as error:
        hint = "" if trusted else " (read with weights_only=True; if you trust its source, pass trusted=True)"
        raise CheckpointError(f"checkpoint {path} could not be loaded{hint}: {type(error).__name__}: {error}") from error


def convert(path: str | Path, out: str | Path | None = None) -> Path:
    """A trusted legacy checkpoint (`.d3` or REINFORCE `.pt`) rewritten in the safe format (default: beside it,
    as `<name>.safetensors`). Unpickles `path`: run it only on files whose source you trust."""
    path = Path(path)
    out = Path(out) if out is not None else path.with_suffix(".safetensors")
    verify(path)
    if is_safe_format(path):
        raise CheckpointError(f"checkpoint {path} is already in the safe format")
    if out.resolve() == path.resolve():
        raise CheckpointError(f"--out {out} is the checkpoint itself: give another path")
    with open(path, "rb") as f:
        is_zip = f.read(2) == b"PK"  # torch.save writes a zip; d3rlpy's save a bare pickle
    if not is_zip:  # (this package's import registered our algorithm and encoder with d3rlpy)
        return save_learnable(load_learnable(path, trusted=True), out, training={"converted_from": path.name})
    state = load_torch_state(path, trusted=True)
    if not isinstance(state, dict) or "network" not in state:
        raise CheckpointError(f"checkpoint {path} is a torch file but not a REINFORCE checkpoint (no 'network')")
    return save_state(state, out, "reinforce", state.get("config"), {"converted_from": path.name})
