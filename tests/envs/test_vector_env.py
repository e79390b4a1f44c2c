"""MorcaVectorEnv: N episodes in one batch play the single env's episodes (gymnasium's seed convention), with
gymnasium's vector-env API (batched spaces, infos with masks, autoreset modes) and clear errors on bad input."""

import gymnasium as gym
import numpy as np
import pytest

import morca_env  # noqa: F401  (registers the envs)
from morca_env.models.tiny_data import vocabulary
from morca_env.vector import MorcaVectorEnv, final_observation
from tests.conftest import make_pipe

# rewards: the batched transformer sums in another order (~1e-6 on the video), and a uint8 level flipped at one of
# MorcaTinyRandom's 3072 values moves PSNR by ~1e-4 dB at 19 dB and ~4e-3 dB at 48 dB (the error is relative to the
# MSE); measured worst cases: 1.5e-4 dB here, 1.3e-3 dB at 47.7 dB (tests/evaluation/test_benchmark.py)
REWARD_DB = 1e-2
KWARGS = {"lpips": False, "num_inference_steps": 8, "speedup": (1.5, 3.0)}


def requested_actions(steps: int, num_envs: int, seed: int = 0) -> np.ndarray:
    """Each sub-env's own action sequence, random and sometimes infeasible (so projection is compared too)."""
    return np.random.default_rng(seed).integers(0, 2, size=(steps, num_envs))


def play_vector(envs, seed, actions, options=None):
    obs, info = envs.reset(seed=seed, options=options)
    observations, infos, rewards = [obs], [info], None
    for step_actions in actions:
        obs, rewards, terminated, truncated, info = envs.step(step_actions)
        observations.append(obs)
        infos.append(info)
    assert terminated.all() and not truncated.any()
    return observations, infos, rewards


def play_single(env, seed, actions, options=None):
    obs, info = env.reset(seed=seed, options=options)
    observations, infos, reward = [obs], [info], None
    for action in actions:
        obs, reward, terminated, _, info = env.step(int(action))
        observations.append(obs)
        infos.append(info)
    assert terminated
    return observations, infos, reward


def assert_sub_env_plays_the_single_episode(vector_run, single_run, n):
    (v_obs, v_infos, v_rewards), (s_obs, s_infos, s_reward) = vector_run, single_run
    for key in ("prompt", "seed", "budget", "target_speedup", "schedule", "num_reuse", "num_projected"):
        assert np.array_equal(np.asarray(v_infos[-1][key][n]), np.asarray(s_infos[-1][key])), key
    for step, (batch, single) in enumerate(zip(v_obs, s_obs)):
        for key in single:
            np.testing.assert_allclose(batch[key][n].astype(np.float32), single[key].astype(np.float32),
                                       rtol=2e-3, atol=1e-4, err_msg=f"{key} at step {step}")
        assert np.array_equal(batch["action_mask"][n], single["action_mask"]), step
    assert abs(v_rewards[n] - s_reward) < REWARD_DB and s_reward > 0


OBSERVATION_OPTIONS = pytest.mark.parametrize("obs_kwargs", [
    {},
    {"signal": "latent"},
    {"latent_features": False},
    {"feature_dtype": "float16"},
    {"mask_dtype": "bool"},
], ids=["default", "latent-signal", "no-latent-features", "float16-features", "bool-mask"])


