"""Modules that moved into families answer at their old import paths for one release, with a warning that names
the new path, and hold the same module object (a monkeypatch through either name reaches the running code)."""

import importlib
import subprocess
import sys

import pytest

import morca_env
from morca_env.utils.deprecated_paths import MOVED


CHECK_ALL = """
import importlib, warnings, morca_env
from morca_env.utils.deprecated_paths import MOVED
for old, new in sorted(MOVED.items()):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert [str(w.message) for w in caught if w.category is DeprecationWarning] == [
        f"{old} moved to {new}; the old import path goes in the next release"], (old, caught)
    assert module is importlib.import_module(new), old
    assert module.__spec__.name == new, old  # its own spec, not the alias's: reload and pickling see the real name
print(len(MOVED), "ok")
"""


def test_every_old_path_is_the_new_module_with_a_warning():
    """In a fresh process (here the modules are already imported under their new names)."""
    out = subprocess.run([sys.executable, "-c", CHECK_ALL], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-1500:]
    assert out.stdout.strip() == f"{len(MOVED)} ok"


def test_an_old_path_in_this_process_warns_and_is_the_same_module():
    with pytest.warns(DeprecationWarning, match="morca_env.evaluation.benchmark"):
        from morca_env import benchmark
    assert benchmark is importlib.import_module("morca_env.evaluation.benchmark")


def test_no_old_path_is_still_a_file():
    """An old module left behind would shadow the alias and run a stale copy of the code."""
    from pathlib import Path

    root = Path(morca_env.__file__).parent.parent
    left = [old for old in MOVED if (root / (old.replace(".", "/") + ".py")).exists()
            or (root / old.replace(".", "/") / "__init__.py").exists()]
    assert left == []


def test_moved_names_of_a_kept_module_warn_and_resolve():
    from morca_env.speedup import calibration

    with pytest.warns(DeprecationWarning, match="morca_env.speedup.calibration.SpeedupCalibration"):
        from morca_env.budget import SpeedupCalibration
    assert SpeedupCalibration is calibration.SpeedupCalibration is morca_env.SpeedupCalibration
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        morca_env.budget.nothing  # noqa: B018


def test_renamed_functions_answer_under_their_old_names_with_a_warning():
    import morca_env.data as data
    import morca_env.evaluation as evaluation

    with pytest.warns(DeprecationWarning, match="evaluation.evaluate is now run_evaluation"):
        assert evaluation.evaluate is evaluation.run_evaluation
    with pytest.warns(DeprecationWarning, match="data.run_episode is now record_episode"):
        assert data.run_episode is data.record_episode
    for module in (data, evaluation):
        with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
            module.nothing  # noqa: B018
