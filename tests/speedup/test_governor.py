"""SpeedupGovernor: closed-loop correction of the requested speedup on a drifting machine."""

import numpy as np
import pytest

from morca_env.speedup.governor import SpeedupGovernor


def simulate(governor, factors, rng):
    """A machine whose realised speedup is factor x requested (with 5% noise); -> realised speedups."""
    stock_total, episode_total = 0.0, 0.0
    for factor in factors:
        requested = governor.request()
        stock = 1.0 * rng.uniform(0.95, 1.05)
        episode = stock / (factor * requested)
        governor.record(requested, stock, episode)
        stock_total, episode_total = stock_total + stock, episode_total + episode
    return stock_total / episode_total


def test_governor_holds_the_mean_speedup_when_the_machine_is_off_and_drifts():
    rng = np.random.default_rng(0)
    # the machine runs 6% faster than calibrated, then drifts to 2% faster after 40 episodes
    factors = [1.06] * 40 + [1.02] * 20
    open_loop = 1.0 / np.mean([1 / (3.0 * f) for f in factors])  # ratio of means without the governor
    closed = simulate(SpeedupGovernor(3.0, (1.0, 4.3)), factors, rng)
    assert abs(closed - 3.0) < 0.05 < abs(open_loop - 3.0)


def test_governor_requests_stay_in_range_and_start_at_the_target():
    governor = SpeedupGovernor(4.0, (1.0, 4.2))
    assert governor.request() == 4.0 and governor.machine_factor == 1.0
    governor.record(4.0, stock_s=1.0, episode_s=1.0 / 3.0)  # the machine gives only 3x for a 4x request
    assert governor.machine_factor == pytest.approx(0.75)
    assert governor.request() == 4.2  # 4 / 0.75 = 5.33, clipped to the range


def test_governor_bad_input_names_values():
    with pytest.raises(ValueError, match=r"target speedup 5.0 is outside the calibrated range \[1.00, 4.20\]"):
        SpeedupGovernor(5.0, (1.0, 4.2))
    with pytest.raises(ValueError, match="forgetting=1.0 must be in"):
        SpeedupGovernor(2.0, (1.0, 4.2), forgetting=1.0)
    with pytest.raises(ValueError, match="episode_s=0.0"):
        SpeedupGovernor(2.0, (1.0, 4.2)).record(2.0, 1.0, 0.0)
