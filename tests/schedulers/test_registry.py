"""The scheduler registry and the observation layout: one name and one index for each thing, everywhere."""

import gymnasium as gym
import numpy as np
import pytest

import morca_env  # noqa: F401
from morca_env import schedulers
from morca_env.data import make_behavior
from morca_env.utils.extras import MissingExtra
from morca_env.observation import OBS_KEYS, SCALAR_NAMES, Scalar, as_flat, as_tuple, observation_space, step_of
from morca_env.rollout import rollout

KWARGS = {"random": {"seed": 0}, "fixed": {"schedule": [0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]},
          "seacache": {"delta": 0.3}, "threshold-curve": {"seed": 0, "speedup_range": [1.5, 2.5]},
          "mixture": {"components": [{"name": "uniform"}, {"name": "seacache", "delta": 0.2}], "seed": 0}}
NEEDS_FILES = ("best-fixed", "jittered-best-fixed", "searched", "replay", "morca", "reinforce", "library",
               "follow-best-fixed", "best-fixed-deviations")  # below, in test_search, test_agents, test_anchored, test_library


@pytest.fixture
def envs(tmp_path):
    env = gym.make("MorcaTinyRandom-v0", budget=6, num_inference_steps=20, lpips=False,
                   reference_cache_dir=str(tmp_path))
    free = gym.make("MorcaTinyRandom-v0", budget=6, num_inference_steps=20, lpips=False, enforce_budget=False,
                    pipeline=env.unwrapped.pipe, reference_cache_dir=str(tmp_path))
    return env, free


@pytest.mark.parametrize("name", [n for n in schedulers.names() if n not in NEEDS_FILES])
def test_every_rule_runs_by_name_at_exact_k(name, envs):
    env, free = envs
    policy = schedulers.make(name, env, **KWARGS.get(name, {}))
    exact = schedulers.needs_exact_budget(policy)
    target = {"budget": 6} if name == "fixed" else {"speedup": 1.8}  # a fixed schedule has its own K
    trajectory = rollout(env if exact else free, policy, {"prompt": "a red circle", "seed": 1, **target})
    assert not any(trajectory.requested[i] != trajectory.actions[i] for i in range(len(trajectory.actions)))
    if exact:
        assert trajectory.num_reuse == trajectory.info["budget"]


def test_unknown_names_and_bad_options_say_what_is_valid(envs):
    with pytest.raises(ValueError, match="unknown scheduler 'seacash'.*seacache-exact"):
        schedulers.make("seacash")
    with pytest.raises(TypeError, match="scheduler 'uniform'"):
        schedulers.make("uniform", delta=0.3)
    with pytest.raises(ValueError, match="pass env="):
        schedulers.make("seacache-global")
    try:  # with the agents extra the name loads the shipped scheduler; without it, says which extra
        import d3rlpy  # noqa: F401
        assert type(schedulers.make("morca")).__name__ == "AnchoredPolicy"
    except ImportError:
        with pytest.raises(MissingExtra, match=r"morca-gym\[agents\]"):
            schedulers.make("morca")
    assert isinstance(schedulers.make("behaviour", envs[0], seed=1), schedulers.behaviour.ThresholdCurve)


def test_collection_recipes_take_registry_names(envs):
    env, _ = envs
    assert isinstance(make_behavior({"name": "seacache", "delta": 0.2}, env, seed=0), schedulers.seacache.SeaCacheThreshold)
    a = make_behavior({"name": "random"}, env, seed=5)
    b = make_behavior({"name": "random"}, env, seed=5)
    spec = env.unwrapped.budget_spec
    assert a.plan(spec, 6) == b.plan(spec, 6)  # the recipe's per-episode seed reaches the policy


def test_scalar_layout_matches_what_the_env_writes(envs):
    env, _ = envs
    obs, info = env.reset(options={"prompt": "a red circle", "seed": 0, "budget": 6})
    n = info["num_steps"]
    assert SCALAR_NAMES == ("d_t", "D_t", "t", "l_t", "u_t", "K", "cache_valid")
    assert obs["scalars"][Scalar.K] == pytest.approx(6 / n) and obs["scalars"][Scalar.t] == pytest.approx(1.0)
    for step in range(3):
        obs, *_ = env.step(0 if step == 0 else 1)
    assert step_of(obs, n) == 3
    assert obs["scalars"][Scalar.u_t] == pytest.approx(2 / n)  # two reuses so far
    assert obs["scalars"][Scalar.l_t] == pytest.approx(3 / n)  # three steps since the recompute at step 0
    assert obs["scalars"][Scalar.cache_valid] == 1.0
    assert env.observation_space == observation_space(3)


def test_tuple_form_follows_obs_keys_and_flat_form_gymnasiums_flatten(envs):
    env, _ = envs
    obs, _ = env.reset(options={"prompt": "a red circle", "seed": 0})
    stacked = {k: np.stack([v, v]) for k, v in obs.items()}
    parts = as_tuple(stacked)
    assert [p.shape[1:] for p in parts] == [obs[k].shape for k in OBS_KEYS]
    flat = as_flat(stacked)
    assert flat.shape == (2, sum(obs[k].size for k in OBS_KEYS))
    assert np.array_equal(flat[0, :2], obs["action_mask"].astype(np.float32))  # the mask comes first (sorted keys)
    assert np.array_equal(flat[1], gym.spaces.flatten(env.observation_space, obs))


