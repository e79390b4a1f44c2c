import math
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import morca_env  # noqa: F401  (registers the envs)
from morca_env.budget import forced_recompute_steps
from morca_env.speedup.calibration import seed_dither
from morca_env.models.tiny_data import vocabulary
from tests.conftest import make_pipe

FAST = dict(num_inference_steps=10, lpips=False)


def tiny_env(tmp_path, env_id="MorcaTinyRandom-v0", **kwargs):
    return gym.make(env_id, reference_cache_dir=str(tmp_path / "refs"), **{**FAST, **kwargs})


def run_episode(env, policy, seed=0, options=None):
    obs, info = env.reset(seed=seed, options=options)
    rewards, infos = [], []
    done = False
    while not done:
        obs, reward, done, truncated, info = env.step(policy(obs))
        assert not truncated
        rewards.append(reward)
        infos.append(info)
    return rewards, infos


def random_policy(seed=0):
    rng = np.random.default_rng(seed)
    return lambda obs: int(rng.integers(2))


def test_gymnasium_check_env_morca_tiny(tmp_path):
    from gymnasium.utils.env_checker import check_env

    env = tiny_env(tmp_path, "MorcaTiny-v0", speedup=2.0)
    check_env(env.unwrapped, skip_render_check=False)
    # a scheduler's own per-step time is paid for with more reuse (measured calibration)
    plain = env.reset(options={"speedup": 1.5})[1]["budget"]
    assert env.reset(options={"speedup": 1.5, "scheduler_cost_s": 0.003})[1]["budget"] > plain


def test_gymnasium_check_env_wan22_style(tmp_path):
    from gymnasium.utils.env_checker import check_env

    pipe = make_pipe("wan22", with_text_encoder=True, with_vae=True, vocabulary=vocabulary())
    env = gym.make("MorcaWan22-v0", pipeline=pipe, num_inference_steps=16, height=32, width=32, num_frames=9,
                   budget=6, prompts="tiny-train", lpips=False, reference_cache_dir=str(tmp_path))
    check_env(env.unwrapped)
    switch = env.unwrapped.denoiser.expert_switch_step
    assert env.unwrapped.budget_spec.forced == forced_recompute_steps(16, switch) and switch not in (0, 15)
    _, infos = run_episode(env, lambda obs: 1)  # always ask to reuse
    schedule = infos[-1]["schedule"]
    assert sum(schedule) == 6 and schedule[0] == schedule[switch] == schedule[-1] == 0


def test_sb3_check_env(tmp_path):
    pytest.importorskip("stable_baselines3")  # an extra (`[sb3]`): skipped in the core CI venv
    from stable_baselines3.common.env_checker import check_env

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sb3 suggests flattening our (C, 4, 8, 8) tensors
        check_env(tiny_env(tmp_path, budget=5).unwrapped)


class FeasibilityRecorder(gym.Wrapper):
    """Records, for every step, whether the agent's action was feasible under the mask it was shown."""

    log: list = []

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._mask = obs["action_mask"]
        return obs, info

    def step(self, action):
        feasible = bool(self._mask[int(action)])
        obs, reward, terminated, truncated, info = self.env.step(action)
        FeasibilityRecorder.log.append((feasible, info["projected"]))
        self._mask = obs["action_mask"]
        return obs, reward, terminated, truncated, info


def test_maskable_ppo_only_takes_feasible_actions(tmp_path):
    pytest.importorskip("sb3_contrib")  # an extra (`[sb3]`): skipped in the core CI venv
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.env_util import make_vec_env

    FeasibilityRecorder.log = []
    vec = make_vec_env("MorcaTiny-v0", n_envs=2, seed=0, wrapper_class=FeasibilityRecorder,
                       env_kwargs=dict(speedup=(1.5, 2.5), reference_cache_dir=str(tmp_path), **FAST))
    model = MaskablePPO("MultiInputPolicy", vec, n_steps=20, batch_size=20, n_epochs=1, seed=0, device="cpu")
    model.learn(total_timesteps=80)  # two rollouts of 2 envs x 20 steps
    assert len(FeasibilityRecorder.log) >= 80
    assert all(feasible and not projected for feasible, projected in FeasibilityRecorder.log)


