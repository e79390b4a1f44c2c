"""`benchmark.evaluate` given another library's own policy object, as that library's docs build it: each is scored
on the suite with nothing in between. Runs in the core venv (torchrl, tianshou, newest gymnasium)."""

import numpy as np
import pytest
import torch

from morca_env import benchmark

TEST_ENV = "MorcaTinyRandom-v0"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    env = benchmark.make_env(TEST_ENV, reference_cache_dir=str(tmp_path_factory.mktemp("refs")))
    yield env
    env.close()


def test_a_torchrl_actor_is_scored_from_the_observation_keys(env):
    tensordict = pytest.importorskip("tensordict")  # torchrl's core: installed beside torchrl (the core CI venv)
    from tensordict.nn import TensorDictModule

    class Reuse(torch.nn.Module):  # reads the mask, writes a categorical action: reuse where feasible
        def forward(self, mask):
            return (mask[..., 1] > 0).long()

    actor = TensorDictModule(Reuse(), in_keys=["action_mask"], out_keys=["action"])
    assert isinstance(actor, tensordict.nn.TensorDictModuleBase)
    result = benchmark.evaluate(actor, TEST_ENV, env=env, targets=(2.0,), references=None, progress=False)
    assert all(r["projected"] == 0 for r in result.rows)  # it only asked for feasible actions
    assert all(r["k"] == sum(r["schedule"]) > 0 for r in result.rows)


def test_a_one_hot_torchrl_action_is_read_as_its_index(env):
    pytest.importorskip("tensordict")
    from tensordict.nn import TensorDictModule

    class Recompute(torch.nn.Module):  # torchrl's default one-hot encoding of a Discrete(2) action
        def forward(self, mask):
            return torch.tensor([1, 0]).expand(*mask.shape[:-1], 2)

    actor = TensorDictModule(Recompute(), in_keys=["action_mask"], out_keys=["action"])
    result = benchmark.evaluate(actor, TEST_ENV, env=env, targets=(2.0,), references=None, progress=False)
    # always recompute: the env forces exactly the reuses the budget needs, at the end
    assert all(r["projected"] == r["k"] for r in result.rows)
    assert np.mean([r["k"] for r in result.rows]) > 0