def test_budget_for_speedup_is_what_reset_runs(envs):
    env, _ = envs
    for seed in range(6):
        _, info = env.reset(options={"prompt": "a red circle", "seed": seed, "speedup": 1.7})
        assert info["budget"] == env.unwrapped.budget_for_speedup(1.7, seed)


def test_mixture_draws_each_component_by_weight_and_replays_stored_schedules(envs, tmp_path):
    import json

    env, _ = envs
    schedule = [0, 1, 1, 0] + [0] * 16
    entries = tmp_path / "entries.json"
    entries.write_text(json.dumps([{"prompt": "a blue square", "seed": 7, "schedule": schedule}]))
    components = [{"name": "jittered-uniform", "weight": 3, "moves": 2}, {"name": "replay", "weight": 1,
                                                                          "path": str(entries)}]
    names = [schedulers.make("mixture", env, components=components, seed=s).name for s in range(400)]
    assert 0.2 < names.count("replay") / len(names) < 0.3  # weight 1 of 4
    replay = next(schedulers.make("mixture", env, components=components, seed=s) for s in range(400)
                  if names[s] == "replay")
    options = replay.episode_options(0)
    assert options == {"prompt": "a blue square", "seed": 7, "budget": 2}
    assert rollout(env, replay, options).schedule == schedule
    jitter = schedulers.make("jittered-uniform", env, moves=3, seed=0)
    played = rollout(env, jitter, {"prompt": "a red circle", "seed": 0, "budget": 6})
    uniform = schedulers.fixed.UniformInterval().plan(env.unwrapped.budget_spec, 6)
    assert played.num_reuse == 6 and played.schedule != uniform
    assert sum(a != b for a, b in zip(played.schedule, uniform)) <= 2 * 3  # 3 near swaps move at most 6 steps


def test_jittered_best_fixed_moves_the_fitted_schedule_a_little(envs, tmp_path):
    import json

    env, _ = envs
    spec = env.unwrapped.budget_spec
    fitted = [0, 1, 1, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]  # 5 reuses, far from uniform
    path = tmp_path / "fixed.json"
    path.write_text(json.dumps({"schedules": {"5": fitted}}))
    assert schedulers.make("jittered-best-fixed", env, path=str(path), moves=0).plan(spec, 5) == fitted
    for seed in range(5):
        moved = schedulers.make("jittered-best-fixed", env, path=str(path), moves=1, seed=seed).plan(spec, 5)
        changed = [i for i, (a, b) in enumerate(zip(moved, fitted)) if a != b]
        assert sum(moved) == 5 and len(changed) == 2 and changed[1] - changed[0] <= 2  # one near swap
    with pytest.raises(ValueError, match="max_shift=0"):
        schedulers.make("jittered-best-fixed", env, path=str(path), max_shift=0)
    with pytest.raises(ValueError, match="weights"):
        schedulers.make("mixture", env, components=[{"name": "uniform", "weight": -1}])


MAP = {"speedups": [1.0, 3.0], "thresholds": [0.01, 1.0]}  # a threshold map for schedulers run without an env
UNDER_ACCELERATE = {"random": {"seed": 0}, "seacache": {"delta": 0.3}, "seacache-global": {"threshold_map": MAP},
                    "threshold-curve": {"threshold_map": MAP, "seed": 0}, "jittered-uniform": {"seed": 0},
                    "mixture": {"components": [{"name": "uniform"}, {"name": "random"}], "seed": 0},
                    "seacache-exact": {}, "uniform": {}, "always-recompute": {}, "always-reuse": {},
                    "coin-flip": {"seed": 0}}


def test_every_scheduler_is_in_a_contract_test():
    """Each registry entry is played at exact K above (or, needing files, in its own test) and under `accelerate`
    below or in tests/schedulers/rule_forms.py (the rules): a new entry must join one of them."""
    from morca_env.schedulers.rules import FORMS

    rules = {rule + suffix for rule in schedulers.rule_names() for _, suffix in FORMS}
    assert set(schedulers.names()) - rules - set(NEEDS_FILES) - {"fixed"} == set(UNDER_ACCELERATE)


@pytest.mark.parametrize("name", sorted(UNDER_ACCELERATE))
def test_every_scheduler_drives_a_stock_pipeline_at_exact_k(name):
    """The same schedulers on a stock tiny Wan2.1 pipeline call (`accelerate`, no env): exactly K reuses, none on a
    forced step, and schedulers that spend exactly K are never overridden by the mask."""
    import torch

    from tests.conftest import make_pipe, prompt_embeds

    pipe = make_pipe("wan21", with_text_encoder=False, with_vae=True)
    embeds = prompt_embeds()
    calibration = morca_env.SpeedupCalibration(alpha=12.0, beta=12.0, max_budget=10)
    policy = schedulers.make(name, pipe=pipe, **UNDER_ACCELERATE[name]) if name == "seacache-exact" else \
        schedulers.make(name, **UNDER_ACCELERATE[name])
    result = morca_env.accelerate(pipe, policy, speedup=2.0, calibration=calibration,
                                  generator=torch.Generator().manual_seed(0), prompt_embeds=embeds[0],
                                  negative_prompt_embeds=embeds[1], height=32, width=32, num_frames=9,
                                  num_inference_steps=12, output_type="latent", guidance_scale=5.0)
    assert sum(result.schedule) == calibration.budget_for_speedup(2.0)
    assert result.schedule[0] == 0 and result.schedule[-1] == 0
    if schedulers.needs_exact_budget(policy):
        assert result.num_projected == 0