def test_plain_ppo_runs_and_projection_is_flagged(tmp_path):
    pytest.importorskip("stable_baselines3")  # an extra (`[sb3]`): skipped in the core CI venv
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    FeasibilityRecorder.log = []
    vec = make_vec_env("MorcaTinyRandom-v0", n_envs=2, seed=0, wrapper_class=FeasibilityRecorder,
                       env_kwargs=dict(budget=6, reference_cache_dir=str(tmp_path), **FAST))
    PPO("MultiInputPolicy", vec, n_steps=20, batch_size=20, n_epochs=1, seed=0, device="cpu").learn(80)
    assert any(projected for _, projected in FeasibilityRecorder.log)
    assert all(projected == (not feasible) for feasible, projected in FeasibilityRecorder.log)


@pytest.mark.parametrize("budget", [0, 3, 8])
def test_every_episode_executes_exactly_k_reuses(tmp_path, budget):
    env = tiny_env(tmp_path, budget=budget)
    for seed in range(3):
        rewards, infos = run_episode(env, random_policy(seed), seed=seed)
        schedule = infos[-1]["schedule"]
        assert sum(schedule) == infos[-1]["num_reuse"] == budget
        assert schedule[0] == 0 and schedule[-1] == 0
        assert all(r == 0 for r in rewards[:-1])
        assert [i["reuses"] for i in infos] == list(np.cumsum(schedule))


def test_no_reuse_reproduces_the_reference_and_earns_r_max(tmp_path):
    env = tiny_env(tmp_path, budget=0, r_max=37.5)
    rewards, infos = run_episode(env, lambda obs: 0)
    assert torch.equal(env.unwrapped.last_video, env.unwrapped.reference_video)
    assert rewards[-1] == 37.5 and infos[-1]["psnr"] == float("inf") and infos[-1]["ssim"] == pytest.approx(1.0)
    rewards, infos = run_episode(gym.make("MorcaTinyRandom-v0", budget=8, reference_cache_dir=str(tmp_path / "refs"),
                                          **FAST), lambda obs: 1)
    assert 0 < rewards[-1] < 100 and infos[-1]["psnr"] < float("inf")


def test_observation_contents(tmp_path):
    env = tiny_env(tmp_path, budget=4)
    obs, info = env.reset(seed=1)
    assert obs["pooled"].shape == (9, 4, 8, 8) and obs["temporal"].shape == (18, 8, 8)
    assert obs["action_mask"].dtype == np.int8 and obs["action_mask"].tolist() == [1, 0]
    assert np.array_equal(env.unwrapped.action_masks(), obs["action_mask"].astype(bool))
    np.testing.assert_allclose(obs["scalars"], [0, 0, 1, 0, 0, 0.4, 0], atol=1e-6)
    obs, *_ = env.step(0)
    d, big_d, t, l, u, k, valid = obs["scalars"]
    assert d > 0 and big_d == pytest.approx(d) and t == pytest.approx(0.9) and l == pytest.approx(0.1)
    assert valid == 1 and obs["action_mask"].tolist() == [1, 1]
    obs, *_ = env.step(1)
    assert obs["scalars"][1] == pytest.approx(obs["scalars"][0] + d, rel=1e-5)  # D accumulates over a reuse
    assert obs["scalars"][4] == pytest.approx(0.1) and obs["scalars"][3] == pytest.approx(0.2)


