"""The env's info travels: it pickles, so multiprocess vector envs (gymnasium's async, sb3's SubprocVecEnv) run."""

import pickle

import gymnasium as gym
import numpy as np
import pytest

import morca_env  # noqa: F401  (registers the envs)

KWARGS = {"budget": 4, "lpips": False, "num_inference_steps": 8}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MORCA_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def test_reset_and_step_info_pickle_and_the_run_view_stays_on_the_env(cache):
    env = gym.make("MorcaTinyRandom-v0", **KWARGS)
    obs, info = env.reset(seed=0)
    assert "run_view" not in info and pickle.loads(pickle.dumps(info)) == info
    assert env.unwrapped.run_view is env.unwrapped.denoiser
    done = False
    while not done:
        obs, _, done, _, info = env.step(int(obs["action_mask"][1]))
        pickle.dumps(info)
    assert info["num_reuse"] == 4
    env.close()


def _plain(value) -> bool:
    return isinstance(value, (bool, int, float, str)) or (isinstance(value, list) and all(isinstance(v, int) for v in value))


def test_info_has_the_same_plain_keys_after_reset_and_every_step(cache):
    """What buffer-based libraries need (tianshou stacks infos into arrays: a missing key or a None is NaN)."""
    env = gym.make("MorcaTinyRandom-v0", **KWARGS)
    obs, info = env.reset(seed=0)
    infos = [info]
    done = False
    while not done:
        obs, _, done, _, info = env.step(int(obs["action_mask"][1]))
        infos.append(info)
    keys = set(infos[0])
    for info in infos:
        assert set(info) == keys and all(_plain(v) for v in info.values()), info
    stacked = {k: np.array([i[k] for i in infos]) for k in keys if not isinstance(infos[0][k], str)}
    assert all(a.dtype != object and np.isfinite(a.astype(float)).all() for a in stacked.values())
    schedules = stacked["schedule"]
    assert schedules.shape == (9, 8) and (schedules[0] == -1).all() and (schedules[-1] >= 0).all()
    assert [int((s >= 0).sum()) for s in schedules] == list(range(9))  # one decision more per step
    assert infos[-1]["psnr"] > 0 and all(i["psnr"] == 0.0 for i in infos[:-1])
    assert infos[0]["target_speedup"] == 0.0  # set by a budget: no None
    env.close()


def test_a_runtime_rule_still_reads_the_run_through_the_env(cache):
    from morca_env.schedulers import make
    from morca_env.rollout import rollout

    env = gym.make("MorcaTinyRandom-v0", **KWARGS)
    for name in ("first-block-cache", "easycache"):  # run-time rules: they read the live run at every step
        trajectory = rollout(env, make(name, env), seed=0)
        assert trajectory.num_reuse == 4
    env.close()


def test_async_vector_env_runs_whole_episodes(cache):
    envs = gym.make_vec("MorcaTinyRandom-v0", num_envs=2, vectorization_mode="async", **KWARGS)
    obs, infos = envs.reset(seed=0)
    assert obs["action_mask"].shape == (2, 2)
    for _ in range(8):
        obs, rewards, terminated, truncated, infos = envs.step(obs["action_mask"][:, 1].astype(np.int64))
    assert terminated.all() and not truncated.any() and (rewards > 0).all()
    envs.close()


def test_sb3_subproc_vec_env_runs(cache):
    pytest.importorskip("stable_baselines3")  # an extra (`[sb3]`): skipped in the core CI venv
    from stable_baselines3.common.vec_env import SubprocVecEnv

    envs = SubprocVecEnv([lambda: gym.make("MorcaTinyRandom-v0", **KWARGS) for _ in range(2)], start_method="fork")
    envs.seed(0)
    obs = envs.reset()
    rewards = np.zeros(2)
    for _ in range(8):
        obs, reward, dones, infos = envs.step(obs["action_mask"][:, 1].astype(np.int64))
        rewards += reward
    assert dones.all() and (rewards > 0).all() and all("psnr" in i for i in infos)
    envs.close()
