import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from morca_env.budget import BudgetSpec, forced_recompute_steps
from morca_env.speedup.calibration import SpeedupCalibration, seed_dither


@st.composite
def schedules(draw):
    n = draw(st.integers(1, 60))
    forced = draw(st.sets(st.integers(0, n - 1), max_size=n))
    spec = BudgetSpec(n, frozenset(forced))
    budget = draw(st.integers(0, spec.max_budget))
    requested = draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
    return spec, budget, requested


@settings(max_examples=400, deadline=None)
@given(schedules())
def test_projected_schedule_has_exactly_k_reuses(case):
    spec, budget, requested = case
    used, cache_valid = 0, False
    for step, action in enumerate(requested):
        mask = spec.action_mask(step, used, budget, cache_valid)
        assert mask.dtype == np.int8 and mask.any(), "some action is always feasible"
        executed, projected = spec.project(action, step, used, budget, cache_valid)
        assert projected == (executed != action)
        assert mask[executed]
        if executed:
            assert step not in spec.forced and cache_valid
        used += executed
        cache_valid = True  # any executed step leaves a valid cache (a reuse keeps it, a recompute makes it)
    assert used == budget
    assert spec.project_schedule(requested, budget).count(1) == budget


@settings(max_examples=300, deadline=None)
@given(schedules())
def test_choices_along_counts_the_steps_whose_mask_allowed_both_actions(case):
    spec, budget, requested = case
    executed = spec.project_schedule(requested, budget)
    used, both = 0, 0
    for step, action in enumerate(executed):
        both += bool(spec.action_mask(step, used, budget).all())
        used += action
    assert spec.choices_along(executed, budget) == both


def test_forced_steps_and_max_budget():
    assert forced_recompute_steps(50) == {0, 49}
    assert forced_recompute_steps(50, expert_switch_step=7) == {0, 7, 49}
    assert BudgetSpec(50, forced_recompute_steps(50, 7)).max_budget == 47
    assert 0 in BudgetSpec(5, frozenset({4})).forced  # step 0 has no cache: always forced
    with pytest.raises(ValueError, match=r"budget K=49 is outside the feasible range \[0, 48\]"):
        BudgetSpec(50, forced_recompute_steps(50)).check_budget(49)
    with pytest.raises(ValueError, match="outside"):
        forced_recompute_steps(10, expert_switch_step=10)


def test_mask_forces_recompute_when_budget_spent_and_reuse_when_tight():
    spec = BudgetSpec(6, forced_recompute_steps(6))  # free steps 1..4
    assert spec.action_mask(1, 0, 0).tolist() == [1, 0]  # nothing to spend
    assert spec.action_mask(1, 0, 4).tolist() == [0, 1]  # must reuse every free step
    assert spec.action_mask(2, 1, 2).tolist() == [1, 1]
    assert spec.action_mask(5, 2, 2).tolist() == [1, 0]  # last step forced


def test_calibration_fit_recovers_linear_latency_model():
    n, cost, fixed = 50, 1.0, 2.0
    ks = np.arange(0, 45, 5)
    latency = fixed + (n - ks) * cost
    calib = SpeedupCalibration.fit(ks, latency, max_budget=48, source="synthetic", num_steps=n)
    full = fixed + n * cost
    assert calib.alpha == pytest.approx(full / cost) and calib.beta == pytest.approx(full / cost)
    for k in (0, 10, 30, 44):
        assert calib.speedup_of_budget(k) == pytest.approx(full / (fixed + (n - k) * cost))
        assert calib.budget_for_speedup(calib.speedup_of_budget(k)) == k