def test_a_bool_mask_is_torchrls_dtype_in_the_space_and_every_observation(tmp_path):
    kwargs = {**KWARGS, "mask_dtype": "bool", "reference_cache_dir": str(tmp_path)}
    single = gym.make("MorcaTinyRandom-v0", **kwargs)
    envs = gym.make_vec("MorcaTinyRandom-v0", num_envs=2, vectorization_mode="vector_entry_point",
                        pipeline=single.unwrapped.pipe, **kwargs)
    assert single.observation_space["action_mask"].dtype == np.bool_
    obs, _ = single.reset(seed=1)
    for _ in range(8):  # one episode, then the batch's (envs sharing a pipeline never interleave)
        assert obs["action_mask"].dtype == np.bool_ and obs in single.observation_space
        obs, *_ = single.step(int(obs["action_mask"][1]))
    batch, _ = envs.reset(seed=1)
    for _ in range(8):
        assert batch["action_mask"].dtype == np.bool_ and batch in envs.observation_space
        batch, *_ = envs.step(batch["action_mask"][:, 1].astype(np.int64))
    envs.close()
    single.close()
    with pytest.raises(ValueError, match="mask_dtype='uint8'; valid: int8, bool"):
        gym.make("MorcaTinyRandom-v0", **{**kwargs, "mask_dtype": "uint8"})


@OBSERVATION_OPTIONS
def test_sub_env_i_plays_the_single_env_episode_of_seed_plus_i_on_wan21(tmp_path, obs_kwargs):
    kwargs = {**KWARGS, **obs_kwargs, "reference_cache_dir": str(tmp_path)}
    envs = gym.make_vec("MorcaTinyRandom-v0", num_envs=3, vectorization_mode="vector_entry_point", **kwargs)
    single = gym.make("MorcaTinyRandom-v0", pipeline=envs.env.pipe, **kwargs)
    actions = requested_actions(8, 3)
    vector_run = play_vector(envs, 40, actions)
    assert len(set(vector_run[1][-1]["prompt"])) > 1 and len({tuple(s) for s in vector_run[1][-1]["schedule"]}) > 1
    for n in range(3):
        assert_sub_env_plays_the_single_episode(vector_run, play_single(single, 40 + n, actions[:, n]), n)
    envs.close()
    single.close()


@OBSERVATION_OPTIONS
def test_sub_envs_play_the_single_env_episodes_on_wan22_with_both_experts(tmp_path, obs_kwargs):
    pipe = make_pipe("wan22", with_text_encoder=True, with_vae=True, vocabulary=vocabulary())
    kwargs = dict(pipeline=pipe, num_inference_steps=16, height=32, width=32, num_frames=9, prompts="tiny-train",
                  lpips=False, reference_cache_dir=str(tmp_path), speedup=(1.5, 2.5), **obs_kwargs)
    envs = gym.make_vec("MorcaWan22-v0", num_envs=2, **kwargs)  # the default mode is the vector entry point
    assert isinstance(envs, MorcaVectorEnv)
    switch = envs.denoiser.expert_switch_step
    assert switch not in (None, 0, 15)
    single = gym.make("MorcaWan22-v0", **kwargs)
    actions = np.ones((16, 2), dtype=np.int64)  # always ask to reuse: the budget and forced steps decide
    actions[3, 0] = 0
    vector_run = play_vector(envs, 7, actions)
    for n in range(2):
        assert_sub_env_plays_the_single_episode(vector_run, play_single(single, 7 + n, actions[:, n]), n)
        assert vector_run[1][-1]["schedule"][n][switch] == 0
    envs.close()
    single.close()


def test_options_per_sub_env_and_shared(tmp_path):
    envs = MorcaVectorEnv(3, "tiny-random", reference_cache_dir=str(tmp_path), **KWARGS)
    prompts = ["a red circle", "a blue square", "a green diamond"]
    _, info = envs.reset(options={"prompt": prompts, "seed": np.array([5, 6, 7]), "budget": 2})
    assert list(info["prompt"]) == prompts and list(info["seed"]) == [5, 6, 7] and list(info["budget"]) == [2] * 3
    _, info = envs.reset(options=[{"budget": 1}, {"budget": 2}, {"speedup": 2.0}])
    assert list(info["budget"][:2]) == [1, 2] and info["target_speedup"][2] == 2.0
    assert envs.action_masks().shape == (3, 2) and envs.action_masks().dtype == bool
    envs.close()