def test_without_latent_features_the_episode_is_the_same_and_features_are_zero(tmp_path):
    full, lean = tiny_env(tmp_path, budget=4), tiny_env(tmp_path, budget=4, latent_features=False)
    schedule = [0, 1, 0, 1, 1, 0, 1, 0, 0, 0]
    results = []
    for env in (full, lean):
        obs, _ = env.reset(seed=3)
        observations = [obs]
        for action in schedule:
            obs, reward, *_, info = env.step(action)
            observations.append(obs)
        results.append((observations, reward, info))
    (obs_full, reward_full, info_full), (obs_lean, reward_lean, info_lean) = results
    assert reward_lean == reward_full and info_lean["schedule"] == info_full["schedule"]
    for a, b in zip(obs_full, obs_lean):
        np.testing.assert_array_equal(a["scalars"], b["scalars"])
        np.testing.assert_array_equal(a["action_mask"], b["action_mask"])
        assert not b["pooled"].any() and not b["temporal"].any() and a["pooled"].any()
        assert lean.observation_space.contains(b)
    with pytest.raises(TypeError, match="latent_features='no' must be True or False"):
        tiny_env(tmp_path, latent_features="no")


def test_bad_inputs_name_the_value_and_the_valid_range(tmp_path):
    with pytest.raises(ValueError, match=r"speedup=9.0 is outside the feasible range \[1.00, "):
        tiny_env(tmp_path, speedup=9.0)
    with pytest.raises(ValueError, match="unknown prompt suite 'vbench-tset'; valid suites: vbench-train"):
        tiny_env(tmp_path, prompts="vbench-tset")
    with pytest.raises(ValueError, match=r"budget K=9 is outside the feasible range \[0, 8\]"):
        tiny_env(tmp_path, budget=9)
    with pytest.raises(ValueError, match="speedup or budget, not both"):
        tiny_env(tmp_path, budget=2, speedup=2.0)
    with pytest.raises(ValueError, match="r_max=-1"):
        tiny_env(tmp_path, r_max=-1)
    env = tiny_env(tmp_path, budget=2)
    env.reset(seed=0)
    for bad in (2, -1, 0.5, "reuse", np.array([0, 1])):
        with pytest.raises(ValueError, match=r"valid actions: 0 \(recompute\) or 1 \(reuse\)|single value"):
            env.step(bad)
    with pytest.raises(ValueError, match="unknown reset options"):
        env.reset(options={"speed": 2.0})
    with pytest.raises(ValueError, match="speedup=0.5 is outside"):
        env.reset(options={"speedup": 0.5})
    with pytest.raises(ValueError, match="scheduler_cost_s=-0.1 must be a finite number >= 0"):
        env.reset(options={"speedup": 2.0, "scheduler_cost_s": -0.1})
    run_episode(env, lambda obs: 0)
    with pytest.raises(RuntimeError, match="after the episode ended .* call reset"):
        env.step(0)


def test_reset_options_and_seeded_determinism(tmp_path):
    env = tiny_env(tmp_path, speedup=(1.5, 3.0))
    obs1, info1 = env.reset(seed=5)
    obs2, info2 = env.reset(seed=5)
    assert info1 == {**info2, "reference_generated": info1["reference_generated"]}
    assert all(np.array_equal(obs1[k], obs2[k]) for k in obs1)
    _, info = env.reset(options={"prompt": "a red circle moving up on a black background", "seed": 3, "budget": 5})
    assert (info["prompt"], info["seed"], info["budget"]) == ("a red circle moving up on a black background", 3, 5)
    _, info = env.reset(options={"speedup": 2.0, "seed": 7})
    assert info["budget"] == env.unwrapped.calibration.budget_for_speedup(2.0, seed_dither(7))


def test_reference_generated_once_and_truncated_file_regenerated(tmp_path):
    options = {"prompt": "a red circle moving up on a black background", "seed": 11}
    env = tiny_env(tmp_path, budget=3)
    env.reset(options=options)
    env.reset(options=options)
    assert env.unwrapped.references.generated == 1
    other = tiny_env(tmp_path, budget=5)  # another instance sharing the cache dir
    _, info = other.reset(options=options)
    assert other.unwrapped.references.generated == 0 and info["reference_generated"] is False
    files = list(Path(tmp_path / "refs").rglob("*.safetensors"))
    assert len(files) == 1
    files[0].write_bytes(files[0].read_bytes()[:100])  # truncate
    with pytest.warns(UserWarning, match="unreadable"):
        _, info = other.reset(options=options)
    assert info["reference_generated"] is True
    _, info = other.reset(options=options)
    assert info["reference_generated"] is False
    other.reset(options={**options, "seed": 12})
    assert other.unwrapped.references.generated == 2


