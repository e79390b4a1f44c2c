import gymnasium as gym
import numpy as np
import pytest

import morca_env  # noqa: F401
from morca_env.budget import BudgetSpec, forced_recompute_steps
from morca_env.speedup.calibration import SpeedupCalibration
from morca_env.speedup.files import ThresholdMap
from morca_env.schedulers.fixed import RandomFeasible, UniformInterval
from morca_env.schedulers import make
from morca_env.schedulers.rules.seacache import SeaCacheThreshold


def play(env, policy, seed=0, options=None):
    obs, info = env.reset(seed=seed, options=options)
    policy.reset(obs, info)
    done = False
    while not done:
        obs, reward, done, _, info = env.step(policy(obs))
        assert not info["projected"], "rule policies must respect the mask"
    return info


@pytest.fixture
def env(tmp_path):
    return gym.make("MorcaTinyRandom-v0", budget=8, num_inference_steps=20, lpips=False,
                    reference_cache_dir=str(tmp_path))


def test_uniform_interval_spreads_reuses_evenly():
    spec = BudgetSpec(12, forced_recompute_steps(12))
    assert UniformInterval().plan(spec, 5) == [0, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0]
    assert UniformInterval().plan(spec, 3) == [0, 0, 1, 0, 0, 0, 1, 0, 0, 1, 0, 0]
    assert UniformInterval().plan(spec, 10) == [0] + [1] * 10 + [0]
    assert UniformInterval().plan(spec, 0) == [0] * 12


def test_random_feasible_is_seeded_and_exact():
    spec = BudgetSpec(20, forced_recompute_steps(20, 7))
    a, b = RandomFeasible(3).plan(spec, 9), RandomFeasible(3).plan(spec, 9)
    assert a == b and sum(a) == 9 and a[0] == a[7] == a[19] == 0


@pytest.mark.parametrize("policy", [UniformInterval(), RandomFeasible(1), SeaCacheThreshold(0.3)])
def test_rule_policies_respect_the_mask(env, policy):
    info = play(env, policy)
    assert info["num_reuse"] == 8


def test_seacache_exact_budget_finds_the_threshold(env):
    policy = make("seacache-exact", env)
    info = play(env, policy)
    threshold_info = play(env, SeaCacheThreshold(policy.last_threshold))
    assert info["schedule"] == threshold_info["schedule"]  # the same threshold, replayed through the env
    assert sum(info["schedule"]) == 8
    policy.close()


def test_threshold_map_recalibrated_keeps_each_thresholds_budget():
    """A threshold's realised K is machine independent; only the K -> speedup reading changes."""
    old = SpeedupCalibration(alpha=61.0, beta=57.0, max_budget=48, source="old")
    new = SpeedupCalibration(alpha=60.0, beta=55.0, max_budget=48, source="new")
    budgets = np.array([10.0, 25.0, 40.0, 46.0])
    tmap = ThresholdMap([old.speedup_of_budget(k) for k in budgets], [0.1, 0.3, 0.9, 2.0], source="test")
    moved = tmap.recalibrated(old, new)
    assert moved.speedups == pytest.approx([new.speedup_of_budget(k) for k in budgets])
    assert moved.thresholds.tolist() == tmap.thresholds.tolist()
    assert moved(new.speedup_of_budget(25.0)) == pytest.approx(0.3)
    assert "recalibrated: new" in moved.source


def test_threshold_map_recalibrated_drops_thresholds_that_collapse_to_one_speedup():
    """A calibration measured on a noisy machine can read two thresholds' K as the same speedup (a flat
    measured curve): those add nothing, and the map must still build from the increasing part."""
    old = SpeedupCalibration(alpha=20.0, beta=20.0, max_budget=18, source="old")
    flat = SpeedupCalibration(alpha=20.0, beta=20.0, max_budget=18, source="flat",
                              points=[[0, 1.0], [4, 0.8], [8, 0.6], [12, 0.6], [16, 0.6]])
    tmap = ThresholdMap([1.2, 1.5, 2.0, 2.5], [0.05, 0.1, 0.2, 0.4])
    moved = tmap.recalibrated(old, flat)
    assert len(moved.speedups) >= 2 and np.all(np.diff(moved.speedups) > 0)
    with pytest.raises(ValueError, match="fewer than 2 distinct speedups"):
        ThresholdMap([1.2, 1.5], [0.05, 0.1]).recalibrated(old, SpeedupCalibration(
            alpha=20.0, beta=20.0, max_budget=18, source="flat", points=[[0, 0.6], [18, 0.6]]))


def test_the_naive_floor_policies_place_their_reuses_where_the_mask_pushes_them(env):
    """always-recompute's reuses are the last free steps, always-reuse's the first; the coin flip is seeded. All
    spend exactly K without an override (they ask for a feasible action)."""
    spec = env.unwrapped.budget_spec
    free = [i for i in range(spec.num_steps) if i not in spec.forced]
    late = play(env, make("always-recompute"))["schedule"]
    early = play(env, make("always-reuse"))["schedule"]
    assert [i for i, a in enumerate(late) if a] == free[-8:]
    assert [i for i, a in enumerate(early) if a] == free[:8]
    flips = [play(env, make("coin-flip", seed=s))["schedule"] for s in (3, 3, 4)]
    assert flips[0] == flips[1] != flips[2] and all(sum(f) == 8 for f in flips)
