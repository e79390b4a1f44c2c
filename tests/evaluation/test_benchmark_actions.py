"""`benchmark.evaluate` scores only what a policy really returned: one parser, strict, naming the policy."""

import numpy as np
import pytest

from morca_env.evaluation import benchmark
from morca_env.evaluation.benchmark import CallablePolicy


@pytest.mark.parametrize("returned", ["1", 0.9, 1.7, True, np.array([1, 0, 0]), float("nan"), float("inf"), "x", [],
                                      None, {"action": 1}, np.float32(1.0)])
def test_a_policy_returning_anything_but_0_or_1_is_named_not_coerced(returned):
    policy = CallablePolicy(lambda obs: returned, name="my-agent")
    with pytest.raises(ValueError, match=r"policy 'my-agent' returned .*valid actions: 0 \(recompute\) or 1 \(reuse\)"):
        policy({"action_mask": np.array([1, 1], np.int8)})


@pytest.mark.parametrize("returned", [1, np.int64(0), np.array(1), np.array([0]), np.array([[1]])])
def test_integer_actions_in_any_container_of_one_are_taken(returned):
    assert CallablePolicy(lambda obs: returned)({}) in (0, 1)


def test_evaluate_refuses_a_fractional_action_instead_of_scoring_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MORCA_CACHE_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="returned 0.9"):
        benchmark.evaluate(lambda obs: 0.9, "MorcaTinyRandom-v0", references=None, progress=False, pair_step=4)