def test_wan21_env_with_injected_tiny_pipeline(tmp_path):
    from diffusers import UniPCMultistepScheduler

    pipe = make_pipe("wan21", with_text_encoder=True, with_vae=True, vocabulary=vocabulary())
    env = gym.make("MorcaWan21-v0", speedup=3.0, pipeline=pipe, height=32, width=32, num_frames=9,
                   prompts="tiny-train", reference_cache_dir=str(tmp_path), lpips=False)
    scheduler = env.unwrapped.denoiser.scheduler
    assert isinstance(scheduler, UniPCMultistepScheduler) and scheduler.config.flow_shift == 3.0
    assert env.unwrapped.num_steps == 50 and env.unwrapped.config.guidance_scale == 5.0
    rewards, infos = run_episode(env, random_policy())
    final = infos[-1]
    assert final["num_reuse"] == final["budget"] == env.unwrapped.calibration.budget_for_speedup(
        3.0, seed_dither(env.unwrapped.gen_seed))
    assert np.isfinite(final["psnr"]) and final["latency_s"] > 0 and final["reference_latency_s"] > 0
    assert env.unwrapped.last_video.shape == (9, 32, 32, 3)


def test_real_wan_without_weights_fails_clearly(monkeypatch, tmp_path):
    from morca_env.models.wan import WanWeightsNotFound

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(WanWeightsNotFound, match=r"Wan-AI/Wan2.1-T2V-1.3B-Diffusers.*\n.*huggingface-cli download.*\n.*model_id="):
        gym.make("MorcaWan21-v0", speedup=3.0, device="cpu")
    with pytest.raises(WanWeightsNotFound, match="Wan-AI/Wan2.2-T2V-A14B-Diffusers"):
        gym.make("MorcaWan22-v0", speedup=2.0, device="cpu")


