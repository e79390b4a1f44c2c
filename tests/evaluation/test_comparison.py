"""Paired comparisons: matched episodes at a rule's own K, and PSNR at equal measured speedup."""

import pytest

from morca_env.evaluation.comparison import (at_speedup, equal_speedup_difference, equal_speedup_table, matched_label,
                                  pending_matched, speedup_curve)


def row(method, target, index, psnr, speedup, k=10):
    return {"method": method, "target": target, "prompt_index": index, "psnr": psnr, "num_reuse": k,
            "stock_latency_s": 1.0, "latency_s": 1.0 / speedup}


def test_pending_matched_lists_each_own_k_episode_once_per_baseline_at_its_k():
    rows = [row("rule", 2.0, 0, 30, 2.0, k=7), row("rule", 2.0, 1, 30, 2.0, k=9), row("uniform", 2.0, 0, 30, 2.0),
            row(matched_label("uniform", "rule"), 2.0, 0, 31, 2.0, k=7)]
    todo = pending_matched(rows, {"rule"}, ["uniform", "best-fixed"])
    # each at the rule episode's K, with its stock timing (nothing is timed again for a matched episode)
    assert sorted(todo) == [(2.0, 0, ("best-fixed@rule", "best-fixed", 7, 1.0)),
                            (2.0, 1, ("best-fixed@rule", "best-fixed", 9, 1.0)),
                            (2.0, 1, ("uniform@rule", "uniform", 9, 1.0))]


def test_psnr_is_interpolated_along_the_methods_own_speedup_curve():
    rows = [row("m", 2.0, 0, 30.0, 1.8), row("m", 2.5, 0, 26.0, 2.2), row("m", 3.0, 0, 20.0, 3.2),
            row("m", 2.0, 1, 32.0, 1.8), row("m", 2.5, 1, 28.0, 2.2), row("m", 3.0, 1, 22.0, 3.2)]
    curve = speedup_curve(rows, "m")
    assert [x for x, _ in curve] == pytest.approx([1.8, 2.2, 3.2])
    assert at_speedup(curve, 2.0) == pytest.approx({0: 28.0, 1: 30.0})  # halfway between 1.8 and 2.2
    assert at_speedup(curve, 2.7) == pytest.approx({0: 23.0, 1: 25.0})  # second segment
    assert at_speedup(curve, 3.3) == pytest.approx({0: 20.0, 1: 22.0})  # beyond the end, within 0.1x: the end's
    assert at_speedup(curve, 1.75) == pytest.approx({0: 30.0, 1: 32.0})
    assert at_speedup(curve, 3.5) is None and at_speedup(curve, 1.6) is None
    assert at_speedup(speedup_curve(rows[:1], "m"), 1.85) == {0: 30.0}  # one point: only next to it


def test_equal_speedup_charges_a_slower_method_in_speed():
    # the same PSNR at the same targets, but "slow" runs at 0.8x the speed: at equal speedup it loses
    rows = []
    for index in range(3):
        for target, psnr, speed in ((2.0, 30.0, 2.0), (3.0, 24.0, 3.0)):
            rows.append(row("fast", target, index, psnr + index, speed))
            rows.append(row("slow", target, index, psnr + index, 0.8 * speed))
    mean, (diff, _, ci, n) = equal_speedup_difference(rows, "slow", "fast", 2.4)
    assert n == 3 and diff == pytest.approx(24.0 - 27.6) and ci == pytest.approx(0.0, abs=1e-9)  # slow: its 3x point; fast: 2/5 of the way from 30 to 24
    assert equal_speedup_difference(rows, "slow", "fast", 3.0) is None  # slow never gets near 3x
    lines = equal_speedup_table(rows, ["fast", "slow"], "fast", [2.0, 3.0])
    assert lines[2].startswith("| fast | 31.00 / - | 25.00 / -")
    assert "not reached (1.60-2.40x)" in lines[3]


def test_same_k_table_compares_an_own_k_method_with_the_baseline_at_its_k():
    from morca_env.evaluation.comparison import same_k_table

    rows = [row("base", 2.0, i, 30.0 + i, 2.0, k=10) for i in range(2)]
    rows += [row("rule", 2.0, i, 29.0 + i, 2.0, k=8) for i in range(2)]  # own K 8: 1 dB below base at K 10
    rows += [row(matched_label("base", "rule"), 2.0, i, 28.0 + i, 2.0, k=8) for i in range(2)]  # base at K 8
    lines = same_k_table(rows, ["base", "rule"], "base", [2.0], own_k={"rule"})
    assert lines[2] == "| base | 10.0 / 30.50 / - |"
    assert lines[3] == "| rule | 8.0 / 29.50 / +1.00 ± 0.00 (own K) |"  # against the matched episodes, not base
