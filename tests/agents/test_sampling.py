"""TransitionSampler gives bitwise d3rlpy's batches from the same np.random state, and the updates that follow."""

import d3rlpy
import numpy as np
import pytest
from d3rlpy.constants import ActionSpace
from d3rlpy.dataset import Episode, FIFOBuffer, InfiniteBuffer, ReplayBuffer, SparseRewardTransitionPicker

from agents.iql import DiscreteIQLConfig
from agents.networks import MorcaEncoderFactory
from agents.sampling import TransitionSampler
from agents.training import batch_source, make_buffer, run_updates
from morca_env.data import transition_picker

FIELDS = ("actions", "rewards", "next_actions", "terminals", "intervals")


def random_episodes(rng, count: int, tuple_obs: bool, terminated: bool = True) -> list[Episode]:
    """Episodes of different lengths with a reward at every step (a sum in the wrong order or range shows)."""
    episodes = []
    for _ in range(count):
        n = int(rng.integers(2, 9))
        obs = ([rng.normal(size=(n, 3)).astype(np.float32), rng.normal(size=(n, 2, 2)).astype(np.float32)]
               if tuple_obs else rng.normal(size=(n, 4)).astype(np.float32))
        episodes.append(Episode(observations=obs, actions=rng.integers(0, 2, (n, 1)),
                                rewards=rng.normal(size=(n, 1)).astype(np.float32), terminated=terminated))
    return episodes


def assert_same_batch(ours, theirs):
    for name in FIELDS:
        a, b = getattr(ours, name), getattr(theirs, name)
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), name
    for field in ("observations", "next_observations"):
        a, b = getattr(ours, field), getattr(theirs, field)
        a, b = (a, b) if isinstance(b, list) else ([a], [b])
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), field


@pytest.mark.parametrize("n_step", [1, 3, 50])
@pytest.mark.parametrize("tuple_obs", [True, False])
@pytest.mark.parametrize("terminated", [True, False])
def test_batches_equal_d3rlpys_from_the_same_seed(n_step, tuple_obs, terminated):
    rng = np.random.default_rng(n_step)
    buffer = ReplayBuffer(InfiniteBuffer(), episodes=random_episodes(rng, 7, tuple_obs, terminated),
                          action_space=ActionSpace.DISCRETE, action_size=2, transition_picker=transition_picker(n_step))
    sampler = TransitionSampler(buffer)
    assert sampler.transition_count == buffer.transition_count
    for seed in range(3):
        np.random.seed(seed)
        theirs, their_next_draw = buffer.sample_transition_batch(64), np.random.randint(1 << 30)
        np.random.seed(seed)
        ours, our_next_draw = sampler.sample(64), np.random.randint(1 << 30)
        assert_same_batch(ours, theirs)
        assert our_next_draw == their_next_draw  # the same draws consumed: later batches stay equal too
    assert ours.terminals.any() == terminated  # episodes of 2..8 steps: n_step 50 makes every return terminal
    if terminated and n_step < 8:
        assert not ours.terminals.all()
    if n_step > 1:
        assert (ours.intervals > 1).any()


def test_other_pickers_and_buffers_are_refused_with_the_way_out():
    rng = np.random.default_rng(0)
    sparse = ReplayBuffer(InfiniteBuffer(), episodes=random_episodes(rng, 2, False), action_space=ActionSpace.DISCRETE,
                          action_size=2, transition_picker=SparseRewardTransitionPicker(failure_return=0))
    with pytest.raises(TypeError, match="SparseRewardTransitionPicker.*sample_transition_batch"):
        TransitionSampler(sparse)
    fifo = ReplayBuffer(FIFOBuffer(100), episodes=random_episodes(rng, 2, False), action_space=ActionSpace.DISCRETE,
                        action_size=2)
    with pytest.raises(TypeError, match="FIFOBuffer"):
        TransitionSampler(fifo)


def tiny_iql():
    encoder = MorcaEncoderFactory(features="")
    return DiscreteIQLConfig(batch_size=16, actor_encoder_factory=encoder, critic_encoder_factory=encoder,
                             value_encoder_factory=encoder).create(device="cpu")


def scalar_state_episodes(rng, count: int) -> list[Episode]:
    episodes = []
    for _ in range(count):
        n = int(rng.integers(3, 8))
        obs = [np.zeros((n, 3, 4, 8, 8), np.float32), np.zeros((n, 6, 8, 8), np.float32),
               rng.random((n, 7)).astype(np.float32), np.ones((n, 2), np.float32)]
        rewards = np.zeros((n, 1), np.float32)
        rewards[-1] = rng.normal(25, 3)
        episodes.append(Episode(observations=obs, actions=rng.integers(0, 2, (n, 1)), rewards=rewards, terminated=True))
    return episodes


def test_run_updates_trains_the_same_networks_from_either_source():
    buffer = make_buffer(scalar_state_episodes(np.random.default_rng(1), 12), n_step=50)
    metrics = []
    for make in (lambda algo: buffer, lambda algo: batch_source(buffer, algo)):
        d3rlpy.seed(0)
        algo = tiny_iql()
        algo.build_with_dataset(buffer)
        batches = make(algo)
        metrics.append(run_updates(algo, batches, 4, progress=False))
    assert isinstance(batches, TransitionSampler)
    assert metrics[0] == metrics[1] and metrics[0]["q_loss"] > 0


def test_batch_source_keeps_d3rlpys_batches_for_algorithms_that_read_returns_to_go():
    buffer = make_buffer(scalar_state_episodes(np.random.default_rng(2), 3))

    class NeedsReturnsToGo:
        need_returns_to_go = True

    assert batch_source(buffer, NeedsReturnsToGo()) is buffer
    assert isinstance(batch_source(buffer, tiny_iql()), TransitionSampler)