def test_scheduler_cost_is_counted_in_the_speedup_map():
    n, cost, fixed, scheduler = 50, 1.0, 2.0, 0.05
    ks = np.arange(0, 45, 5)
    calib = SpeedupCalibration.fit(ks, fixed + (n - ks) * cost, max_budget=48, source="synthetic", num_steps=n)
    full = fixed + n * cost
    driven = calib.with_scheduler_cost(scheduler)
    for k in (0, 20, 44):
        assert driven.speedup_of_budget(k) == pytest.approx(full / (fixed + (n - k) * cost + n * scheduler))
    assert driven.budget_for_speedup(3.0) > calib.budget_for_speedup(3.0)  # more reuse pays for the scheduler
    assert driven.speedup_range[1] < calib.speedup_range[1]
    assert calib.with_scheduler_cost(0.0) is calib
    with pytest.raises(ValueError, match="scheduler_cost_s=-1.0 must be a finite number >= 0"):
        calib.with_scheduler_cost(-1.0)
    with pytest.raises(ValueError, match="needs a measured calibration"):
        SpeedupCalibration(alpha=50.0, beta=50.0, max_budget=48, source="ideal").with_scheduler_cost(0.01)


def test_speedup_out_of_range_names_value_and_range():
    calib = SpeedupCalibration(alpha=52.0, beta=52.0, max_budget=48, source="test")
    lo, hi = calib.speedup_range
    assert lo == 1.0 and hi == pytest.approx(13.0)
    with pytest.raises(ValueError, match=r"speedup=20.0 is outside the feasible range \[1.00, 13.00\]"):
        calib.budget_for_speedup(20.0)
    with pytest.raises(ValueError, match="speedup=0.5"):
        calib.budget_for_speedup(0.5)
    with pytest.raises(TypeError, match="must be a number"):
        calib.budget_for_speedup("3x")
    assert calib.budget_for_speedup(1.0) == 0
    assert math.isinf(SpeedupCalibration(alpha=40.0, beta=40.0, max_budget=48).speedup_of_budget(45))


def test_calibration_json_round_trip(tmp_path):
    calib = SpeedupCalibration(alpha=51.2, beta=50.1, max_budget=48, source="x", full_latency_s=3.2, num_steps=50)
    calib.to_json(tmp_path / "c.json")
    assert SpeedupCalibration.from_json(tmp_path / "c.json") == calib


def test_dithered_rounding_brackets_k_star_and_averages_to_it():
    calib = SpeedupCalibration(alpha=61.0, beta=57.0, max_budget=48, source="test")
    target = 4.0
    k_star = calib.fractional_budget(target)
    assert calib.speedup_of_budget(k_star) == pytest.approx(target)
    draws = (np.arange(1000) + 0.5) / 1000
    budgets = np.array([calib.budget_for_speedup(target, u) for u in draws])
    assert set(budgets.tolist()) == {math.floor(k_star), math.ceil(k_star)}
    assert budgets.mean() == pytest.approx(k_star, abs=1e-3)
    assert calib.budget_for_speedup(calib.speedup_range[1], 0.999) == 48  # never past K_max
    for bad in (1.0, -0.1, "0.5"):
        with pytest.raises(ValueError, match=f"dither={bad!r} must be a number in \\[0, 1\\)"):
            calib.budget_for_speedup(target, bad)
    spread = sorted(seed_dither(s) for s in range(10))
    assert max(np.diff(spread)) < 0.2  # consecutive seeds cover [0, 1) evenly