def test_next_step_autoreset_continues_each_sub_envs_generator(tmp_path):
    kwargs = {**KWARGS, "reference_cache_dir": str(tmp_path)}
    envs = gym.make_vec("MorcaTinyRandom-v0", num_envs=2, **kwargs)
    mode = envs.metadata["autoreset_mode"]  # gymnasium >= 1.1: its AutoresetMode (1.0 has none: our name)
    assert getattr(mode, "name", mode).lower() == "next_step"
    actions = requested_actions(8, 2, seed=1)
    play_vector(envs, 3, actions)
    obs, rewards, terminated, truncated, info = envs.step(np.zeros(2, dtype=np.int64))  # the autoreset step
    assert not terminated.any() and (rewards == 0).all() and (obs["scalars"][:, 2] == 1.0).all()
    assert (info["step"] == -1).all()
    single = gym.make("MorcaTinyRandom-v0", pipeline=envs.env.pipe, **kwargs)
    for n in range(2):
        single.reset(seed=3 + n)
        _, second = single.reset()  # the single env's next episode: its generator continues
        assert info["prompt"][n] == second["prompt"] and info["seed"][n] == second["seed"]
        assert info["budget"][n] == second["budget"]
    envs.close()
    single.close()


def test_same_step_autoreset_returns_the_new_episode_and_keeps_the_final_ones(tmp_path):
    envs = gym.make_vec("MorcaTinyRandom-v0", num_envs=2, autoreset_mode="same_step", reference_cache_dir=str(tmp_path),
                        **KWARGS)
    obs, _ = envs.reset(seed=0)
    for step in range(8):
        obs, rewards, terminated, _, info = envs.step(obs["action_mask"][:, 1].astype(np.int64))
    assert terminated.all() and (rewards > 0).all()
    assert (obs["scalars"][:, 2] == 1.0).all()  # already the new episodes' first observations
    # as gymnasium's own SyncVectorEnv gives them (its layout changed after 1.0: final_observation reads both)
    assert info["_final_obs"].all() and all(final_observation(info, n)["scalars"][2] == 0.0 for n in range(2))
    assert list(np.minimum(info["final_info"]["psnr"], 50.0)) == pytest.approx(list(rewards))  # r_max = 50 dB
    assert info["final_info"]["_psnr"].all()
    obs, rewards, terminated, _, _ = envs.step(obs["action_mask"][:, 1].astype(np.int64))
    assert not terminated.any() and (obs["scalars"][:, 2] < 1.0).all()  # a real step of the new episodes
    envs.close()


def test_disabled_autoreset_asks_for_a_reset(tmp_path):
    mode = getattr(gym.vector, "AutoresetMode", None)  # gymnasium's enum where it has one, else our name
    envs = MorcaVectorEnv(2, "tiny-random", autoreset_mode=mode.DISABLED if mode else "disabled",
                          reference_cache_dir=str(tmp_path), **KWARGS)
    play_vector(envs, 0, requested_actions(8, 2))
    with pytest.raises(RuntimeError, match="call reset"):
        envs.step(np.zeros(2, dtype=np.int64))
    envs.reset(seed=0)
    envs.close()


