import numpy as np
import pytest
import torch

import morca_env
from morca_env.schedulers.fixed import RandomFeasible, UniformInterval
from morca_env.schedulers.rules.seacache import SeaCacheThreshold
from tests.conftest import make_pipe, prompt_embeds

CALL = dict(height=32, width=32, num_frames=9, num_inference_steps=12, output_type="latent", guidance_scale=5.0)


def call(pipe, seed=0, **extra):
    embeds = prompt_embeds()
    return dict(prompt_embeds=embeds[0], negative_prompt_embeds=embeds[1],
                generator=torch.Generator().manual_seed(seed), **{**CALL, **extra})


@pytest.mark.parametrize("kind", ["wan21", "wan22"])
def test_budget_zero_is_exactly_the_stock_pipeline(kind):
    pipe = make_pipe(kind, with_text_encoder=False, with_vae=True)
    extra = {"guidance_scale_2": 3.0} if kind == "wan22" else {}
    stock = pipe(**call(pipe, **extra)).frames
    result = morca_env.accelerate(pipe, UniformInterval(), budget=0, **call(pipe, **extra))
    assert torch.equal(result.output.frames, stock)
    assert result.schedule == [0] * 12
    for block in pipe.transformer.blocks:  # hooks removed afterwards
        assert not block._diffusers_hook.hooks
    assert not pipe.transformer._diffusers_hook.hooks
    assert not pipe.transformer.patch_embedding._diffusers_hook.hooks
    assert torch.equal(pipe(**call(pipe, **extra)).frames, stock)


def test_each_step_runs_one_patch_embedding_for_the_signal_and_both_branches():
    """The official signal's patch embedding is the one the step's cond and uncond calls use (the cache's memo):
    one convolution per step instead of three; a stock call without the hooks runs two."""
    from tests.diffusion.test_cache import ConvCounter

    pipe = make_pipe("wan21", with_text_encoder=False, with_vae=True)
    counter = ConvCounter(pipe.transformer.patch_embedding)
    stock = pipe(**call(pipe)).frames
    assert counter.count == 2 * CALL["num_inference_steps"]
    counter.count = 0
    result = morca_env.accelerate(pipe, UniformInterval(), budget=0, **call(pipe))
    assert counter.count == CALL["num_inference_steps"]
    assert torch.equal(result.output.frames, stock)


@pytest.mark.parametrize("policy", [UniformInterval(), RandomFeasible(3), SeaCacheThreshold(0.2)])
def test_budget_executes_exactly_k_reuses(policy):
    pipe = make_pipe("wan22", with_text_encoder=False, with_vae=True)
    result = morca_env.accelerate(pipe, policy, budget=5, **call(pipe, guidance_scale_2=3.0))
    assert sum(result.schedule) == 5 and result.schedule[0] == result.schedule[-1] == 0
    stock = pipe(**call(pipe, guidance_scale_2=3.0)).frames
    assert (result.output.frames - stock).abs().max() > 0  # reuse changed the result


def test_accelerate_matches_the_env_schedule_and_video(tmp_path):
    """The same policy through accelerate() and through MorcaEnv executes the same schedule."""
    import gymnasium as gym

    pipe = make_pipe("wan21", with_text_encoder=True, with_vae=True, vocabulary=["red", "ball"])
    env = gym.make("MorcaWan21-v0", pipeline=pipe, budget=4, num_inference_steps=12, height=32, width=32,
                   num_frames=9, prompts=["a red ball"], lpips=False, reference_cache_dir=str(tmp_path))
    policy = SeaCacheThreshold(0.3)
    obs, info = env.reset(options={"seed": 5})
    policy.reset(obs, info)
    done = False
    while not done:
        obs, _, done, _, info = env.step(policy(obs))
    env.close()
    result = morca_env.accelerate(pipe, policy, budget=4, prompt="a red ball",
                                  generator=torch.Generator().manual_seed(5), max_sequence_length=512,
                                  **{**CALL, "output_type": "np"})
    assert result.schedule == info["schedule"]
    video = torch.from_numpy(result.output.frames[0])
    assert (morca_env.diffusion.metrics.to_uint8(video) == env.unwrapped.last_video).float().mean() > 0.99