def test_measured_points_override_the_line_inside_their_range(tmp_path):
    """A curve that bends near the ceiling: the global line misses it, the fit through the points does not."""
    n, full = 50, 1.0
    ks = np.array([0, 8, 16, 24, 32, 40, 42, 44, 46, 48])
    inverse = 1 - 0.018 * ks + 0.00015 * ks**2  # slower than linear at the top, as MorcaTiny
    calib = SpeedupCalibration.fit(ks, inverse * full, max_budget=48, source="bent", num_steps=n, full_latency_s=full)
    line = SpeedupCalibration(alpha=calib.alpha, beta=calib.beta, max_budget=48, source="line")
    for k, r in zip(ks, inverse):
        assert calib.speedup_of_budget(k) == pytest.approx(1 / r, rel=1e-3)
    assert abs(line.speedup_of_budget(48) - 1 / inverse[-1]) > 0.1  # the line alone is off here
    target = 1 / (1 - 0.018 * 47 + 0.00015 * 47**2)
    assert calib.fractional_budget(target) == pytest.approx(47, abs=0.02)
    assert calib.budget_for_speedup(target) == 47
    noisy = SpeedupCalibration(alpha=50.0, beta=50.0, max_budget=48, points=[[0, 1.0], [10, 0.7], [20, 0.75]])
    assert noisy.speedup_of_budget(20) == pytest.approx(1 / 0.7)  # a bumped-up point is flattened, not trusted
    calib.to_json(tmp_path / "c.json")
    assert SpeedupCalibration.from_json(tmp_path / "c.json") == calib


def test_forced_steps_and_spec_validation_at_the_edges():
    assert forced_recompute_steps(1) == {0}  # a one-step schedule is valid
    assert forced_recompute_steps(10, expert_switch_step=0) == {0, 9}
    assert forced_recompute_steps(10, expert_switch_step=9) == {0, 9}
    for bad in (0, -3):
        with pytest.raises(ValueError, match=f"num_steps={bad} must be >= 1"):
            forced_recompute_steps(bad)
        with pytest.raises(ValueError, match=f"num_steps={bad} must be >= 1"):
            BudgetSpec(bad)
    with pytest.raises(ValueError, match=r"expert_switch_step=-1 is outside \[0, 9\]"):
        forced_recompute_steps(10, expert_switch_step=-1)
    one = BudgetSpec(1)
    assert one.forced == {0} and one.max_budget == 0 and one.free_after(0) == 0
    assert BudgetSpec(5, frozenset({4})).forced == {0, 4}
    for bad in ({5}, {-1}, {2, 7}):
        with pytest.raises(ValueError, match=r"forced steps \[-?\d\] are outside \[0, 4\]"):
            BudgetSpec(5, frozenset(bad))
    spec = BudgetSpec(6, frozenset({0, 3, 5}))  # free: 1, 2, 4
    assert [spec.free_after(i) for i in range(6)] == [3, 2, 1, 1, 0, 0]


def test_budget_and_step_checks_name_the_bad_value():
    spec = BudgetSpec(6, forced_recompute_steps(6))  # K in [0, 4]
    for ok in (0, 4, np.int64(2)):
        assert spec.check_budget(ok) == ok and type(spec.check_budget(ok)) is int
    for bad in (True, np.bool_(False), 2.0, "2", None):
        with pytest.raises(TypeError, match=r"must be an integer number of reuse steps in \[0, 4\]"):
            spec.check_budget(bad)
    for bad in (-1, 5):
        with pytest.raises(ValueError, match=rf"budget K={bad} is outside the feasible range \[0, 4\] "
                                             r"\(6 steps, 2 forced recomputes\)"):
            spec.check_budget(bad)
    for bad in (-1, 6):
        with pytest.raises(ValueError, match=rf"step={bad} is outside \[0, 5\]"):
            spec.action_mask(bad, 0, 1)
    with pytest.raises(ValueError, match="schedule has 5 actions, expected 6"):
        spec.project_schedule([0] * 5, 1)
    with pytest.raises(ValueError, match="budget K=5 is outside"):
        spec.project_schedule([0] * 6, 5)
    # a broken invariant (K larger than the free steps left) has no feasible action: it raises, never guesses
    with pytest.raises(RuntimeError, match=r"no feasible action at step 0 \(used=0, budget=5, cache_valid=True\)"):
        spec.project(1, 0, 0, 5)