def test_gymnasium_vector_api(tmp_path):
    """What gymnasium's vector envs promise: batched spaces, seeded determinism, infos with `_key` masks, and its
    own vector wrappers running on top."""
    from gymnasium.utils.env_checker import data_equivalence
    from gymnasium.wrappers.vector import DictInfoToList, RecordEpisodeStatistics

    kwargs = {**KWARGS, "reference_cache_dir": str(tmp_path)}
    envs = gym.make_vec("MorcaTinyRandom-v0", num_envs=2, **kwargs)
    single = gym.make("MorcaTinyRandom-v0", **kwargs)
    assert envs.single_observation_space == single.observation_space
    assert envs.single_action_space == single.action_space
    assert envs.observation_space == gym.vector.utils.batch_space(single.observation_space, 2)
    first, info = envs.reset(seed=11)
    again, _ = envs.reset(seed=11)
    assert data_equivalence(first, again, exact=True)
    assert first in envs.observation_space and info["_prompt"].all()
    obs, rewards, terminated, truncated, info = envs.step(envs.action_space.sample())
    assert obs in envs.observation_space and rewards.shape == (2,) and terminated.dtype == bool
    assert truncated.shape == (2,) and info["step"].tolist() == [0, 0]
    single.close()
    envs.close()

    stats = RecordEpisodeStatistics(gym.make_vec("MorcaTinyRandom-v0", num_envs=2, **kwargs))
    obs, _ = stats.reset(seed=0)
    for _ in range(8):
        obs, rewards, terminated, _, infos = stats.step(obs["action_mask"][:, 1].astype(np.int64))
    assert terminated.all() and list(infos["episode"]["l"]) == [8, 8]
    assert list(infos["episode"]["r"]) == pytest.approx(list(rewards))
    stats.close()
    as_list = DictInfoToList(gym.make_vec("MorcaTinyRandom-v0", num_envs=2, **kwargs))
    obs, infos = as_list.reset(seed=0)
    assert isinstance(infos, list) and len(infos) == 2 and all(set(i) >= {"prompt", "seed", "budget"} for i in infos)
    as_list.close()


def test_sync_vector_env_stays_available(tmp_path):
    envs = gym.make_vec("MorcaTinyRandom-v0", num_envs=2, vectorization_mode="sync",
                        reference_cache_dir=str(tmp_path), **KWARGS)
    assert isinstance(envs, gym.vector.SyncVectorEnv)
    envs.close()


@pytest.mark.parametrize("call, message", [
    (lambda d: MorcaVectorEnv(0, "tiny-random", reference_cache_dir=d, **KWARGS), r"num_envs=0 must be an integer >= 1"),
    (lambda d: MorcaVectorEnv(True, "tiny-random", reference_cache_dir=d, **KWARGS), r"num_envs=True"),
    (lambda d: MorcaVectorEnv(2.5, "tiny-random", reference_cache_dir=d, **KWARGS), r"num_envs=2.5"),
    (lambda d: MorcaVectorEnv(2, "tiny-random", autoreset_mode="later", reference_cache_dir=d, **KWARGS),
     r"autoreset_mode='later'; valid: next_step, same_step, disabled"),
    (lambda d: MorcaVectorEnv(2, "tiny-random", reference_cache_dir=d, **{**KWARGS, "num_inference_steps": [8, 16]}),
     r"num_inference_steps=\[8, 16\]: every sub-env .* runs the same num_inference_steps"),
], ids=["zero", "bool", "float", "autoreset-mode", "mixed-step-counts"])
def test_bad_construction_is_named(tmp_path, call, message):
    with pytest.raises(ValueError, match=message):
        call(str(tmp_path))


@pytest.mark.parametrize("reset, message", [
    (dict(options={"budget": [1, 2, 3]}), r"options\['budget'\] has 3 values for 2 sub-envs; valid: one value for all, or exactly 2"),
    (dict(options=[{"budget": 1}]), r"options is a list of 1 dicts for 2 sub-envs"),
    (dict(options={"reset_mask": np.array([True, False])}), r"reset_mask.*reset together; valid: None or 2 True"),
    (dict(seed=[1, 2, 3]), r"seed=\[1, 2, 3\]; valid: None, an integer .* or a list of 2 seeds"),
    (dict(options={"budget": [1, 99]}), r"budget K=99 is outside the feasible range \[0, 6\]"),
], ids=["option-length", "options-list-length", "partial-reset-mask", "seed-list-length", "bad-sub-env-value"])
def test_bad_reset_is_named(tmp_path, reset, message):
    envs = MorcaVectorEnv(2, "tiny-random", reference_cache_dir=str(tmp_path), **KWARGS)
    with pytest.raises(ValueError, match=message):
        envs.reset(**reset)
    envs.close()


