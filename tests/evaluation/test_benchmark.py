"""The scoring protocol: same K for every method, paired to shipped references, normalized 0 (random) .. 100 (best fixed)."""

import copy

import gymnasium as gym

import numpy as np
import pytest
import torch

import morca_env  # noqa: F401
from morca_env.evaluation import benchmark
from morca_env import schedulers
from morca_env.prompts import get_suite

TEST_ENV = "MorcaTinyRandom-v0"  # the protocol check's suite: 4 pairs x 2 targets at 10 steps


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    env = benchmark.make_env(TEST_ENV, reference_cache_dir=str(tmp_path_factory.mktemp("refs")))
    refs = benchmark.measure_references(TEST_ENV, env=env, best_fixed=schedulers.make("uniform", env), progress=False)
    yield env, refs
    env.close()


def test_the_references_score_0_and_100_and_every_method_plays_their_k(setup):
    env, refs = setup
    random_again = benchmark.evaluate(schedulers.make("random", env, seed=0), TEST_ENV, env=env, references=refs,
                                      progress=False)
    uniform = benchmark.evaluate(schedulers.make("uniform", env), TEST_ENV, env=env, references=refs, progress=False)
    for target, entry in refs["targets"].items():
        assert entry["random"]["mean_psnr"] < entry["best-fixed"]["mean_psnr"]
    for s in random_again.scores.values():
        assert s.normalized == pytest.approx(0.0, abs=1e-9)
    for s in uniform.scores.values():
        assert s.normalized == pytest.approx(100.0) and s.vs_best_fixed == pytest.approx(0.0)
        assert s.vs_best_fixed_ci == (pytest.approx(0.0), pytest.approx(0.0)) and s.episodes == 4
    greedy = benchmark.evaluate(lambda obs: 1, TEST_ENV, env=env, references=refs, progress=False, name="greedy")
    for method in (random_again, uniform, greedy):
        ks = {t: [r["k"] for r in method.rows if r["target"] == t] for t in (2.0, 3.0)}
        assert ks == {t: refs["targets"][f"{t:g}"]["k"] for t in (2.0, 3.0)}  # the same K, episode by episode
        assert all(sum(r["schedule"]) == r["k"] for r in method.rows)
    by_target = {t: [r for r in greedy.rows if r["target"] == t] for t in (2.0, 3.0)}
    for target, s in greedy.scores.items():
        best = np.array(refs["targets"][f"{target:g}"]["best-fixed"]["psnr"])
        diffs = np.array([r["psnr"] for r in by_target[target]]) - best
        assert s.vs_best_fixed == pytest.approx(diffs.mean())
        assert s.vs_best_fixed_ci[0] < s.vs_best_fixed < s.vs_best_fixed_ci[1]
        rand = refs["targets"][f"{target:g}"]["random"]["mean_psnr"]
        assert s.normalized == pytest.approx(100 * (s.psnr - rand) / (best.mean() - rand))
    assert "| 2x |" in greedy.table() and "greedy on MorcaTinyRandom-v0" in greedy.table()
    # always-reuse is overridden wherever the budget runs out: the table says how often, per episode
    for target, s in greedy.scores.items():
        overridden = np.mean([r["projected"] for r in by_target[target]])
        assert overridden > 0 and s.projected_per_episode == pytest.approx(overridden)
        assert f"| {overridden:.1f} |" in greedy.table().splitlines()[4 + list(greedy.scores).index(target)]
    assert all(s.projected_per_episode == 0 for s in uniform.scores.values())


def test_stale_references_and_an_unbounded_env_are_refused(setup, tmp_path):
    env, refs = setup
    stale = copy.deepcopy(refs)
    stale["targets"]["3"]["k"][1] += 1
    with pytest.raises(RuntimeError, match=r"measured at K=\d+ for target 3, pair 1; this env gives K=\d+"):
        benchmark.evaluate(schedulers.make("uniform", env), TEST_ENV, env=env, references=stale, progress=False)
    other_suite = {**refs, "suite": "tiny-eval[:5]"}
    with pytest.raises(ValueError, match=r"references are for 'MorcaTinyRandom-v0' on 'tiny-eval\[:5\]'"):
        benchmark.evaluate(lambda obs: 0, TEST_ENV, env=env, references=other_suite, progress=False)
    free = benchmark.make_env(TEST_ENV, enforce_budget=False, pipeline=env.unwrapped.pipe,
                              reference_cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="budget-enforcing env"):
        benchmark.evaluate(lambda obs: 0, TEST_ENV, env=free, references=None, progress=False)
    with pytest.raises(ValueError, match=r"no benchmark suite for env_id='CartPole-v1'; suites: MorcaTiny-v0"):
        benchmark.evaluate(lambda obs: 0, "CartPole-v1")
    with pytest.raises(ValueError, match=r"targets \[4.0\] are not in the MorcaTinyRandom-v0 suite's \[2.0, 3.0\]"):
        benchmark.evaluate(lambda obs: 0, TEST_ENV, env=env, targets=(4.0,))
    with pytest.raises(TypeError, match="cannot score int"):
        benchmark.as_policy(3)


