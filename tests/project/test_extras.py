"""The core install runs without the extras; a feature used without its extra names the extra to install."""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from morca_env.utils.extras import EXTRA_OF, MissingExtra, require

ROOT = Path(__file__).resolve().parents[2]
CORE_ONLY = os.environ.get("MORCA_CORE_ONLY") == "1"  # set by .ci/run for the core venv


@pytest.mark.skipif(CORE_ONLY, reason="the core venv has no extras")
def test_the_full_venv_has_every_extra():
    """In the full venv an extra's tests must run, not skip: a failed install would otherwise pass unseen."""
    missing = []
    for module in (*EXTRA_OF, "rliable.library"):  # rliable's import pulls arch, which breaks on pandas 3
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    assert not missing, f"not installed: {missing} (make test installs .[all,dev])"


@pytest.mark.skipif(not CORE_ONLY, reason="torchrl and tianshou need gymnasium >= 1.1: the core venv has them")
def test_the_core_venv_has_the_online_libraries_on_the_newest_gymnasium_and_no_other_extra():
    """torchrl, tianshou, stable-baselines3 and sb3-contrib, so each library's path is tested where a researcher on
    the newest gymnasium has them; d3rlpy (it pins gymnasium 1.0) and lpips stay out."""
    import gymnasium
    import sb3_contrib  # noqa: F401
    import stable_baselines3  # noqa: F401
    import tianshou  # noqa: F401
    import torchrl  # noqa: F401

    assert tuple(int(x) for x in gymnasium.__version__.split(".")[:2]) >= (1, 1)
    for module in ("d3rlpy", "lpips"):
        with pytest.raises(ImportError):
            __import__(module)


@pytest.mark.skipif(not CORE_ONLY, reason="the agents' commands load in the full venv")
def test_in_the_core_venv_morca_lists_every_command_and_the_agents_ones_name_their_extra(capsys):
    from morca_env import commands

    assert re.search(r"^  train +\(unavailable: ", commands.usage(), flags=re.M) and "[agents]" in commands.usage()
    with pytest.raises(SystemExit) as exit_info:
        commands.main(["collect", "--help"])
    assert exit_info.value.code == 0
    assert commands.main(["train", "--help"]) == 1
    assert "pip install 'morca-gym[agents]'" in capsys.readouterr().err


def test_require_names_the_extra():
    with pytest.raises(MissingExtra, match=r"to_replay_buffer needs d3rlpy, which is not installed: "
                                           r"pip install 'morca-gym\[agents\]'"):
        require("d3rlpy.no_such_module_here", "to_replay_buffer")
    assert issubclass(MissingExtra, ImportError)


BLOCKED = textwrap.dedent("""
    import sys
    class Block:  # as if d3rlpy, stable-baselines3 and lpips were not installed
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("d3rlpy", "stable_baselines3", "sb3_contrib", "lpips"):
                raise ModuleNotFoundError(f"No module named {name!r}")
    sys.meta_path.insert(0, Block())
""")


def _run(code: str, tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "MORCA_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", BLOCKED + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env=env)


def test_without_the_extras_an_episode_runs_and_agents_name_their_extra(tmp_path):
    out = _run("""
        import warnings
        import torch; torch.set_num_threads(1)
        import gymnasium as gym
        import morca_env, morca_env.data, morca_env.schedulers
        from morca_env.utils.extras import MissingExtra
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            env = gym.make("MorcaTinyRandom-v0", budget=2, num_inference_steps=6)  # lpips=True by default
        assert any("morca-gym[lpips]" in str(w.message) for w in caught), [str(w.message) for w in caught]
        obs, info = env.reset(seed=0)
        done = False
        while not done:
            obs, reward, done, _, info = env.step(1)
        assert info["num_reuse"] == 2 and reward > 0
        for call in ("import agents", "morca_env.data.to_replay_buffer([])",
                     "morca_env.schedulers.make('morca', env, path='x.d3')"):
            try:
                exec(call)
            except MissingExtra as error:
                assert "pip install 'morca-gym[agents]'" in str(error), (call, error)
            else:
                raise AssertionError(call + " ran without d3rlpy")
        print("ok", sorted(m for m in sys.modules if m.split(".")[0] in ("d3rlpy", "lpips", "stable_baselines3")))
    """, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok []"), out.stdout