def test_bad_actions_and_steps_out_of_order_are_named(tmp_path):
    envs = MorcaVectorEnv(2, "tiny-random", reference_cache_dir=str(tmp_path), **KWARGS)
    with pytest.raises(RuntimeError, match="call reset"):
        envs.step(np.zeros(2, dtype=np.int64))
    envs.reset(seed=0)
    for bad in ([0, 1, 1], [0, 2], [0.5, 1.0], 1):
        with pytest.raises(ValueError, match=r"valid: 2 integers, each 0 \(recompute\) or 1 \(reuse\)"):
            envs.step(bad)
    envs.close()


def test_a_batch_beyond_the_free_memory_is_refused_naming_both(tmp_path, monkeypatch):
    import morca_env.diffusion.denoiser as denoiser

    probe = MorcaVectorEnv(1, "tiny-random", reference_cache_dir=str(tmp_path), **KWARGS)
    per_video = denoiser.batch_memory_bytes(probe.denoiser, 1)
    probe.close()
    monkeypatch.setattr(denoiser, "free_memory_bytes", lambda device: 3 * 2**20)
    fits = 3 * 2**20 // per_video
    assert 1 <= fits < 4096
    with pytest.raises(ValueError, match=rf"num_envs=4096: a batched step needs about .* GiB on cpu and 0.00 GiB are "
                                         rf"free; valid here: num_envs <= {fits}"):
        MorcaVectorEnv(4096, "tiny-random", reference_cache_dir=str(tmp_path), **KWARGS)


def test_batch_memory_estimate_grows_with_the_batch_and_the_video(tmp_path):
    from morca_env.diffusion.denoiser import batch_memory_bytes

    envs = MorcaVectorEnv(1, "tiny-random", reference_cache_dir=str(tmp_path), **KWARGS)
    one, eight = batch_memory_bytes(envs.denoiser, 1), batch_memory_bytes(envs.denoiser, 8)
    assert eight == 8 * one > 0
    envs.close()


class Recorder:
    """Wraps the sb3 adapter's step_wait: every sub-env's (action feasible under the mask it was shown, projected)."""

    def __init__(self, adapter):
        self.log, self.adapter, self.step_wait = [], adapter, adapter.step_wait
        adapter.step_wait = self

    def __call__(self):
        masks = self.adapter.envs.action_masks()
        chosen = self.adapter._actions
        obs, rewards, dones, infos = self.step_wait()
        self.log += [(bool(masks[n][chosen[n]]), info["projected"]) for n, info in enumerate(infos)]
        return obs, rewards, dones, infos


def test_sb3_ppo_and_maskable_ppo_train_on_the_batched_env(tmp_path):
    pytest.importorskip("sb3_contrib")  # an extra (`[sb3]`): skipped in the core CI venv
    from sb3_contrib import MaskablePPO
    from stable_baselines3 import PPO

    from morca_env.wrappers import sb3_vec_env

    kwargs = {**KWARGS, "reference_cache_dir": str(tmp_path)}
    masked = sb3_vec_env(gym.make_vec("MorcaTinyRandom-v0", num_envs=4, **kwargs))
    record = Recorder(masked)
    MaskablePPO("MultiInputPolicy", masked, n_steps=24, batch_size=32, n_epochs=1, seed=0, device="cpu").learn(192)
    assert len(record.log) >= 192 and all(feasible and not projected for feasible, projected in record.log)
    masked.close()

    plain = sb3_vec_env(gym.make_vec("MorcaTinyRandom-v0", num_envs=4, **kwargs))
    record = Recorder(plain)
    PPO("MultiInputPolicy", plain, n_steps=24, batch_size=32, n_epochs=1, seed=0, device="cpu").learn(192)
    assert any(projected for _, projected in record.log)  # plain PPO asks for infeasible actions; the env projects
    assert all(projected == (not feasible) for feasible, projected in record.log)
    plain.close()