def test_a_torch_module_is_scored_on_the_flat_observation_with_the_mask(setup):
    env, _ = setup
    seen = []

    class Prefers(torch.nn.Module):  # always scores reuse higher: the mask must turn it into recomputes
        def forward(self, x):
            seen.append(x.shape)
            return torch.tensor([[0.0, 1.0]]).expand(len(x), 2)

    result = benchmark.evaluate(Prefers(), TEST_ENV, env=env, targets=(2.0,), references=None, progress=False)
    assert seen[0] == (1, gym.spaces.flatdim(env.observation_space))  # one flat observation per call
    assert all(r["projected"] == 0 for r in result.rows)  # masked argmax: never an infeasible action
    assert result.scores[2.0].normalized is None and result.mean_normalized is None


def test_the_shipped_tiny_references_match_the_suite_and_the_env_calibration():
    suite = benchmark.suite_of("MorcaTiny-v0")
    refs = benchmark.load_references("MorcaTiny-v0")  # raises if they were made on another suite
    assert refs is not None and set(refs["targets"]) == {f"{t:g}" for t in suite.targets}
    train = set(get_suite("tiny-train").prompts)
    assert not train & {p for p, _ in suite.pairs()}  # held out from every training and fitting prompt
    env = benchmark.make_env("MorcaTiny-v0")
    for target in suite.targets:
        entry = refs["targets"][f"{target:g}"]
        assert len(entry["k"]) == len(suite.pairs()) == 40
        assert entry["k"] == [env.unwrapped.budget_for_speedup(target, seed) for _, seed in suite.pairs()]
        assert entry["random"]["mean_psnr"] + 2.0 < entry["best-fixed"]["mean_psnr"]
        assert benchmark.reference_scores("MorcaTiny-v0", target) == (entry["random"]["mean_psnr"],
                                                                      entry["best-fixed"]["mean_psnr"])
    env.close()


def test_the_shipped_references_replay(tmp_path):
    """Two of the shipped episodes, played again here: the same PSNR (the references are what the env gives)."""
    refs = benchmark.load_references("MorcaTiny-v0")
    env = benchmark.make_env("MorcaTiny-v0", reference_cache_dir=str(tmp_path))
    suite = benchmark.suite_of("MorcaTiny-v0")
    rows = benchmark.play(schedulers.make("best-fixed", env), env, benchmark.Suite(
        suite.env_id, "tiny-eval[5:6]", (3.0,), suite.env_kwargs), progress=False)
    assert rows[0]["psnr"] == pytest.approx(refs["targets"]["3"]["best-fixed"]["psnr"][1], abs=0.05)
    rows = benchmark.play(schedulers.make("random", env, seed=0), env, benchmark.Suite(
        suite.env_id, "tiny-eval[0:1]", (2.0,), suite.env_kwargs), progress=False)
    assert rows[0]["psnr"] == pytest.approx(refs["targets"]["2"]["random"]["psnr"][0], abs=0.05)
    env.close()


def test_datasets_at_a_shipped_target_get_minaris_reference_scores():
    refs = benchmark.load_references("MorcaTiny-v0")
    low, high = benchmark.reference_returns("MorcaTiny-v0", {"speedup": 2.5, "prompts": "tiny-train", "lpips": False},
                                            r_max=50.0)
    assert low == pytest.approx(np.mean(np.minimum(refs["targets"]["2.5"]["random"]["psnr"], 50.0))) and low < high
    assert benchmark.reference_returns("MorcaTiny-v0", {"speedup": 2.5}, r_max=20.0)[1] <= 20.0  # returns, capped
    for kwargs in ({"speedup": [2.0, 3.0]}, {"speedup": 2.2}, {"budget": 30}, {"speedup": 2.5, "num_inference_steps": 20}):
        assert benchmark.reference_returns("MorcaTiny-v0", kwargs, r_max=50.0) is None, kwargs
    assert benchmark.reference_returns("MorcaWan21-v0", {"speedup": 3.0}, r_max=40.0) is None  # none measured


def test_a_batched_env_scores_the_same_episodes(setup, tmp_path):
    """make_env(..., num_envs=3): the suite's 8 episodes play 3 at a time (the last batch padded), each batch slot
    with its own copy of the scheduler; the rows equal the single env's up to float32 rounding."""
    env, refs = setup
    batched = benchmark.make_env(TEST_ENV, num_envs=3, pipeline=env.unwrapped.pipe,
                                 reference_cache_dir=str(tmp_path))
    for policy in (schedulers.make("uniform", env), lambda obs: 1):
        single = benchmark.evaluate(policy, TEST_ENV, env=env, references=refs, progress=False)
        together = benchmark.evaluate(policy, TEST_ENV, env=batched, references=refs, progress=False)
        assert len(together.rows) == len(single.rows) == 8
        for a, b in zip(single.rows, together.rows):
            assert (a["target"], a["index"], a["k"], a["schedule"]) == (b["target"], b["index"], b["k"], b["schedule"])
            assert abs(a["psnr"] - b["psnr"]) < 1e-2  # uint8 levels flipped by rounding (test_vector_env.REWARD_DB)
    batched.close()


