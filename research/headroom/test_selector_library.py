"""The schedule library: frozen-prefix search, greedy selection, switch features, playing on many runs, the
ridge selector."""

import gymnasium as gym
import numpy as np
import pytest
import torch

import morca_env  # noqa: F401
from morca_env.budget import BudgetSpec, forced_recompute_steps
from morca_env.diffusion.denoiser import StepwiseDenoiser
from selector_library import (FEATURE_NAMES, RidgeSelector, cross_validated_choice, greedy_library, play_on_runs,
                               realised, switch_features)
from morca_env.schedulers.fixed import UniformInterval
from morca_env.schedulers.schedule import adjust_reuses
from morca_env.schedulers.schedule import propose
from morca_env.evaluation.search import SearchConfig, SearchTask, play_schedule, search_many

KWARGS = {"budget": 8, "num_inference_steps": 20, "r_max": 200}


def test_proposals_never_move_a_frozen_prefix():
    spec = BudgetSpec(20, forced_recompute_steps(20))
    start = UniformInterval().plan(spec, 9)
    rng = np.random.default_rng(0)
    moved = set()
    for _ in range(400):
        candidate = propose(start, spec, rng, SearchConfig(frozen_prefix=6))
        if candidate is not None:
            assert candidate[:6] == start[:6] and sum(candidate) == 9
            moved |= {i for i, (a, b) in enumerate(zip(start, candidate)) if a != b}
    assert min(moved) == 6  # the first free step after the prefix does move
    with pytest.raises(ValueError, match="frozen_prefix=-1"):
        SearchConfig(frozen_prefix=-1)


def test_search_task_starts_from_its_schedule_and_keeps_the_prefix(tmp_path):
    kwargs = {**KWARGS, "reference_cache_dir": str(tmp_path / "refs")}
    env = gym.make("MorcaTinyRandom-v0", lpips=False, latent_features=False, **kwargs).unwrapped
    start = [0, 1, 1, 0, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0]  # not uniform spacing
    task = SearchTask("a", (("a red circle", 1),), 6, tuple(start))
    with pytest.raises(ValueError, match="K = 5 reuses"):
        search_many([SearchTask("b", task.pairs, 5, task.start)], "MorcaTinyRandom-v0", kwargs, tmp_path / "out",
                    progress=False)
    [result] = search_many([task], "MorcaTinyRandom-v0", kwargs, tmp_path / "out",
                           SearchConfig(evaluations=6, frozen_prefix=5), progress=False)
    assert result["start_value"] == pytest.approx(play_schedule(env, start, "a red circle", 1).reward, abs=1e-4)
    assert result["schedule"][:5] == start[:5] and sum(result["schedule"]) == 6


def test_greedy_library_covers_the_runs_the_default_loses_and_ignores_a_runs_own_schedule():
    rewards = {"default": [10, 10, 10, 10], "wins-0-1": [12, 12, 9, 9], "wins-2": [9, 9, 13, 9],
               "wins-3-own": [9, 9, 9, 20], "twin": [12, 12, 9, 9]}
    assert greedy_library(rewards, 3, "default") == ["default", "wins-3-own", "wins-0-1"]
    # left out of run 3's maximum, its own searched schedule wins nowhere
    assert greedy_library(rewards, 3, "default", own={"wins-3-own": 3}) == ["default", "wins-0-1", "wins-2"]
    # nothing left that wins anywhere: the library stops growing
    assert greedy_library(rewards, 9, "default", own={"wins-3-own": 3}) == ["default", "wins-0-1", "wins-2"]
    with pytest.raises(ValueError, match="'nope'"):
        greedy_library(rewards, 2, "nope")


def test_switch_features_read_the_predicted_clean_video_at_the_prefix_end():
    torch.set_num_threads(1)
    env = gym.make("MorcaTinyRandom-v0", lpips=False, latent_features=False, **KWARGS).unwrapped
    den = StepwiseDenoiser(env.pipe, env.config, device=env.device)
    prefix = [0, 1, 0, 1]
    features = switch_features(den, prefix, "a red circle", 3)
    assert features["summary"].shape == (len(FEATURE_NAMES),) and features["pooled"].ndim == 1
    # by hand: x0 = x_t - sigma_t v_t at the last compute (step 2)
    den.start(prompt="a red circle", seed=3)
    den.step(False), den.step(True)
    latents = den.latents
    den.step(False)
    x0 = (latents - den.sigma(2) * den.last_velocity)[0]
    assert features["summary"][:3] == pytest.approx(x0.reshape(3, -1).mean(1).numpy(), abs=1e-5)
    again = switch_features(den, prefix, "a red circle", 4)  # another noise sample reads differently
    assert not np.allclose(again["summary"], features["summary"])
    with pytest.raises(ValueError, match="no compute step"):
        switch_features(den, [], "a red circle", 3)