def test_mask_without_a_budget_or_a_cache():
    spec = BudgetSpec(6, forced_recompute_steps(6))
    assert spec.unconstrained_mask(2).tolist() == [1, 1]
    assert spec.unconstrained_mask(2, cache_valid=False).tolist() == [1, 0]
    assert spec.unconstrained_mask(5).tolist() == [1, 0]  # forced
    assert spec.unconstrained_mask(2).dtype == np.int8
    # default cache_valid=True; a missing cache forbids reuse even when the budget needs it
    assert spec.action_mask(1, 0, 4).tolist() == [0, 1]
    assert spec.action_mask(1, 0, 4, cache_valid=False).tolist() == [0, 0]
    assert spec.action_mask(2, 1, 2, False).tolist() == [1, 0]
    # projection: with the budget enforced a spent budget forces recompute; without it the request stands
    assert spec.project(1, 2, 2, 2) == (0, True)
    assert spec.project(1, 2, 2, 2, enforce_budget=False) == (1, False)
    assert spec.project(1, 2, 0, 2, cache_valid=False, enforce_budget=False) == (0, True)
    assert spec.project(1, 5, 0, 2, enforce_budget=False) == (0, True)  # a forced step, even without a budget
    assert spec.project(1, 2, 0, 2, cache_valid=False) == (0, True)  # no cache: no reuse, budget or not
    assert spec.project(0, 1, 0, 4) == (1, True)
    assert spec.project(1, 1, 0, 4) == (1, False)
    assert spec.project_schedule([1, 1, 0, 0, 1, 1], 2) == [0, 1, 0, 0, 1, 0]


def test_seed_dither_is_the_golden_ratio_sequence():
    golden = (math.sqrt(5) - 1) / 2
    for seed in (0, 1, 2, 17, 1000):
        assert seed_dither(seed) == pytest.approx(((seed + 1) * golden) % 1.0, abs=1e-9)
    assert seed_dither(0) == pytest.approx(0.6180339887)
    assert seed_dither(np.int64(1)) == pytest.approx(0.2360679775)
    assert type(seed_dither(3)) is float


def test_calibration_fit_validation_and_provenance():
    ks, latency = [0, 10, 20], [52.0, 42.0, 32.0]
    calib = SpeedupCalibration.fit(ks, latency, max_budget=48, source="bench", num_steps=50)
    assert calib.source == "bench" and calib.num_steps == 50 and calib.max_budget == 48
    assert calib.full_latency_s == 52.0 and calib.points == [[0.0, 1.0], [10.0, 42 / 52], [20.0, 32 / 52]]
    assert all(type(v) is float for point in calib.points for v in point)
    two = SpeedupCalibration.fit([0, 10], [52.0, 42.0], max_budget=48, source="two")  # two pairs are enough
    assert two.alpha == pytest.approx(52.0) and two.beta == pytest.approx(52.0)
    # K=0 latency averaged over repeats when full_latency_s is not given
    rep = SpeedupCalibration.fit([0, 0, 10], [50.0, 54.0, 42.0], max_budget=48, source="rep")
    assert rep.full_latency_s == 52.0
    given = SpeedupCalibration.fit([10, 20], [42.0, 32.0], max_budget=48, source="g", full_latency_s=52.0)
    assert given.alpha == pytest.approx(52.0) and given.full_latency_s == 52.0
    for budgets, latencies in (([0, 10], [52.0]), ([0], [52.0]), ([0, 10, 20], [52.0, 42.0])):
        with pytest.raises(ValueError, match="need at least two"):
            SpeedupCalibration.fit(budgets, latencies, max_budget=48, source="x")
    for bad in ([52.0, 0.0], [52.0, -1.0]):
        with pytest.raises(ValueError, match="latencies must be positive"):
            SpeedupCalibration.fit([0, 10], bad, max_budget=48, source="x")
    with pytest.raises(ValueError, match="calibration needs K=0"):
        SpeedupCalibration.fit([5, 10], [47.0, 42.0], max_budget=48, source="x")