@pytest.mark.parametrize("env_id", ["MorcaTiny-v0", "MorcaScenes-v0", "MorcaTinyRandom-v0"])
def test_the_training_env_draws_from_a_fixed_pool_so_references_are_reused(env_id, tmp_path):
    suite = benchmark.suite_of(env_id)
    pool = set(get_suite(suite.train_pool).pairs())
    assert 200 <= len(pool) and not {p for p, _ in pool} & {p for p, _ in suite.pairs()}  # spread, and held apart
    if env_id != "MorcaTinyRandom-v0":
        return  # the pools of the real testbeds: what is drawn is checked on the test model below
    env = benchmark.training_env(env_id, reference_cache_dir=str(tmp_path))
    drawn = []
    for seed in range(5):
        _, info = env.reset(seed=seed)
        drawn.append((info["prompt"], info["seed"]))
    assert set(drawn) <= pool
    _, info = env.reset(options={"prompt": drawn[0][0], "seed": drawn[0][1]})
    assert not info["reference_generated"]  # the redrawn pair's reference came from the cache
    assert len([f for f in tmp_path.rglob("*") if f.is_file()]) <= len(set(drawn))  # one reference per pair


def test_an_sb3_model_trained_on_flatten_observation_is_scored_with_the_env_flattened_alike(setup):
    sb3 = pytest.importorskip("stable_baselines3")  # an extra (`[sb3]`): skipped in the core CI venv
    env, _ = setup
    flat_env = gym.wrappers.FlattenObservation(benchmark.training_env(TEST_ENV))
    model = sb3.DQN("MlpPolicy", flat_env, learning_starts=0, buffer_size=100, seed=0, device="cpu")
    seen = []
    predict = model.predict
    model.predict = lambda x, **kw: (seen.append(np.asarray(x).shape), predict(x, **kw))[1]
    result = benchmark.evaluate(model, TEST_ENV, env=env, targets=(2.0,), references=None, progress=False)
    assert seen and set(seen) == {flat_env.observation_space.shape} and len(result.rows) == 4
    obs, _ = env.reset(seed=0)
    assert np.array_equal(gym.spaces.flatten(env.observation_space, obs),
                          benchmark.as_flat({k: v[None] for k, v in obs.items()})[0])  # FlattenObservation's order



def test_the_scalars_track_plays_the_same_episodes_and_references_as_the_full_track(setup, tmp_path):
    """A policy of the scalars alone scores the same on both tracks (only what it sees differs, not the episodes
    or K), and the result says which track it played."""
    env, refs = setup

    def reuse_late(obs):  # reads only the scalars track's keys
        return int(obs["action_mask"][1] and obs["scalars"][2] < 0.5)

    seen = []
    full = benchmark.evaluate(reuse_late, TEST_ENV, env=env, references=refs, progress=False)
    scalars = benchmark.evaluate(lambda obs: (seen.append(set(obs)), reuse_late(obs))[1], TEST_ENV, references=refs,
                                 progress=False, observation="scalars")
    assert seen and all(keys == {"scalars", "action_mask"} for keys in seen)
    assert (full.observation, scalars.observation) == ("full", "scalars")
    assert "scalars observation track" in scalars.table()
    assert [r["psnr"] for r in scalars.rows] == [r["psnr"] for r in full.rows]
    assert [r["k"] for r in scalars.rows] == [r["k"] for r in full.rows]
    with pytest.raises(ValueError, match="the env given is on the 'full' track"):
        benchmark.evaluate(reuse_late, TEST_ENV, env=env, references=refs, progress=False, observation="scalars")
    with pytest.raises(ValueError, match="observation='tiny'; valid: 'full', 'scalars'"):
        benchmark.evaluate(reuse_late, TEST_ENV, references=refs, progress=False, observation="tiny")


def test_an_sb3_model_trained_on_the_flat_scalars_track_is_scored_on_it_with_no_argument(setup):
    sb3 = pytest.importorskip("stable_baselines3")
    model = sb3.DQN("MlpPolicy", benchmark.training_env(TEST_ENV, observation="scalars", flat=True),
                    learning_starts=0, buffer_size=100, seed=0, device="cpu")
    assert benchmark.policy_track(model) == "scalars"
    result = benchmark.evaluate(model, TEST_ENV, targets=(2.0,), references=None, progress=False)
    assert result.observation == "scalars" and len(result.rows) == 4
    with pytest.raises(ValueError, match="trained on the 'scalars' track"):
        benchmark.evaluate(model, TEST_ENV, targets=(2.0,), references=None, progress=False, observation="full")