def test_play_on_runs_gives_the_env_rewards_in_workers_and_resumes(tmp_path):
    kwargs = {**KWARGS, "reference_cache_dir": str(tmp_path / "refs")}
    env = gym.make("MorcaTinyRandom-v0", lpips=False, latent_features=False, **kwargs)
    spec = env.unwrapped.budget_spec
    uniform = UniformInterval().plan(spec, 6)
    other = list(uniform)
    other[1], other[2] = uniform[2], uniform[1]
    pairs = [("a red circle", 3), ("a blue square", 5), ("a green triangle", 7)]
    log = tmp_path / "log.jsonl"
    rewards, features = play_on_runs("MorcaTinyRandom-v0", kwargs, {"u": uniform, "o": other}, pairs, log,
                                     prefix=uniform[:4], profile=True, workers=2)
    for name, schedule in (("u", uniform), ("o", other)):
        assert rewards[name] == pytest.approx([play_schedule(env, schedule, *pair).reward for pair in pairs],
                                              abs=1e-4)
    assert features["summary"].shape == (3, len(FEATURE_NAMES)) and features["profile"].shape == (3, 2 * 19)
    assert features["profile"][0] != pytest.approx(features["profile"][1])
    lines = log.read_text().splitlines()
    again, _ = play_on_runs("MorcaTinyRandom-v0", kwargs, {"u": uniform, "o": other}, pairs, log)
    assert again == rewards and log.read_text().splitlines() == lines  # read back, nothing replayed


def test_ridge_selector_learns_which_member_a_feature_points_to():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 3))
    # member 1 wins by 2 dB where feature 0 > 0, member 2 where feature 1 > 0.5; member 0 is 0 dB
    rewards = np.stack([np.zeros(200), np.where(x[:, 0] > 0, 2.0, -2.0), np.where(x[:, 1] > 0.5, 3.0, -3.0)], axis=1)
    rewards += rng.normal(scale=0.1, size=rewards.shape)
    selector = RidgeSelector(alpha=0.01).fit(x[:150], rewards[:150])
    gain = realised(rewards[150:], selector.choose(x[150:])) - rewards[150:, 0]
    oracle = rewards[150:].max(1) - rewards[150:, 0]
    assert gain.mean() > 0.7 * oracle.mean()
    cv = realised(rewards, cross_validated_choice(x, rewards, 0.01)) - rewards[:, 0]
    assert cv.mean() > 0.7 * (rewards.max(1) - rewards[:, 0]).mean()
    # the one definition of each feature kind, for one run and stacked over runs
    from selector_library import feature_vector
    one = {"summary": np.arange(3.0), "pooled": np.arange(5.0)}
    assert feature_vector(one, "both").tolist() == [0, 1, 2, 0, 1, 2, 3, 4]
    assert feature_vector({k: np.stack([v, v]) for k, v in one.items()}, "both").shape == (2, 8)
    with pytest.raises(ValueError, match="'all'"):
        feature_vector(one, "all")
    # a margin no predicted gain reaches keeps the default everywhere
    assert (RidgeSelector(0.01, margin=100.0).fit(x, rewards).choose(x) == 0).all()


def _library_env(tmp_path):
    return gym.make("MorcaTinyRandom-v0", lpips=False, latent_features=False,
                    reference_cache_dir=str(tmp_path / "refs"), **KWARGS)


def test_library_scheduler_reads_the_run_like_switch_features_and_plays_the_chosen_member(tmp_path):
    from selector_library import LibraryScheduler
    from morca_env.rollout import rollout

    torch.set_num_threads(1)
    env = _library_env(tmp_path)
    spec = env.unwrapped.budget_spec
    default = UniformInterval().plan(spec, 6)
    prefix = 5
    other = list(default)
    j, k = next(i for i in range(prefix, 19) if default[i]), next(i for i in range(prefix, 19) if not default[i])
    other[j], other[k] = 0, 1
    x = np.random.default_rng(0).normal(size=(10, len(FEATURE_NAMES)))

    def scheduler(bias):  # a selector that always predicts `bias` dB for the other member
        selector = RidgeSelector().fit(x, np.zeros((10, 2)))
        selector.bias = np.array([bias])
        library = {"prefix": prefix, "members": [default, other], "feature": "summary", "selector": selector.to_dict()}
        return LibraryScheduler(env, {6: library}, fallback=UniformInterval())

    for bias, expected, choice in ((1.0, other, 1), (-1.0, default, 0)):
        policy = scheduler(bias)
        played = rollout(env, policy, {"prompt": "a red circle", "seed": 3, "budget": 6})
        assert played.schedule == expected and policy.last_choice == choice
    den = StepwiseDenoiser(env.unwrapped.pipe, env.unwrapped.config, device=env.unwrapped.device)
    assert policy.last_features == pytest.approx(switch_features(den, default[:prefix], "a red circle", 3)["summary"],
                                                 rel=1e-5)
    # a neighbouring K plays the library's member with a reuse taken out after the prefix; a farther K the fallback
    played = rollout(env, policy, {"prompt": "a red circle", "seed": 3, "budget": 5})
    assert played.schedule == adjust_reuses(default, spec, 5, first=prefix) and policy.last_choice == 0
    assert played.schedule[:prefix] == default[:prefix] and played.num_reuse == 5
    played = rollout(env, policy, {"prompt": "a red circle", "seed": 3, "budget": 4})
    assert played.schedule == UniformInterval().plan(spec, 4) and policy.last_choice is None
    with pytest.raises(ValueError, match="K = 17 cannot be reached"):
        adjust_reuses(default, spec, 17, first=prefix)
    with pytest.raises(ValueError, match="another K or prefix"):
        LibraryScheduler(env, {6: {"prefix": prefix, "members": [default, UniformInterval().plan(spec, 5)],
                                   "feature": "summary", "selector": {}}}, fallback=UniformInterval())


