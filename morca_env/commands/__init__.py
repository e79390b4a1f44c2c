"""The `morca` command: one subcommand per job (`morca collect ...`, `morca train ...`, `morca --help`).

Subcommands come from the `morca_gym.commands` entry-point group, so the `agents`
package adds its own (train, finetune, reinforce, quickstart) without `morca_env`
importing it. Each subcommand is a module with `main(argv) -> int` (also runnable as
`python -m morca_env.commands <name>`). Listing them reads each module's
docstring from its file (no subcommand module, nor `agents`, is imported), so
`morca --help` works without the optional extras; it still pays for importing
`morca_env` itself (torch, diffusers: ~5 s on a 2-core machine).

A bad value, file or state (the package raises `ValueError`, `OSError` or `RuntimeError` naming it) ends a
command with that one line on stderr and exit status 1; anything else is a bug and keeps its traceback.
`--debug` (anywhere on the line, or `MORCA_DEBUG=1`) shows the traceback of every error.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from importlib.machinery import PathFinder
from importlib.metadata import entry_points
from importlib.util import find_spec
from pathlib import Path

GROUP = "morca_gym.commands"
# renamed subcommands answer under their old name for one release (`references` read like the reference videos)
RENAMED = {"references": "benchmark-references"}


def commands() -> dict:
    """Subcommand name -> its entry point, sorted by name."""
    return dict(sorted((point.name, point) for point in entry_points(group=GROUP)))


def _missing_extra(package: str) -> str | None:
    """Why a package that is also an extra's name (`agents`) cannot load: the first of that extra's modules
    not installed, named with its install line; None when nothing is missing."""
    from ..utils.extras import EXTRA_OF, install_hint

    for dependency, extra in EXTRA_OF.items():
        if extra == package and find_spec(dependency) is None:
            return f"{package} needs {dependency}, which is not installed: {install_hint(extra)}"
    return None


def _source_spec(module: str):
    """The module's spec, found on the file system without importing its parent packages (importing `agents`
    would pull d3rlpy in: seconds per `morca --help`)."""
    top, *parts = module.split(".")
    spec = find_spec(top)  # a top-level name is only looked up
    for depth in range(len(parts)):
        if spec is None or not spec.submodule_search_locations:
            return None
        spec = PathFinder.find_spec(".".join([top, *parts[:depth + 1]]), list(spec.submodule_search_locations))
    return spec


def summary(point) -> str:
    """The first line of the subcommand module's docstring, read from its source file."""
    module = point.value.split(":")[0]
    try:
        missing = _missing_extra(module.split(".")[0])
        spec = _source_spec(module)
    except (ImportError, ValueError, KeyError) as error:  # a finder that refuses, a namespace package's lookup
        return f"(unavailable: {error!r})"
    if missing:  # the agents' commands without their extra
        return f"(unavailable: {missing})"
    if spec is None or not spec.origin:
        return f"(not installed: {module})"
    with open(spec.origin, encoding="utf-8") as source:
        doc = ast.get_docstring(ast.parse(source.read())) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def usage() -> str:
    found = commands()
    width = max(map(len, found), default=0)
    rows = [f"  {name:<{width}}  {summary(point)}" for name, point in found.items()]
    return ("usage: morca <command> [options]     (morca <command> --help for its options)\n\ncommands:\n"
            + "\n".join(rows))


_PACKAGES = tuple(str(Path(__file__).resolve().parents[2] / name) + "/" for name in ("morca_env", "agents"))


def _raised_here(error: BaseException) -> bool:
    """Whether `error`, or an error it was raised from, comes from a `raise` in this project's packages."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        tb = error.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        if tb is not None and tb.tb_frame.f_code.co_filename.startswith(_PACKAGES):
            return True
        error = error.__cause__ or error.__context__
    return False


def is_user_error(error: BaseException) -> bool:
    """Whether `error` reports a bad value, file or state in words meant for the user (one line, no traceback):
    a `ValueError`, `OSError`, `RuntimeError`, `ImportError` or `MemoryError` (a size too large for this
    machine), or a `TypeError` the package raised itself (its checks of argument types) or a call refused for an
    unknown keyword (an env kwarg that does not exist). A recursion limit, an unimplemented path or any other
    error is a bug, and keeps its traceback."""
    if isinstance(error, (RecursionError, NotImplementedError)):
        return False
    if isinstance(error, TypeError):
        return _raised_here(error) or "unexpected keyword argument" in str(error)
    return isinstance(error, (ValueError, OSError, RuntimeError, ImportError, MemoryError))


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("MORCA_DEBUG", "") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name in RENAMED:
        print(f"morca: `morca {name}` is now `morca {RENAMED[name]}`; the old name goes in the next release",
              file=sys.stderr)
        name = RENAMED[name]
    found = commands()
    if name not in found:
        print(f"morca: unknown command {name!r}; valid: {', '.join(found)}", file=sys.stderr)
        return 2
    try:
        command = found[name].load()
    except ImportError as error:  # a subcommand of a package whose extra is missing: say which, no traceback
        print(f"morca {name}: {error}", file=sys.stderr)
        return 1
    try:
        return command(rest) or 0
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"morca {name}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        if debug:
            raise
        message = " ".join(str(error).split()) or type(error).__name__
        if is_user_error(error):
            print(f"morca {name}: {message}", file=sys.stderr)
            return 1
        import traceback

        traceback.print_exc()
        print(f"morca {name}: unexpected {type(error).__name__}: {message} (a bug in morca: please report it with "
              "the traceback above)", file=sys.stderr)
        return 1


def run_step(step: str, args: list[str], env: dict) -> None:
    """Run `morca <args>` in a fresh process (a pipeline's step: its memory and threads end with it), showing its
    output and time; a failed step raises `CalledProcessError`."""
    print(f"\n=== {step}: morca {' '.join(args)}", flush=True)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "morca_env.commands", *args], env=env, check=True)
    print(f"=== {step} done in {time.perf_counter() - t0:.0f} s", flush=True)


def resume_flag(run_dir) -> list[str]:
    """`--resume` when `run_dir` holds a checkpointed run (a rerun continues it)."""
    from pathlib import Path

    return ["--resume"] if (Path(run_dir) / "latest.json").exists() else []