def test_scheduler_cost_needs_both_measurements_and_is_recorded_in_the_source():
    base = dict(alpha=52.0, beta=52.0, max_budget=48, source="bench")
    measured = SpeedupCalibration(**base, full_latency_s=52.0, num_steps=50)
    driven = measured.with_scheduler_cost(0.0125)
    assert driven.source == "bench + scheduler 12.50 ms/step"
    assert driven.scheduler_fraction == pytest.approx(0.0125 * 50 / 52.0)
    assert driven.with_scheduler_cost(0.0125).scheduler_fraction == pytest.approx(2 * 0.0125 * 50 / 52.0)
    for partial in (dict(full_latency_s=52.0), dict(num_steps=50)):
        with pytest.raises(ValueError, match="needs a measured calibration"):
            SpeedupCalibration(**base, **partial).with_scheduler_cost(0.01)
    for bad in (math.nan, math.inf, "0.01", None):
        with pytest.raises(ValueError, match="must be a finite number >= 0"):
            measured.with_scheduler_cost(bad)
    assert measured.with_scheduler_cost(0) is measured


def test_attainable_speedups_cover_k_0_to_k_max():
    calib = SpeedupCalibration(alpha=52.0, beta=52.0, max_budget=48, source="test")
    speedups = calib.attainable_speedups()
    assert len(speedups) == 49 and speedups[0] == 1.0 and speedups[-1] == pytest.approx(13.0)
    assert np.all(np.diff(speedups) > 0)


def test_measured_points_rule_up_to_and_including_their_end_points():
    """Inside [K_first, K_last] (ends included) the curve comes from the points; outside, from the line."""
    calib = SpeedupCalibration(alpha=52.0, beta=50.0, max_budget=48, points=[[0, 1.0], [10, 0.75], [20, 0.5]])
    assert calib.speedup_of_budget(0) == 1.0 and calib.speedup_of_budget(20) == 2.0  # the line: 0.96x, 1.56x
    assert calib.speedup_of_budget(10) == pytest.approx(4 / 3)
    assert calib.speedup_of_budget(30) == pytest.approx(50 / 22)  # past the points: the line
    assert calib.budget_at(1.0) == 0.0 and calib.budget_at(2.0) == 20.0  # the line: 2 and 27
    assert calib.budget_at(4 / 3) == pytest.approx(10.0)
    assert calib.budget_at(2.5) == pytest.approx(52 - 50 / 2.5)


def test_fractional_budget_is_clipped_to_0_and_k_max_and_counts_the_scheduler():
    assert SpeedupCalibration(alpha=52.0, beta=52.0, max_budget=48).fractional_budget(1.0) == 0.0
    assert SpeedupCalibration(alpha=50.0, beta=52.0, max_budget=48).fractional_budget(1.0) == 0.0  # line: -2
    assert SpeedupCalibration(alpha=50.5, beta=52.0, max_budget=48).fractional_budget(1.0) == 0.0  # line: -1.5
    top = SpeedupCalibration(alpha=52.0, beta=52.0, max_budget=48)
    assert top.fractional_budget(top.speedup_range[1]) == 48.0
    measured = SpeedupCalibration(alpha=52.0, beta=52.0, max_budget=48, full_latency_s=52.0, num_steps=50)
    driven = measured.with_scheduler_cost(0.05)
    for target in (1.5, 3.0):
        assert driven.speedup_of_budget(driven.fractional_budget(target)) == pytest.approx(target)
        assert driven.fractional_budget(target) > measured.fractional_budget(target)


def test_dither_rounds_up_only_when_below_the_fraction():
    calib = SpeedupCalibration(alpha=52.0, beta=52.0, max_budget=48)
    assert calib.fractional_budget(2.0) == 26.0  # K* is an integer: every draw gives it
    assert [calib.budget_for_speedup(2.0, u) for u in (0.0, 0.5, 0.999)] == [26, 26, 26]
    frac = calib.fractional_budget(3.0) % 1  # 34.67
    assert calib.budget_for_speedup(3.0, 0.0) == 35 and calib.budget_for_speedup(3.0, frac + 1e-9) == 34
