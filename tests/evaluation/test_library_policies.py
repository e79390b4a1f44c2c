"""`benchmark.evaluate` given another library's own policy object, as that library's docs build it: each is scored
on the suite with nothing in between. Runs in the core venv (torchrl, tianshou, sb3, newest gymnasium)."""

import numpy as np
import pytest
import torch

from morca_env.evaluation import benchmark

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


def test_torchrl_masked_dqn_as_its_docs_build_it_needs_one_env_argument(env, tmp_path):
    """torchrl's documented masked DQN (GymEnv, ActionMask, QValueModule with action_mask_key, EGreedyModule,
    Collector, DQNLoss) trains on the paper's scalar state with one line of glue, `mask_dtype="bool"` (torchrl
    refuses an int8 mask), and its policy object is scored as it is."""
    pytest.importorskip("torchrl")
    from tensordict.nn import TensorDictModule, TensorDictSequential
    from torchrl.collectors import Collector
    from torchrl.envs import ActionMask, GymEnv, TransformedEnv
    from torchrl.modules import MLP, EGreedyModule, QValueModule
    from torchrl.objectives import DQNLoss

    torch.manual_seed(0)
    kwargs = {**benchmark.training_kwargs(TEST_ENV), "reference_cache_dir": str(tmp_path / "refs")}
    train_env = TransformedEnv(GymEnv(TEST_ENV, categorical_action_encoding=True, mask_dtype="bool",  # the glue
                                      **kwargs), ActionMask())
    assert train_env.observation_spec["action_mask"].dtype == torch.bool
    policy = TensorDictSequential(
        TensorDictModule(MLP(out_features=2, num_cells=[16]), in_keys=["scalars"], out_keys=["action_value"]),
        QValueModule(spec=train_env.action_spec, action_mask_key="action_mask"))
    explore = TensorDictSequential(policy, EGreedyModule(train_env.action_spec, eps_init=0.5,
                                                         action_mask_key="action_mask"))
    loss = DQNLoss(policy, action_space=train_env.action_spec)
    optim = torch.optim.Adam(loss.parameters(), lr=1e-3)
    collector = Collector(train_env, explore, frames_per_batch=20, total_frames=40)
    for batch in collector:
        optim.zero_grad()
        loss(batch.reshape(-1))["loss"].backward()
        optim.step()
    collector.shutdown()
    train_env.close()
    result = benchmark.evaluate(policy, TEST_ENV, env=env, targets=(2.0,), references=None, progress=False)
    assert all(r["projected"] == 0 for r in result.rows)  # its masked Q values only picked feasible actions
    assert result.rows and all(r["k"] == sum(r["schedule"]) for r in result.rows)


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


def test_a_tianshou_policy_and_its_algorithm_are_scored_through_flat_with_mask(env):
    pytest.importorskip("tianshou")
    import gymnasium as gym
    from tianshou.algorithm import DQN
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.utils.net.common import Net

    from morca_env.wrappers import FlatWithMask

    torch.manual_seed(0)
    flat = FlatWithMask(benchmark.training_env(TEST_ENV))
    net = Net(state_shape=flat.observation_space["obs"].shape, action_shape=2, hidden_sizes=[16])
    policy = DiscreteQLearningPolicy(model=net, action_space=gym.spaces.Discrete(2))
    algorithm = DQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3), gamma=1.0)
    for agent in (policy, algorithm):
        result = benchmark.evaluate(agent, TEST_ENV, env=env, targets=(2.0,), references=None, progress=False)
        assert len(result.rows) == 4 and all(r["projected"] == 0 for r in result.rows)  # masked: always feasible
