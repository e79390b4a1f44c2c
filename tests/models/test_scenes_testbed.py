"""MorcaScenes-v0 from an install: the env, its vector env, the benchmark and `accelerate`, on shipped files only."""

import gymnasium as gym
import numpy as np
import pytest
import torch

import morca_env
from morca_env.speedup.files import calibration_for_pipeline, load_calibration
from morca_env.models import scenes
from morca_env.models.scenes_data import parse_prompt
from morca_env.schedulers.fixed import UniformInterval


@pytest.fixture(scope="module")
def calibration():
    return load_calibration("scenes", 50, 48)


def test_make_plays_an_exact_budget_episode_on_training_prompts(tmp_path, calibration):
    env = gym.make("MorcaScenes-v0", speedup=3.0, lpips=False, reference_cache_dir=str(tmp_path))
    obs, info = env.reset(seed=0)
    assert env.unwrapped.budget == calibration.budget_for_speedup(3.0) != load_calibration("tiny", 50, 48) \
        .budget_for_speedup(3.0)
    parse_prompt(info["prompt"])  # a prompt of the scenes grammar, not MorcaTiny's
    assert not env.unwrapped.suite.name.startswith("tiny")
    done = False
    while not done:
        obs, reward, done, _, info = env.step(int(obs["action_mask"][1]))
    assert info["num_reuse"] == env.unwrapped.budget and np.isfinite(reward) and reward > 0
    assert env.unwrapped.last_video.shape == (12, 16, 16, 3)
    env.close()


def test_make_vec_plays_four_episodes_in_one_batch(tmp_path):
    envs = gym.make_vec("MorcaScenes-v0", num_envs=4, speedup=2.0, lpips=False, num_inference_steps=10,
                        reference_cache_dir=str(tmp_path))
    obs, infos = envs.reset(seed=3)
    finished = np.zeros(4, bool)
    while not finished.all():
        obs, rewards, terminated, truncated, infos = envs.step(np.asarray(obs["action_mask"][:, 1], dtype=np.int64))
        finished |= terminated
    assert len(set(infos["prompt"])) == 4 and (np.asarray(infos["psnr"]) > 0).all()
    envs.close()


def test_benchmark_scores_against_the_shipped_references(tmp_path, monkeypatch):
    monkeypatch.setenv("MORCA_CACHE_DIR", str(tmp_path))
    from morca_env.evaluation import benchmark

    result = benchmark.evaluate(UniformInterval(), "MorcaScenes-v0", targets=[3.0], pair_step=10, progress=False)
    assert result.suite == "scenes-eval[::6]" and all(parse_prompt(row["prompt"]) for row in result.rows)
    score = result.scores[3.0]
    assert np.isfinite(score.normalized) and np.isfinite(score.vs_best_fixed)  # paired with the shipped references


def test_accelerate_reads_the_scenes_calibration_from_the_pipeline(calibration):
    pipe = scenes.load_morca_scenes()
    assert calibration_for_pipeline(pipe) == "scenes"
    # pixel space: WanPipeline turns num_frames=F into F + 1 frames when there is no temporal VAE factor
    call = dict(prompt="two red circles racing left on a striped background", height=16, width=16, num_frames=11,
                num_inference_steps=50, guidance_scale=5.0, output_type="latent", negative_prompt="")
    result = morca_env.accelerate(pipe, UniformInterval(), speedup=2.5, generator=torch.Generator().manual_seed(0),
                                  **call)
    assert sum(result.schedule) == calibration.budget_for_speedup(2.5)
    stock = pipe(generator=torch.Generator().manual_seed(0), **call).frames
    assert result.output.frames.shape == stock.shape == (1, 3, 12, 16, 16) and (result.output.frames - stock).abs().max() > 0
