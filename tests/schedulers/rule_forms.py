"""Checks every cache rule's three forms must pass (`<rule>`, `<rule>-global`, `<rule>-exact`); each rule's test
module calls them with its registry name. Not collected by itself (no test_ prefix)."""

import torch

import morca_env
from morca_env import schedulers
from morca_env.rollout import rollout


def forms_of(rule: str) -> tuple[str, str, str]:
    return rule, f"{rule}-global", f"{rule}-exact"


def make_envs(tmp_path):
    """An exact-budget MorcaTinyRandom env and a budget-free one on the same pipeline."""
    import gymnasium as gym

    env = gym.make("MorcaTinyRandom-v0", budget=6, lpips=False, latent_features=False,
                   reference_cache_dir=str(tmp_path))
    free = gym.make("MorcaTinyRandom-v0", budget=6, lpips=False, latent_features=False, enforce_budget=False,
                    pipeline=env.unwrapped.pipe, reference_cache_dir=str(tmp_path))
    return env, free


def check_exact_is_native(rule: str, env, free):
    """The exact form plays the native rule at the threshold it found: the same schedule, exactly K reuses.
    -> the exact policy (for rule-specific checks)."""
    options = {"prompt": "a red circle", "seed": 1, "budget": 4}
    exact = schedulers.make(f"{rule}-exact", env)
    trajectory = rollout(env, exact, options)
    assert exact.clipped is None and exact.last_threshold > 0
    native = rollout(free, schedulers.make(rule, env, threshold=exact.last_threshold), options)
    assert native.schedule == trajectory.schedule and native.num_reuse == 4
    return exact


def check_forms_in_env(scheduler: str, env, free, **options) -> None:
    """Every form (made with `options`) plays feasible actions; the exact-budget ones spend exactly K; check_env is
    unaffected."""
    from gymnasium.utils.env_checker import check_env

    check_env(env.unwrapped, skip_render_check=True)
    for name in forms_of(scheduler):
        policy = schedulers.make(name, env, **options)
        exact = schedulers.needs_exact_budget(policy)
        assert exact == (name == f"{scheduler}-exact")  # native and global spend their own K
        trajectory = rollout(env if exact else free, policy, {"prompt": "a red circle", "seed": 1, "speedup": 1.8})
        assert trajectory.requested == trajectory.schedule  # feasible actions only
        if exact:
            assert trajectory.num_reuse == trajectory.info["budget"]


def check_global_tracks_the_target(rule: str, env, free) -> None:
    import pytest

    policy = schedulers.make(f"{rule}-global", env)
    reuses = [rollout(free, policy, {"prompt": "a red circle", "seed": 1, "speedup": s}).num_reuse
              for s in (1.3, 1.8, 2.5)]
    assert reuses == sorted(reuses) and reuses[0] < reuses[-1]
    with pytest.raises(ValueError, match="needs a target speedup"):
        rollout(free, policy, {"prompt": "a red circle", "seed": 1, "budget": 6})
    given = {"speedups": [1.0, 3.0], "thresholds": [0.01, 1.0]}  # a recipe's JSON map is used as given
    policy = schedulers.make(f"{rule}-global", env, threshold_map=given)
    rollout(free, policy, {"prompt": "a red circle", "seed": 1, "speedup": 2.0})
    assert policy.threshold == pytest.approx(0.1)  # halfway in log threshold


def check_recipe_and_evaluate(rule: str, env, free) -> None:
    from morca_env.data import make_behavior
    from morca_env.evaluation import load_method  # what `morca evaluate` loads methods with

    for name in forms_of(rule):
        behaviour = make_behavior({"name": name}, env, seed=0)
        assert type(behaviour) is type(schedulers.make(name, env))
        policy, runs_in = load_method(name, None, env, free)
        assert runs_in is (env if schedulers.needs_exact_budget(policy) else free)


def check_accelerate(scheduler: str, kind: str, **options) -> None:
    """Every form drives a stock tiny Wan pipeline call (Wan2.2: the expert switch forced) at exactly K."""
    from tests.conftest import make_pipe, prompt_embeds

    pipe = make_pipe(kind, with_text_encoder=False, with_vae=True)
    extra = {"guidance_scale_2": 3.0} if kind == "wan22" else {}
    embeds = prompt_embeds()
    call = dict(prompt_embeds=embeds[0], negative_prompt_embeds=embeds[1], height=32, width=32, num_frames=9,
                num_inference_steps=12, output_type="latent", guidance_scale=5.0, **extra)
    calibration = morca_env.SpeedupCalibration(alpha=12.0, beta=12.0, max_budget=9)
    spec = morca_env.diffusion.wan_structure.budget_spec(pipe, 12)
    assert len(spec.forced) == (3 if kind == "wan22" else 2)  # first, last (and the expert switch)
    for name in forms_of(scheduler):
        policy = schedulers.make(name, pipe=pipe, calibration=calibration, **options)
        result = morca_env.accelerate(pipe, policy, speedup=2.0, calibration=calibration,
                                      generator=torch.Generator().manual_seed(0), **call)
        assert sum(result.schedule) == calibration.budget_for_speedup(2.0) and result.num_projected == 0
        assert all(result.schedule[i] == 0 for i in spec.forced)


def check_collection(rule: str, tmp_path, monkeypatch) -> None:
    """Each form is a behaviour policy of a `collect_dataset` recipe (budget-free env, relabelled with its K)."""
    import numpy as np

    from morca_env.data import collect_dataset

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    monkeypatch.setenv("MORCA_CACHE_DIR", str(tmp_path / "cache"))
    for form, name in zip(("native", "global", "exact"), forms_of(rule)):
        dataset = collect_dataset(f"test/{rule}-{form}-v0", "MorcaTinyRandom-v0", 2, behavior={"name": name},
                                  env_kwargs={"speedup": [1.5, 2.5], "lpips": False, "num_inference_steps": 10},
                                  progress=False)
        assert dataset.total_episodes == 2
        for episode in dataset.iterate_episodes():
            actions = np.asarray(episode.actions)
            assert actions[0] == 0 and actions[-1] == 0 and len(actions) == 10