def test_lpips_absent_with_warning_then_present_with_seeded_torch_home(tmp_path, monkeypatch):
    pytest.importorskip("lpips")  # an extra (`[lpips]`): skipped in the core CI venv
    import torchvision

    import morca_env.env as env_module

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty"))
    monkeypatch.setattr(env_module, "_LPIPS_WARNED", False)
    with pytest.warns(UserWarning, match="LPIPS disabled.*alexnet-owt-7be5be79.pth"):
        env = tiny_env(tmp_path, budget=2, lpips=True)
    _, infos = run_episode(env, lambda obs: 0)
    assert "lpips" not in infos[-1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per process only
        tiny_env(tmp_path, budget=2, lpips=True)

    seeded = tmp_path / "seeded"
    (seeded / "hub" / "checkpoints").mkdir(parents=True)
    torch.save(torchvision.models.alexnet().state_dict(), seeded / "hub" / "checkpoints" / "alexnet-owt-7be5be79.pth")
    monkeypatch.setenv("TORCH_HOME", str(seeded))
    env = tiny_env(tmp_path, budget=4, lpips=True)
    _, infos = run_episode(env, lambda obs: 1)
    assert 0.0 <= infos[-1]["lpips"] < 1.0


def test_failed_construction_leaves_an_injected_pipeline_clean(tmp_path):
    pipe = make_pipe("wan21", with_text_encoder=True, with_vae=True, vocabulary=vocabulary())
    with pytest.raises(ValueError, match="speedup=99.0 is outside"):
        gym.make("MorcaWan21-v0", pipeline=pipe, speedup=99.0, height=32, width=32, num_frames=9, lpips=False,
                 reference_cache_dir=str(tmp_path))
    assert not pipe.transformer.blocks[0]._diffusers_hook.hooks
    env = gym.make("MorcaWan21-v0", pipeline=pipe, speedup=2.0, height=32, width=32, num_frames=9, lpips=False,
                   reference_cache_dir=str(tmp_path))
    assert pipe.transformer.blocks[0]._diffusers_hook.hooks
    env.close()
    assert not pipe.transformer.blocks[0]._diffusers_hook.hooks


def test_dithered_budget_hits_the_target_speedup_on_average(tmp_path):
    """Each episode runs floor(K*) or ceil(K*); over consecutive seeds the mean latency is the target's,
    and every method gets the same K for the same (prompt, seed, target)."""
    env = tiny_env(tmp_path, budget=0)
    calib = env.unwrapped.calibration
    target = 2.2
    k_star = calib.fractional_budget(target)
    budgets = [env.reset(options={"speedup": target, "seed": s})[1]["budget"] for s in range(40)]
    assert set(budgets) <= {math.floor(k_star), math.ceil(k_star)}
    assert np.mean(budgets) == pytest.approx(k_star, abs=0.05)
    # mean predicted latency (linear in K) is the target's
    mean_inverse = np.mean([1 / calib.speedup_of_budget(k) for k in budgets])
    assert 1 / mean_inverse == pytest.approx(target, rel=0.01)
    again = [env.reset(options={"speedup": target, "seed": s})[1]["budget"] for s in range(40)]
    assert again == budgets
    nearest = tiny_env(tmp_path, budget=0, budget_rounding="nearest")
    assert {nearest.reset(options={"speedup": target, "seed": s})[1]["budget"] for s in range(5)} == {
        calib.budget_for_speedup(target)}
    with pytest.raises(ValueError, match="budget_rounding='up'; valid: \\('dither', 'nearest'\\)"):
        tiny_env(tmp_path, budget=0, budget_rounding="up")


def test_the_steps_patch_embedding_computed_by_the_signal_counts_as_model_time(tmp_path):
    """The signal computes the step's patch embedding for the step's transformer calls: its seconds are the
    denoiser's (latency), not the env's overhead."""
    import time as time_module

    env = tiny_env(tmp_path, budget=4).unwrapped
    conv = env.denoiser.experts[0].patch_embedding
    inner = conv._conv_forward

    def slow(*args):
        time_module.sleep(0.02)
        return inner(*args)

    conv._conv_forward = slow
    _, infos = run_episode(env, lambda obs: 0)
    steps = env.num_steps
    assert infos[-1]["overhead_s"] < 0.02 * steps / 2  # one slow convolution per step, none in the overhead
    assert infos[-1]["latency_s"] >= 0.02 * steps


def test_resource_limits_are_checked_before_anything_is_allocated(tmp_path):
    """num_inference_steps=10**6 ran for hours; height=width=10**6 tried to allocate 96 TB."""
    import gymnasium as gym

    with pytest.raises(ValueError, match=r"num_inference_steps=1000000 exceeds the 1000 timesteps .* valid: 2 to 1000"):
        gym.make("MorcaTinyRandom-v0", num_inference_steps=10**6, reference_cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"height=1000000, width=1000000, num_frames=\d+: one denoising step needs "
                                         r"about .* GiB on cpu"):
        gym.make("MorcaTinyRandom-v0", height=10**6, width=10**6, reference_cache_dir=str(tmp_path))


def test_step_or_reset_after_close_is_a_clear_error(tmp_path):
    import gymnasium as gym

    env = gym.make("MorcaTinyRandom-v0", num_inference_steps=6, lpips=False, reference_cache_dir=str(tmp_path))
    env.reset(seed=0)
    env.close()
    for call in (lambda: env.step(0), lambda: env.reset(seed=1)):
        with pytest.raises(RuntimeError, match=r"on a closed MorcaEnv .* make a new env"):
            call()
