"""Measuring the speedup calibration: rounds, timing repeats (fastest of R) and bad input."""

import gymnasium as gym
import pytest

import morca_env  # noqa: F401  (registers the envs)
from morca_env.speedup.measure import fastest, measure_calibration


def test_fastest_takes_the_minimum_of_exactly_r_runs():
    times = iter([3.0, 1.0, 2.0])
    calls = []

    def run():
        calls.append(1)
        return next(times)

    assert fastest(run, 3) == 1.0 and len(calls) == 3
    with pytest.raises(ValueError, match="repeats=0 must be >= 1"):
        fastest(run, 0)


def test_measure_calibration_times_each_point_as_the_fastest_of_r_runs(tmp_path):
    env = gym.make("MorcaTinyRandom-v0", budget=0, num_inference_steps=10, lpips=False,
                   reference_cache_dir=str(tmp_path / "refs")).unwrapped
    latencies = []
    stock_calls = []
    original_step, original_generate = env.step, env.denoiser.generate

    def step(action):
        out = original_step(action)
        if out[2]:
            latencies.append((env.budget, out[4]["latency_s"]))
        return out

    def generate(*args, **kwargs):
        stock_calls.append(kwargs.get("prompt"))
        return original_generate(*args, **kwargs)

    env.step, env.denoiser.generate = step, generate
    budgets = [0, 4, 8]
    measured = measure_calibration(env, budgets, repeats=2, threads=1, progress=False, timing_repeats=3)
    # every budget: 2 rounds x 3 timed runs; the point is the mean over rounds of each round's fastest
    for k in budgets:
        runs = [t for b, t in latencies if b == k]
        assert len(runs) == 6
        expected = (min(runs[:3]) + min(runs[3:])) / 2
        assert measured.mean_latency_s[k] == pytest.approx(expected)
    assert len(stock_calls) >= 1 + 2 * 3  # warm-up + rounds x repeats (references may add generations)
    assert "fastest of 3" in measured.calibration.source
    with pytest.raises(ValueError, match="timing_repeats=0 must be >= 1"):
        measure_calibration(env, budgets, repeats=1, progress=False, timing_repeats=0)


def test_calibration_files_are_written_where_asked_and_found_user_first(tmp_path, monkeypatch):
    """One home for calibration files: the user's copy (under the cache root) wins over the packaged one."""
    from morca_env.speedup.files import (
        calibration_file, find_calibration_file, load_calibration, packaged_calibration_path)

    monkeypatch.setenv("MORCA_CACHE_DIR", str(tmp_path / "cache"))
    user = calibration_file("tiny.json")
    assert user == tmp_path / "cache" / "calibration" / "tiny.json"
    assert calibration_file("tiny.json", "packaged") == packaged_calibration_path("tiny")
    assert calibration_file("tiny.json", str(tmp_path / "elsewhere")) == tmp_path / "elsewhere" / "tiny.json"
    assert find_calibration_file("tiny.json") == packaged_calibration_path("tiny")  # no user copy yet
    packaged = load_calibration("tiny", 50, 48)
    user.parent.mkdir(parents=True)
    morca_env.SpeedupCalibration(alpha=60.0, beta=30.0, max_budget=48, num_steps=50, source="user").to_json(user)
    assert find_calibration_file("tiny.json") == user
    mine = load_calibration("tiny", 50, 48)
    assert (mine.alpha, mine.source) == (60.0, "user") and packaged.alpha != 60.0
    with pytest.raises(ValueError, match="calibration='nope' is not a registered model; valid: "):
        load_calibration("nope", 50, 48)


def test_resolve_reads_every_form_a_caller_may_pass(tmp_path):
    """The env and `accelerate` share one `resolve`: an object, a JSON file as a str or a PathLike, a model name."""
    from morca_env.speedup import SpeedupCalibration, resolve

    own = SpeedupCalibration(alpha=40.0, beta=35.0, max_budget=45, source="test")
    assert resolve(own, 50, 45) is own
    path = tmp_path / "calib.json"
    own.to_json(path)
    assert resolve(path, 50, 45) == own and resolve(str(path), 50, 45) == own
    packaged = resolve("tiny", 50, 45)
    assert isinstance(packaged, SpeedupCalibration) and packaged != own
    for bad in (3, True, 2.5, ["tiny"]):
        with pytest.raises(TypeError, match=r"calibration=.*valid: a registered model name, a calibration JSON path"):
            resolve(bad, 50, 45)
    with pytest.raises(ValueError, match="nowhere"):
        resolve("nowhere", 50, 45)