def test_sb3_adapter_gives_sb3s_episode_ends(tmp_path):
    pytest.importorskip("stable_baselines3")
    from morca_env.wrappers import sb3_vec_env

    adapter = sb3_vec_env(gym.make_vec("MorcaTinyRandom-v0", num_envs=2, reference_cache_dir=str(tmp_path), **KWARGS))
    adapter.seed(5)
    obs = adapter.reset()
    single = gym.make("MorcaTinyRandom-v0", reference_cache_dir=str(tmp_path), **KWARGS)
    assert [i["prompt"] for i in adapter.reset_infos] == [single.reset(seed=5 + n)[1]["prompt"] for n in range(2)]
    assert obs["scalars"].shape == (2, 7)
    for _ in range(8):
        obs, rewards, dones, infos = adapter.step(adapter.env_method("action_masks")[0][1] * np.ones(2, dtype=np.int64))
    assert dones.all() and (rewards > 0).all()
    assert all(i["terminal_observation"]["scalars"][2] == 0.0 and i["psnr"] > 0 for i in infos)
    assert (obs["scalars"][:, 2] == 1.0).all()  # already the next episodes
    with pytest.raises(TypeError, match="sb3_vec_env takes a MorcaVectorEnv"):
        sb3_vec_env(gym.make("MorcaTinyRandom-v0", reference_cache_dir=str(tmp_path), **KWARGS))
    adapter.close()


def test_a_cleanrl_loop_runs_on_the_batched_env(tmp_path, monkeypatch):
    from examples import cleanrl_reinforce

    made = []
    real = gym.make_vec
    monkeypatch.setattr(gym, "make_vec", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    act = cleanrl_reinforce.main("MorcaTinyRandom-v0", steps=64, num_envs=4, score=False, lpips=False,
                                 num_inference_steps=8, reference_cache_dir=str(tmp_path))
    assert len(made) == 1 and isinstance(made[0], MorcaVectorEnv) and made[0].num_envs == 4
    obs, _ = gym.make("MorcaTinyRandom-v0", lpips=False, num_inference_steps=8, budget=3,
                      reference_cache_dir=str(tmp_path)).reset(seed=0)
    assert act(obs) in (0, 1)


def test_final_observation_reads_both_of_gymnasiums_layouts():
    obs = [{"scalars": np.full(7, float(n))} for n in range(3)]
    batched = {"final_obs": {"scalars": np.stack([o["scalars"] for o in obs])}}  # gymnasium 1.0
    listed = {"final_obs": np.array(obs + [None], dtype=object)[:3]}  # gymnasium >= 1.1
    for infos in (batched, listed):
        assert [final_observation(infos, n)["scalars"][0] for n in range(3)] == [0.0, 1.0, 2.0]


def test_the_default_batch_is_8_for_morca_tiny_and_1_for_wan():
    from morca_env.parallel.workers import DEFAULT_NUM_ENVS, default_num_envs

    assert DEFAULT_NUM_ENVS == 8 and default_num_envs("MorcaTiny-v0", {}) == 8
    assert default_num_envs("MorcaWan21-v0", {}) == default_num_envs("MorcaWan22-v0", {}) == 1


def test_a_huge_batch_is_refused_before_its_spaces_are_allocated(tmp_path, monkeypatch):
    """make_vec(num_envs=10**6) built 8.6 GiB of batched spaces before the memory guard ran."""
    import morca_env.vector as vector

    def no_batch_space(*args):
        raise AssertionError("batched spaces allocated before the memory check")

    monkeypatch.setattr(vector, "batch_space", no_batch_space)
    with pytest.raises(ValueError, match=r"num_envs=1000000: a batched step needs about"):
        MorcaVectorEnv(10**6, "tiny-random", reference_cache_dir=str(tmp_path), **KWARGS)
