"""One flat observation layout everywhere: the replay buffer's, gymnasium's `FlattenObservation`, the networks'."""

import d3rlpy
import gymnasium as gym
import minari
import numpy as np
import pytest
import torch
from gymnasium.wrappers import FlattenObservation

from morca_env.data import collect_dataset, episode_options, to_replay_buffer
from morca_env.observation import (FLAT_KEYS, OBS_KEYS, as_flat, channels_of_flat, flat_size, observation_space,
                                   split_flat)
from tests.conftest import CHECKOUT

ENV_KWARGS = {"speedup": [1.5, 3.0], "lpips": False, "num_inference_steps": 10}
NOOP = d3rlpy.logging.NoopAdapterFactory()


@pytest.fixture
def dataset(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    monkeypatch.setenv("MORCA_CACHE_DIR", str(tmp_path / "cache"))
    return collect_dataset("test/tiny/flat-v0", "MorcaTinyRandom-v0", 3, env_kwargs=ENV_KWARGS,
                           behavior={"name": "threshold-curve"}, progress=False)


def test_flat_order_is_gymnasiums_and_splits_back():
    space = observation_space(3)
    assert FLAT_KEYS == tuple(space.spaces)  # gymnasium's Dict sorts its keys; flatten follows that order
    rng = np.random.default_rng(0)
    obs = {k: rng.normal(size=(2, *s.shape)).astype(np.float32) for k, s in space.spaces.items()}
    obs["action_mask"] = rng.integers(0, 2, size=(2, 2)).astype(np.int8)
    flat = as_flat(obs)
    assert flat.shape == (2, flat_size(3)) == (2, 3465)
    for row in range(2):
        assert np.array_equal(flat[row], gym.spaces.flatten(space, {k: v[row] for k, v in obs.items()}))
    parts = split_flat(torch.from_numpy(flat), channels_of_flat(flat.shape[1]))
    assert all(np.array_equal(parts[k].numpy(), obs[k]) for k in obs)
    with pytest.raises(ValueError, match="got 3466"):
        channels_of_flat(3466)


def test_buffer_rows_equal_flatten_observation_of_the_recovered_env(dataset):
    """Replaying a stored episode through FlattenObservation(recover_environment()) gives the buffer's rows."""
    buffer = to_replay_buffer(dataset)  # the default: flat
    env = dataset.recover_environment()
    assert env.observation_space == dataset.observation_space  # same dtypes (float16 features) and keys
    assert env.unwrapped.enforce_budget  # agents evaluated in the recovered env are held to their budget
    flat_env = FlattenObservation(env)
    meta = episode_options(dataset)[1]
    stored = buffer.episodes[1]
    obs, _ = flat_env.reset(options={"prompt": meta["prompt"], "seed": meta["seed"], "budget": meta["budget"]})
    seen = [obs]
    for action in stored.actions[:, 0]:
        obs, reward, done, _, _ = flat_env.step(int(action))
        seen.append(obs)
    assert done and reward == pytest.approx(float(stored.rewards[-1, 0]), abs=1e-4)
    assert np.array_equal(np.stack(seen[:-1]), stored.observations)


def test_algorithms_trained_on_the_default_buffer_act_through_flatten_observation(dataset):
    """Our DiscreteIQL and d3rlpy's own algorithms fit the default buffer and take FlattenObservation's inputs."""
    from agents import DiscreteIQLConfig, MorcaPolicy
    from agents.networks import MorcaEncoderFactory

    buffer = to_replay_buffer(dataset)
    encoder = MorcaEncoderFactory(features="")
    iql = DiscreteIQLConfig(batch_size=8, actor_encoder_factory=encoder, critic_encoder_factory=encoder,
                            value_encoder_factory=encoder).create(device="cpu")
    iql.fit(buffer, n_steps=4, n_steps_per_epoch=4, show_progress=False, logger_adapter=NOOP)
    bc = d3rlpy.algos.DiscreteBCConfig(batch_size=8).create(device="cpu")
    bc.fit(buffer, n_steps=4, n_steps_per_epoch=4, show_progress=False, logger_adapter=NOOP)

    env = dataset.recover_environment()
    policy = MorcaPolicy(iql)  # the dict-observation scheduler of a flat-trained algorithm
    assert policy.flat
    obs, _ = env.reset(seed=0)
    done = False
    while not done:
        flat = gym.spaces.flatten(env.observation_space, obs)  # what FlattenObservation(env) gives
        iql_action = int(iql.predict(flat[None])[0])
        assert obs["action_mask"][iql_action], "DiscreteIQL's masked policy picked an infeasible action"
        assert policy(obs) == iql_action
        assert int(bc.predict(flat[None])[0]) in (0, 1)
        obs, _, done, _, info = env.step(iql_action)
        assert not info["projected"]


def test_a_bad_feature_dtype_is_named_with_the_valid_ones():
    with pytest.raises(ValueError, match=r"feature_dtype='int8'; valid: float32, float16"):
        gym.make("MorcaTinyRandom-v0", feature_dtype="int8", lpips=False)
    env = gym.make("MorcaTinyRandom-v0", feature_dtype="float16", lpips=False)
    assert env.observation_space["pooled"].dtype == np.float16


def _docstrings():
    """(file, name, docstring) of every module, class and function of the package, the agents and the examples."""
    import ast

    for root in ("morca_env", "agents", "examples"):
        for path in sorted((CHECKOUT / root).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node)
                    if doc:
                        yield path.relative_to(CHECKOUT), getattr(node, "name", "<module>"), " ".join(doc.split())


def test_every_docstring_on_the_flat_order_points_to_its_one_home():
    """to_replay_buffer's docstring once gave [pooled, temporal, scalars, action_mask] while the code used FLAT_KEYS:
    the order now lives in morca_env.observation alone, and a docstring that speaks of it names FLAT_KEYS."""
    import re

    speaks = re.compile(r"flat\w*[^.]{0,80}\b(order|layout)\b|\b(order|layout)\b[^.]{0,80}flat", re.IGNORECASE)
    astray = [f"{path}:{name}" for path, name, doc in _docstrings() if speaks.search(doc) and "FLAT_KEYS" not in doc]
    assert not astray, f"docstrings on the flat order that do not name FLAT_KEYS: {astray}"
    # a docstring that lists all four parts lists them in the flat order or in the tuple form's (OBS_KEYS)
    listing = re.compile(r"\b(?:action_mask|pooled|scalars|temporal)(?:,\s*(?:action_mask|pooled|scalars|temporal)){3}")
    orders = [(f"{path}:{name}", [k.strip() for k in hit.group(0).split(",")])
              for path, name, doc in _docstrings() for hit in listing.finditer(doc)]
    assert orders, "no docstring lists the parts: the check below would pass on nothing"
    assert not [(where, keys) for where, keys in orders if keys not in (list(FLAT_KEYS), list(OBS_KEYS))]
    from morca_env.data import to_replay_buffer

    assert "FLAT_KEYS" in to_replay_buffer.__doc__


def test_a_scalars_track_dataset_flattens_to_the_mask_and_scalars_and_has_no_tuple_form(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    monkeypatch.setenv("MORCA_CACHE_DIR", str(tmp_path / "cache"))
    ds = collect_dataset("test/tiny/scalars-v0", "MorcaTinyRandom-v0", 2, env_kwargs={**ENV_KWARGS,
                         "observation": "scalars"}, behavior={"name": "threshold-curve"}, progress=False)
    ep = next(iter(ds.iterate_episodes()))
    assert set(ep.observations) == {"scalars", "action_mask"}
    assert set(ds.recover_environment().observation_space.spaces) == {"scalars", "action_mask"}
    buffer = to_replay_buffer(ds)
    first = buffer.episodes[0].observations
    assert first.shape == (10, 9)
    np.testing.assert_array_equal(first, np.concatenate([ep.observations["action_mask"][:10],
                                                         ep.observations["scalars"][:10]], axis=1))
    with pytest.raises(ValueError, match="observation='tuple' needs the full track"):
        to_replay_buffer(ds, observation="tuple")
    with pytest.raises(ValueError, match=r"track='full' needs \['pooled', 'temporal'\]"):
        to_replay_buffer(ds, track="full")
    full = collect_dataset("test/tiny/full-v0", "MorcaTinyRandom-v0", 2, env_kwargs=ENV_KWARGS,
                           behavior={"name": "threshold-curve"}, progress=False)
    np.testing.assert_array_equal(to_replay_buffer(full, track="scalars").episodes[1].observations,  # one dataset,
                                  to_replay_buffer(ds).episodes[1].observations)  # both tracks
    for mine, theirs in zip(ds.iterate_episodes(), full.iterate_episodes()):  # the same episodes, less the features
        np.testing.assert_array_equal(mine.actions, theirs.actions)
        np.testing.assert_array_equal(mine.rewards, theirs.rewards)
        np.testing.assert_array_equal(mine.observations["scalars"], theirs.observations["scalars"])


def test_d3rlpys_own_get_minari_loads_a_flat_dataset_but_misaligns_later_episodes_and_to_replay_buffer_does_not(
        tmp_path, monkeypatch):
    """d3rlpy's documented path, `datasets.get_minari(id)`, loads a flat dataset with no glue (its recovered env is
    the flat env), but d3rlpy 2.8.1 concatenates Minari's N + 1 observations per episode against N actions, so
    episode i starts i rows late: the docs send d3rlpy users to `to_replay_buffer(id)` (one line), aligned. An
    algorithm trained on either is scored on its own track (scalars), read from its observation shape."""
    import minari

    from morca_env.evaluation import benchmark

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    monkeypatch.setenv("MORCA_CACHE_DIR", str(tmp_path / "cache"))
    kwargs = {**ENV_KWARGS, "observation": "scalars", "flat": True}
    collect_dataset("test/tiny/scalars-flat-v0", "MorcaTinyRandom-v0", 3, env_kwargs=kwargs,
                    behavior={"name": "threshold-curve"}, progress=False)
    dict_form = collect_dataset("test/tiny/scalars-dict-v0", "MorcaTinyRandom-v0", 3, env_kwargs={
        **ENV_KWARGS, "observation": "scalars"}, behavior={"name": "threshold-curve"}, progress=False)
    stored = [ep.observations for ep in minari.load_dataset("test/tiny/scalars-flat-v0").iterate_episodes()]
    dataset, env = d3rlpy.datasets.get_minari("test/tiny/scalars-flat-v0")
    assert env.observation_space.shape == (9,) and len(dataset.episodes) == 3
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    env.close()
    np.testing.assert_array_equal(dataset.episodes[0].observations, stored[0][:-1])
    np.testing.assert_array_equal(dataset.episodes[1].observations[0], stored[0][-1])  # d3rlpy's shift
    buffer = to_replay_buffer("test/tiny/scalars-flat-v0")
    for episode, rows in zip(buffer.episodes, stored):
        np.testing.assert_array_equal(episode.observations, rows[:-1])  # aligned with the recorded actions
    np.testing.assert_array_equal(buffer.episodes[2].observations,  # the same episodes as the Dict form's
                                  to_replay_buffer(dict_form).episodes[2].observations)
    algo = d3rlpy.algos.DiscreteCQLConfig(batch_size=8).create(device="cpu")
    algo.fit(buffer, n_steps=4, n_steps_per_epoch=4, show_progress=False, logger_adapter=NOOP)
    result = benchmark.evaluate(algo, "MorcaTinyRandom-v0", targets=(2.0,), references=None, progress=False)
    assert result.observation == "scalars" and len(result.rows) == 4