def test_speedup_uses_calibration_and_bad_input():
    pipe = make_pipe("wan21", with_text_encoder=False, with_vae=True)
    calib = morca_env.SpeedupCalibration(alpha=12.0, beta=12.0, max_budget=10)
    result = morca_env.accelerate(pipe, UniformInterval(), speedup=2.0, calibration=calib, **call(pipe))
    assert sum(result.schedule) == calib.budget_for_speedup(2.0) == 6
    with pytest.raises(ValueError, match="exactly one of speedup or budget"):
        morca_env.accelerate(pipe, UniformInterval(), **call(pipe))
    with pytest.raises(ValueError, match=r"budget K=11 is outside the feasible range \[0, 10\]"):
        morca_env.accelerate(pipe, UniformInterval(), budget=11, **call(pipe))
    assert not pipe.transformer.blocks[0]._diffusers_hook.hooks


def test_wan_structure_is_the_same_for_the_denoiser_and_accelerate(wan22_pipe):
    """Forced steps and the expert switch come from one place (morca_env.diffusion.wan_structure)."""
    from morca_env.diffusion import wan_structure
    from morca_env.diffusion.denoiser import DenoiserConfig, StepwiseDenoiser

    for steps in (6, 12, 20):
        den = StepwiseDenoiser(wan22_pipe, DenoiserConfig(num_inference_steps=steps, height=16, width=16, num_frames=5))
        spec = wan_structure.budget_spec(wan22_pipe, steps)
        assert den.expert_switch_step is not None and spec.forced == {0, steps - 1, den.expert_switch_step}
        assert den.expert_of_step[den.expert_switch_step - 1] == 0 and den.expert_of_step[den.expert_switch_step] == 1
        den.close()
    assert wan_structure.branches(5.0) == ("cond", "uncond") and wan_structure.branches(1.0) == ("cond",)


def test_the_calibration_follows_the_pipelines_model(monkeypatch):
    """Accelerate() used Wan2.1's curve whatever the pipeline was (K=5 instead of 6 on MorcaTiny at
    2x); now the transformer's config names the model, and an unknown architecture is refused."""
    from types import SimpleNamespace

    from morca_env.speedup.files import calibration_for_pipeline, load_calibration
    from morca_env.models import tiny
    from morca_env.diffusion.wan_structure import budget_spec

    def pipe_of(config, second=None):
        return SimpleNamespace(transformer=SimpleNamespace(config=config), transformer_2=second)

    wan21 = {"num_layers": 30, "num_attention_heads": 12, "attention_head_dim": 128, "in_channels": 16}
    wan22 = {**wan21, "num_layers": 40, "num_attention_heads": 40}
    assert calibration_for_pipeline(pipe_of(wan21)) == "wan21"
    assert calibration_for_pipeline(pipe_of(wan22, second=object())) == "wan22"
    assert calibration_for_pipeline(pipe_of(dict(tiny.TRANSFORMER_CONFIG))) == "tiny"
    with pytest.raises(ValueError, match="no speedup calibration is known.*'num_layers': 40.*one transformer"):
        calibration_for_pipeline(pipe_of(wan22))  # Wan2.1-14B: no calibration of ours
    assert calibration_for_pipeline(tiny.load_morca_tiny()) == "tiny"  # the shipped pipeline itself
    small = make_pipe("wan21", with_text_encoder=False, with_vae=True)  # a test architecture: no calibration
    with pytest.raises(ValueError, match="no speedup calibration is known"):
        morca_env.accelerate(small, UniformInterval(), speedup=2.0, **call(small))
    # accelerate's default: the named model's curve (a Wan2.1 curve here would give another K)
    monkeypatch.setattr("morca_env.speedup.files.calibration_for_pipeline", lambda pipe: "tiny")
    max_budget = budget_spec(small, CALL["num_inference_steps"]).max_budget
    tiny_k = load_calibration("tiny", 12, max_budget).budget_for_speedup(2.5)
    assert tiny_k != load_calibration("wan21", 12, max_budget).budget_for_speedup(2.5)
    assert sum(morca_env.accelerate(small, UniformInterval(), speedup=2.5, **call(small)).schedule) == tiny_k


