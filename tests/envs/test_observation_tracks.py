"""The observation tracks (`observation="full"` or `"scalars"`) and the flat form (`flat=True`): the same episode,
seen through each, in the single and the vector env."""

import gymnasium as gym
import numpy as np
import pytest

import morca_env  # noqa: F401
from morca_env.observation import SCALARS_FLAT_SIZE, flat_size, observation_space, present, track_of_flat_size

TEST_ENV = "MorcaTinyRandom-v0"
OPTIONS = {"prompt": "a red circle", "seed": 3}


def play(env, actions=None):
    """Every observation of one episode (reuse where feasible unless `actions`)."""
    obs, _ = env.reset(options=OPTIONS)
    seen, step, done = [obs], 0, False
    while not done:
        mask = env.unwrapped.action_masks()
        action = int(mask[1]) if actions is None else actions[step]
        obs, _, done, _, info = env.step(action)
        seen.append(obs)
        step += 1
    return seen, info


@pytest.fixture(scope="module")
def full_episode(tmp_path_factory):
    env = gym.make(TEST_ENV, speedup=2.0, lpips=False, reference_cache_dir=str(tmp_path_factory.mktemp("refs")))
    seen, info = play(env)
    space = env.observation_space
    env.close()
    return seen, info, space


@pytest.mark.parametrize("flat", [False, True])
def test_the_scalars_track_is_the_full_states_scalars_and_mask_without_latent_features(full_episode, flat, tmp_path):
    seen, info, _ = full_episode
    env = gym.make(TEST_ENV, speedup=2.0, lpips=False, observation="scalars", flat=flat,
                   reference_cache_dir=str(tmp_path))
    assert env.unwrapped.latent_features is False  # the cheaper env: no features computed
    mine, my_info = play(env)
    assert my_info["schedule"] == info["schedule"] and my_info["psnr"] == info["psnr"]
    for full, obs in zip(seen, mine):
        assert env.observation_space.contains(obs)
        if flat:  # gymnasium's flatten of the track's Dict space: the mask first, then the seven scalars
            assert obs.shape == (SCALARS_FLAT_SIZE,) and obs.dtype == np.float32
            np.testing.assert_array_equal(obs[:2], full["action_mask"])
            np.testing.assert_array_equal(obs[2:], full["scalars"])
        else:
            assert set(obs) == {"scalars", "action_mask"}
            np.testing.assert_array_equal(obs["scalars"], full["scalars"])
            np.testing.assert_array_equal(obs["action_mask"], full["action_mask"])
    env.close()


def test_the_flat_full_track_is_gymnasiums_flatten_of_the_dict(full_episode, tmp_path):
    seen, _, space = full_episode
    env = gym.make(TEST_ENV, speedup=2.0, lpips=False, flat=True, reference_cache_dir=str(tmp_path))
    mine, _ = play(env)
    assert env.observation_space.shape == (flat_size(3),)
    for full, obs in zip(seen, mine):
        np.testing.assert_array_equal(obs, gym.spaces.flatten(space, full).astype(np.float32))
    env.close()


@pytest.mark.parametrize("observation,flat", [("scalars", False), ("scalars", True), ("full", True)])
def test_the_vector_env_gives_each_track_as_the_single_env_does(observation, flat, tmp_path):
    kwargs = dict(speedup=2.0, lpips=False, observation=observation, flat=flat, reference_cache_dir=str(tmp_path))
    single = gym.make(TEST_ENV, **kwargs)
    seen, _ = play(single, actions=[0] * 100)
    vec = gym.make_vec(TEST_ENV, num_envs=2, vectorization_mode="vector_entry_point", **kwargs)
    assert vec.single_observation_space == single.observation_space
    obs, _ = vec.reset(options=OPTIONS)
    for step in range(len(seen) - 1):
        assert vec.observation_space.contains(obs)
        row = obs[1] if flat else {k: v[1] for k, v in obs.items()}
        expected = seen[step]
        if flat:
            np.testing.assert_allclose(row, expected, rtol=1e-5, atol=1e-6)
        else:
            assert set(row) == set(expected)
            for key in expected:
                np.testing.assert_allclose(row[key], expected[key], rtol=1e-5, atol=1e-6)
        obs, *_ = vec.step(np.zeros(2, dtype=np.int64))
    vec.close()
    single.close()


def test_bad_track_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="observation='pixels'; valid: 'full', 'scalars'"):
        gym.make(TEST_ENV, observation="pixels")
    with pytest.raises(ValueError, match="latent_features=True with observation='scalars'"):
        gym.make(TEST_ENV, observation="scalars", latent_features=True)
    with pytest.raises(TypeError, match="flat=1 must be True or False"):
        gym.make(TEST_ENV, flat=1)


def test_present_and_the_spaces_agree_on_every_track():
    space = observation_space(3)
    full = space.sample()
    for observation in ("full", "scalars"):
        for flat in (False, True):
            shown = present(full, observation, flat)
            assert observation_space(3, observation=observation, flat=flat).contains(
                shown.astype(np.float32) if flat else shown)
            if flat:
                assert track_of_flat_size(shown.size) == observation
