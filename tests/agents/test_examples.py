"""Every library swap in examples/ runs for a few hundred steps and is scored by the benchmark, with no glue."""

import importlib
from pathlib import Path

import pytest

import morca_env  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
TEST_ENV = "MorcaTinyRandom-v0"  # its benchmark suite: 4 held-out pairs x 2 targets, 10 steps


def example(name: str):
    return importlib.import_module(f"examples.{name}")  # the checkout's root is on the tests' pythonpath


def check(result, masked: bool) -> None:
    assert set(result.scores) == {2.0, 3.0} and len(result.rows) == 8
    assert all(sum(r["schedule"]) == r["k"] for r in result.rows)  # held to the target's K
    if masked:  # the library read the mask: the env never had to change an action
        assert all(r["projected"] == 0 for r in result.rows), [r["projected"] for r in result.rows]


def test_sb3_ppo_and_dqn():
    pytest.importorskip("stable_baselines3")  # the [sb3] extra
    results = example("sb3_ppo_dqn").main(TEST_ENV, steps=192)
    for result in results.values():
        check(result, masked=False)


def test_sb3_contrib_maskable_ppo():
    pytest.importorskip("sb3_contrib")
    check(example("sb3_maskable_ppo").main(TEST_ENV, steps=192), masked=True)


def test_torchrl_dqn_with_its_action_mask_transform():
    pytest.importorskip("torchrl")  # the core venv (torchrl needs gymnasium >= 1.1; d3rlpy pins 1.0)
    check(example("torchrl_dqn").main(TEST_ENV, frames=200), masked=True)


def test_tianshou_dqn_with_the_mask():
    pytest.importorskip("tianshou")
    check(example("tianshou_dqn").main(TEST_ENV, steps=200), masked=True)


def test_cleanrl_style_loop():
    check(example("cleanrl_reinforce").main(TEST_ENV, steps=200), masked=True)


def test_d3rlpy_algorithms_on_the_default_buffer(tmp_path, monkeypatch):
    pytest.importorskip("d3rlpy")  # the [agents] extra
    from morca_env.evaluation import benchmark
    from morca_env.data import collect_dataset

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    suite = benchmark.suite_of(TEST_ENV)
    collect_dataset("test/tiny/examples-v0", TEST_ENV, 6, {**suite.kwargs, "speedup": [2.0, 3.0],
                                                          "prompts": suite.train_prompts},
                    behavior="random", progress=False)
    results = example("d3rlpy_offline").main("test/tiny/examples-v0", steps=20)
    assert list(results) == ["DiscreteCQL", "DiscreteBCQ", "DiscreteBC", "DQN", "DiscreteIQL (MORCA)"]
    for name, result in results.items():
        check(result, masked=name == "DiscreteIQL (MORCA)")
