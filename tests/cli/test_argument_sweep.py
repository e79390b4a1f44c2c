"""Every `morca` subcommand, every argument, given missing, wrong-type, negative and nonsense values: the command
either refuses with a clear message (argparse's usage error, or one line naming the problem) or starts its work.
Never a raw traceback. The cases come from each subcommand's own parser, so a new argument is swept without
editing this file; a command that starts its work is stopped after a moment (its work is not what is tested).
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import signal
from pathlib import Path

import pytest

from morca_env import commands

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = str(ROOT / "agents" / "trained" / "morca-tiny-v0.safetensors")
BASES = {  # the required arguments of each subcommand, with values that let it start
    "anchor": [SHIPPED, "--out", "anchored.safetensors"],
    "collect": ["morca/tiny/random-v0", "--episodes", "1",
                "--dataset-id", "sweep/random-v0"],
    "convert-checkpoint": ["old.d3"],
    "dataset-report": ["sweep/none-v0"],
    "export-searched": ["logs", "--out", "searched.json"],
    "fit-fixed": ["--budgets", "30", "--evaluations", "1", "--prompts", "tiny-train:1"],
    "benchmark-references": ["MorcaTiny-v0", "--out", "references.json"],
    "search": ["--out", "search"],
    "train-testbed": ["--model", "tiny", "--steps", "1", "--run-dir", "testbed", "--out", "testbed.safetensors"],
    "verify-dataset": ["sweep/none-v0"],
    "leaderboard": ["--out", "board", "--workers", "1"],
    "evaluate": ["--prompts", "1", "--out", "evaluation"],
    "quickstart": ["--out", "quickstart"],
    "train": ["--run-dir", "train"],
    "finetune": ["--run-dir", "finetune"],
    "reinforce": ["--run-dir", "reinforce"],
}
NUMBERS = ["nope", "-1", "99999999999", "1.5"]
FLOATS = ["nope", "-1", "nan", "inf"]
TEXT = ["", "nope", "/nonexistent/dir/x", "-1"]


class _Started(BaseException):
    """The command accepted its arguments and is working: stop it (BaseException: no handler swallows it)."""


def _parser(point) -> argparse.ArgumentParser:
    """The subcommand's parser, captured at `parse_args` before any work."""

    class Captured(BaseException):
        pass

    def capture(self, args=None, namespace=None):
        raise Captured(self)

    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = capture
    try:
        point.load()([])
    except Captured as captured:
        return captured.args[0]
    finally:
        argparse.ArgumentParser.parse_args = original
    raise AssertionError(f"{point.name} never parsed its arguments")


def _values(action: argparse.Action) -> list[str]:
    if action.choices:
        return ["nope"]
    kind = getattr(action.type, "__name__", "")
    if kind in ("int", "positive_int", "nonnegative_int"):
        return NUMBERS
    if kind in ("float", "speedup"):
        return FLOATS
    if kind == "json_dict":
        return ["[1]", "{", '{"lpips": "yes"}', '{"nope": 1}']
    return TEXT


def _cases() -> list[tuple[str, list[str]]]:
    cases = []
    for name, point in commands.commands().items():
        parser = _parser(point)
        base = BASES.get(name, [])
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction) or action.nargs == 0:
                continue
            width = action.nargs if isinstance(action.nargs, int) else 1
            for value in _values(action):
                if action.option_strings:
                    cases.append((name, [*base, action.option_strings[0], *[value] * width]))
                else:  # a positional: the base's value replaced
                    position = [a.dest for a in parser._actions if not a.option_strings].index(action.dest)
                    args = list(base)
                    args[position] = value
                    cases.append((name, args))
            if action.option_strings and action.nargs != "?":
                cases.append((name, [*base, action.option_strings[0]]))  # the option without its value
        for action in parser._actions:  # each required argument left out
            if action.required and action.option_strings:
                i = base.index(action.option_strings[0])
                end = i + 1
                while end < len(base) and not base[end].startswith("--"):
                    end += 1
                cases.append((name, base[:i] + base[end:]))
    return cases


def _preload() -> None:
    """Import everything before the sweep: a stop mid-import would leave a module half-made for the next case."""
    for package in ("morca_env", "agents"):
        module = importlib.import_module(package)
        for info in pkgutil.walk_packages(module.__path__, f"{package}."):
            if info.name.endswith("__main__"):  # runs a command when imported
                continue
            try:
                importlib.import_module(info.name)
            except ImportError:  # an optional extra this venv lacks: its commands say so themselves
                pass


def _descendants(pid: int) -> set[int]:
    """Every process below `pid` (Linux /proc; elsewhere none are tracked)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents.setdefault(int(stat.read_text().rsplit(")", 1)[1].split()[1]), []).append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    found, todo = set(), [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _kill_new(before: set[int]) -> None:
    """Stop the worker processes a started command left (its pool was interrupted, not shut down)."""
    for pid in _descendants(os.getpid()) - before:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def test_every_command_has_a_base_for_its_required_arguments():
    for name, point in commands.commands().items():
        required = [a for a in _parser(point)._actions if a.required]
        if required:
            assert name in BASES, f"morca {name} has required arguments; give the sweep a base for it"


@pytest.mark.slow  # about 140 s on one core: kept out of the default suite (about 13 min)
@pytest.mark.filterwarnings("ignore")
def test_no_argument_value_gives_a_raw_traceback(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MORCA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    monkeypatch.delenv("MORCA_DEBUG", raising=False)
    _preload()

    def stop(signum, frame):
        raise _Started()

    previous = signal.signal(signal.SIGALRM, stop)
    raw, started, refused = [], 0, 0
    try:
        before = _descendants(os.getpid())
        for name, args in _cases():
            signal.setitimer(signal.ITIMER_REAL, 1.0, 0.5)  # repeating: a pool's shutdown would wait for its job
            escaped = None
            try:
                try:
                    status = commands.main([name, *args])
                except SystemExit as exit_:  # argparse's usage error
                    status = exit_.code
                except Exception as error:  # noqa: BLE001 (what the command line let through)
                    status, escaped = 1, f"Traceback (escaped morca): {type(error).__name__}: {error}"
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except _Started:
                status = None
                signal.setitimer(signal.ITIMER_REAL, 0)
                _kill_new(before)
            err = capsys.readouterr().err + (escaped or "")
            if "Traceback" in err or "(a bug in morca" in err:
                raw.append(f"morca {name} {' '.join(args)}\n{err.strip().splitlines()[-1]}")
            started += status is None
            refused += status not in (None, 0)
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert refused > 300, f"only {refused} cases refused: the sweep is not reaching the commands"
    assert not raw, f"{len(raw)} raw tracebacks:\n\n" + "\n\n".join(raw)
