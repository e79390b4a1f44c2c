"""The study's arithmetic: the K allocation's dynamic programme is the exact optimum, and the class split keeps
training, validation and held-out prompts apart."""

import itertools

import numpy as np
import pytest

from class_headroom import class_pairs
from k_allocation import best_allocation, replay


@pytest.mark.parametrize("seed", range(6))
def test_the_allocation_is_the_brute_force_optimum(seed):
    rng = np.random.default_rng(seed)
    budgets = [3, 4, 5, 7]
    psnr = np.sort(rng.normal(30, 3, (4, len(budgets))), axis=1)[:, ::-1]  # more reuse, lower PSNR
    total = int(rng.integers(4 * 3, 4 * 7 + 1))
    feasible = [c for c in itertools.product(range(len(budgets)), repeat=4) if sum(budgets[j] for j in c) == total]
    if not feasible:
        with pytest.raises(ValueError):
            best_allocation(psnr, budgets, total)
        return
    best = max(sum(psnr[i, j] for i, j in enumerate(c)) for c in feasible)
    value, chosen = best_allocation(psnr, budgets, total)
    assert value == pytest.approx(best)
    assert sum(chosen) == total and replay(psnr, budgets, chosen) == pytest.approx(best)


def test_the_same_k_is_the_optimum_when_every_video_has_the_same_concave_curve():
    budgets = list(range(10, 21))
    curve = -0.05 * (np.array(budgets) - 10.0) ** 2  # concave: spreading reuses evenly is best
    value, chosen = best_allocation(np.tile(curve, (6, 1)), budgets, 6 * 15)
    assert list(chosen) == [15] * 6 and value == pytest.approx(6 * curve[5])


@pytest.mark.parametrize("env_id, classes", [("MorcaScenes-v0", 8), ("MorcaTiny-v0", 9)])
def test_class_splits_are_disjoint_and_held_out(env_id, classes):
    from morca_env.prompts import evaluation_prompts

    split = class_pairs(env_id, 12, 8, 20)
    assert len(split) == classes
    held_out = evaluation_prompts()
    fitted = {p for g in split.values() for p, _ in g["train"] + g["validate"]}
    for groups in split.values():
        train, validate, evaluate = ({p for p, _ in groups[k]} for k in ("train", "validate", "eval"))
        assert len(train) == 12 and len(validate) == 8 and len(groups["eval"]) == 20
        assert not train & validate and not (train | validate) & held_out
        assert not evaluate & fitted  # a held-out pair's prompt never fitted or validated any class
        if env_id == "MorcaScenes-v0":
            assert evaluate <= held_out  # its evaluation suite holds 30 of each class