@pytest.mark.slow  # about 18 s on one core: kept out of the default suite (about 13 min)
def test_selector_script_builds_a_library_and_saves_what_the_scheduler_plays(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    from morca_env import schedulers
    from morca_env.rollout import rollout

    root = Path(__file__).resolve().parents[2]
    kwargs = {"num_inference_steps": 10, "r_max": 200, "reference_cache_dir": str(tmp_path / "refs")}
    env = gym.make("MorcaTinyRandom-v0", lpips=False, latent_features=False, **kwargs)
    spec = env.unwrapped.budget_spec
    fixed = tmp_path / "fixed.json"
    fixed.write_text(json.dumps({"schedules": {"4": UniformInterval().plan(spec, 4)}}))
    saved = tmp_path / "library.json"
    result = subprocess.run(
        [sys.executable, str(Path(__file__).parent / "headroom_selector.py"), "--env", "MorcaTinyRandom-v0",
         "--env-kwargs", json.dumps(kwargs), "--budget", "4", "--prefix", "3", "--size", "3", "--evaluations", "6",
         "--search-prompts", "tiny-train[23:28]", "--label-prompts", "tiny-train[41:51]",
         "--validation-prompts", "tiny-train[59:63]", "--best-fixed", str(fixed), "--threads", "1",
         "--out", str(tmp_path / "out"), "--save", str(saved)], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    report = (tmp_path / "out" / "selector.md").read_text()
    assert "oracle choice, validation runs" in report and "chosen by CV on the label runs" in report
    data = json.loads((tmp_path / "out" / "selector.json").read_text())
    assert len(data["label"]["rewards"]) == 10 and data["members"][0] == "best-fixed"
    library = json.loads(saved.read_text())["libraries"]["4"]
    assert all(m[:3] == library["members"][0][:3] and sum(m) == 4 for m in library["members"])
    policy = schedulers.make("library", env, path=str(saved))
    played = rollout(env, policy, {"prompt": "a red circle", "seed": 3, "budget": 4})
    assert played.schedule == library["members"][policy.last_choice]


@pytest.mark.slow  # about 10 s on one core: kept out of the default suite (about 13 min)
def test_sensitivity_script_replays_the_runs_exactly_at_eps_zero(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    from morca_env.evaluation.search import play_schedule

    root = Path(__file__).resolve().parents[2]
    kwargs = {"num_inference_steps": 10, "r_max": 200, "reference_cache_dir": str(tmp_path / "refs")}
    env = gym.make("MorcaTinyRandom-v0", lpips=False, latent_features=False, **kwargs)
    spec = env.unwrapped.budget_spec
    uniform = UniformInterval().plan(spec, 4)
    other = list(uniform)
    other[1], other[2] = uniform[2], uniform[1]
    pairs = [["a red circle", 3], ["a blue square", 5]]
    library = tmp_path / "selector.json"
    full = [0] * 10  # no reuse: the reference itself, if members and reference see the same nudged noise
    library.write_text(json.dumps({"budget": 4, "members": ["a", "b", "full"],
                                   "library": {"a": uniform, "b": other, "full": full}, "label": {"pairs": pairs}}))
    result = subprocess.run(
        [sys.executable, str(Path(__file__).parent / "headroom_sensitivity.py"), "--env", "MorcaTinyRandom-v0",
         "--env-kwargs", json.dumps(kwargs), "--library", str(library), "--members", "3", "--runs", "2",
         "--eps", "0", "0.5", "--threads", "1", "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = {(r["run"], r["eps"]): r["psnr"] for r in map(json.loads, (tmp_path / "out" / "psnr.jsonl").open())}
    for b, pair in enumerate(pairs):
        assert rows[b, 0.0][:2] == pytest.approx([play_schedule(env, s, *pair).reward for s in (uniform, other)],
                                                 abs=1e-4)
        assert rows[b, 0.5][:2] != pytest.approx(rows[b, 0.0][:2], abs=1e-3)  # the nudged noise is another run
        assert rows[b, 0.5][2] == rows[b, 0.0][2] == 200  # ... seen alike by the reference and every member
    assert "| 0.5 |" in (tmp_path / "out" / "sensitivity.md").read_text()