def batched_call(pipe, embeds, seeds, **extra):
    return dict(prompt_embeds=torch.cat([e[0] for e in embeds]), negative_prompt_embeds=torch.cat([e[1] for e in embeds]),
                generator=[torch.Generator().manual_seed(s) for s in seeds], **{**CALL, **extra})


def separate_call(pipe, embeds, seed, **extra):
    return dict(prompt_embeds=embeds[0], negative_prompt_embeds=embeds[1], generator=torch.Generator().manual_seed(seed),
                **{**CALL, **extra})


def assert_videos_equal_separate_calls(batch, separate: list, budgets):
    for n, one in enumerate(separate):
        assert batch.schedules[n] == one.schedule and sum(one.schedule) == budgets[n] == batch.budgets[n]
        torch.testing.assert_close(batch.output.frames[n], one.output.frames[0], rtol=1e-3, atol=1e-4)


# (a fixed schedule, a random one, and SeaCache's rule on D_t: per-video schedulers copied from the one given)
POLICIES = {"uniform": UniformInterval, "random-feasible": lambda: RandomFeasible(3),
            "seacache-rule": lambda: SeaCacheThreshold(0.2)}


@pytest.mark.parametrize("name", list(POLICIES))
def test_a_batch_of_four_prompts_equals_four_separate_calls(name):
    pipe = make_pipe("wan21", with_text_encoder=False, with_vae=True)
    embeds, seeds, budgets = [prompt_embeds(seed) for seed in range(4)], [10, 11, 12, 13], [3, 4, 5, 6]
    batch = morca_env.accelerate(pipe, POLICIES[name](), budget=budgets, **batched_call(pipe, embeds, seeds))
    separate = [morca_env.accelerate(pipe, POLICIES[name](), budget=k, **separate_call(pipe, e, s))
                for e, s, k in zip(embeds, seeds, budgets)]
    assert_videos_equal_separate_calls(batch, separate, budgets)
    assert len({tuple(s) for s in batch.schedules}) == 4  # each video decided on its own
    assert batch.schedule == batch.schedules[0] and batch.budget == 3


@pytest.mark.parametrize("name", list(POLICIES))
def test_num_videos_per_prompt_equals_separate_calls_with_each_generator(name):
    pipe = make_pipe("wan22", with_text_encoder=False, with_vae=True)
    embeds = prompt_embeds(3)
    batch = morca_env.accelerate(pipe, POLICIES[name](), speedup=[1.5, 2.5], calibration="wan22",
                                 num_videos_per_prompt=2, guidance_scale_2=3.0, **batched_call(pipe, [embeds], [7, 8]))
    separate = [morca_env.accelerate(pipe, POLICIES[name](), speedup=s, calibration="wan22", guidance_scale_2=3.0,
                                     **separate_call(pipe, embeds, seed)) for s, seed in ((1.5, 7), (2.5, 8))]
    assert batch.budgets[0] < batch.budgets[1]
    assert_videos_equal_separate_calls(batch, separate, batch.budgets)


def test_batched_calls_refuse_bad_counts_and_run_time_rules():
    from morca_env.schedulers import make

    pipe = make_pipe("wan21", with_text_encoder=False, with_vae=True)
    kwargs = batched_call(pipe, [prompt_embeds(0), prompt_embeds(1)], [1, 2])
    with pytest.raises(ValueError, match=r"budget has 3 values for a call of 2 videos .*valid: one for all, or 2"):
        morca_env.accelerate(pipe, UniformInterval(), budget=[1, 2, 3], **kwargs)
    with pytest.raises(ValueError, match=r"3 policies for a call of 2 videos"):
        morca_env.accelerate(pipe, [UniformInterval()] * 3, budget=2, **kwargs)
    with pytest.raises(ValueError, match=r"num_videos_per_prompt=0 must be a positive integer"):
        morca_env.accelerate(pipe, UniformInterval(), budget=2, **{**kwargs, "num_videos_per_prompt": 0})
    with pytest.raises(RuntimeError, match="reads the live run .* one video at a time"):
        morca_env.accelerate(pipe, make("first-block-cache", pipe=pipe), budget=2, **kwargs)
    assert sum(morca_env.accelerate(pipe, [UniformInterval(), RandomFeasible(0)], budget=2, **kwargs).schedules[1]) == 2
