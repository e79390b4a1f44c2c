"""Files that survive crashes and concurrent runs: atomic writes (a crash leaves the old file or the new one,
never half of either), JSON-lines logs that tolerate a torn last line, one writer per output (an OS lock)."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Iterator


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to `path`; on success it is fsynced and renamed onto `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".tmp{path.suffix}", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes 0600; a finished file gets the usual mode
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
        with contextlib.suppress(OSError):  # directory fsync is not supported everywhere
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def writable_directory(path: str | Path, what: str = "output directory") -> Path:
    """`path` created if missing and checked writable before a long job writes into it: a file in its place or a
    read-only disk is an error naming `what` and the path at the start, not a raw OSError halfway."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise NotADirectoryError(f"{what} {path} is a file (or lies under one), not a directory: give a "
                                 "directory") from None
    except OSError as error:
        raise PermissionError(f"{what} {path} cannot be created ({error.strerror}): give a writable directory") from None
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as error:
        raise PermissionError(f"{what} {path} cannot be written ({error.strerror}): give a writable directory") from None
    return path


def read_json(path: str | Path, what: str = "file"):
    """The JSON value in `path`; a missing, unreadable or malformed file is an error naming `what`, the file and
    (malformed) the line and column, not a bare `JSONDecodeError`."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{what} {path} is a directory, not a JSON file")
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path} does not exist")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        where = f"line {error.lineno}, column {error.colno}: {error.msg}" if isinstance(error, json.JSONDecodeError) \
            else "not text"
        raise ValueError(f"{what} {path} is not valid JSON ({where}); restore it or write it again") from None


def read_json_lines(path: str | Path, required: tuple[str, ...] = ()) -> list[dict]:
    """The rows of an append-only JSON-lines log. A torn last line (a crash in the middle of a write) is dropped
    with a warning, since the row it held is simply redone; a bad line before the end, or a line that is not an
    object holding the `required` keys, means the file was damaged otherwise, and the error names the file and
    line."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as error:
            if number == len(lines):
                warnings.warn(f"{path}: dropped a torn last line ({len(line)} characters; a crash while writing it); "
                              "its row is redone", stacklevel=2)
                continue
            raise ValueError(f"{path} line {number} is not JSON ({error.msg}); the log is damaged: "
                             "move it away to start over") from None
        row = rows[-1]
        missing = [key for key in required if key not in row] if isinstance(row, dict) else None
        if missing is None or missing:
            what = f"lacks {', '.join(map(repr, missing))}" if missing else f"is a JSON {type(row).__name__}"
            raise ValueError(f"{path} line {number} {what}, not a row of this log (an object with "
                             f"{', '.join(map(repr, required)) or 'its fields'}); the log is damaged: move it away "
                             "to start over")
    return rows


def repair_json_lines(path: str | Path) -> None:
    """Cut a torn last line off a JSON-lines log before appending to it, so the next row starts a line of its own."""
    path = Path(path)
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
        warnings.warn(f"{path}: dropped a torn last line ({len(data) - keep} bytes; a crash while writing it); its "
                      "row is redone", stacklevel=2)
        with open(path, "r+b") as f:
            f.truncate(keep)


@contextlib.contextmanager
def exclusive_lock(path: str | Path, what: str) -> Iterator[None]:
    """Hold an OS lock on `path` (created if missing) for the block: a second writer of the same output fails at
    once with the holder's pid instead of interleaving its rows with ours. The lock dies with its process, so a
    killed run never leaves a stale one."""
    import fcntl

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise RuntimeError(f"{what} is being written by another process (pid {holder}, lock {path}); wait for it "
                               "to finish or stop it, then rerun") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
