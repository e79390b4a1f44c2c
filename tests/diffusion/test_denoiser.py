import pytest
import torch

from morca_env.diffusion.denoiser import DenoiserConfig, StepwiseDenoiser
from tests.conftest import prompt_embeds

CFG = dict(num_inference_steps=12, height=32, width=32, num_frames=9, max_sequence_length=8)


def run_denoiser(pipe, config, seed, embeds, schedule=None):
    den = StepwiseDenoiser(pipe, config)
    den.start(prompt_embeds=embeds[0], negative_prompt_embeds=embeds[1], seed=seed)
    for a in schedule or [0] * den.num_steps:
        den.step(reuse=bool(a))
    den.close()
    return den


@pytest.mark.parametrize("kind", ["wan21", "wan22"])
def test_no_reuse_matches_wan_pipeline(kind, wan21_pipe, wan22_pipe):
    pipe = wan21_pipe if kind == "wan21" else wan22_pipe
    g2 = 3.0 if kind == "wan22" else None
    embeds = prompt_embeds(seed=1)
    expected = pipe(prompt_embeds=embeds[0], negative_prompt_embeds=embeds[1], guidance_scale=5.0,
                    guidance_scale_2=g2, output_type="latent", generator=torch.Generator().manual_seed(7),
                    height=32, width=32, num_frames=9, num_inference_steps=12).frames
    den = run_denoiser(pipe, DenoiserConfig(guidance_scale=5.0, guidance_scale_2=g2, **CFG), 7, embeds)
    assert den.latents.shape == expected.shape
    assert (den.latents - expected).abs().max().item() <= 1e-6


def test_wan22_switches_expert_at_boundary(wan22_pipe):
    den = StepwiseDenoiser(wan22_pipe, DenoiserConfig(guidance_scale=4.0, guidance_scale_2=3.0, **CFG))
    boundary = 0.875 * den.scheduler.config.num_train_timesteps
    switch = den.expert_switch_step
    assert switch is not None and 0 < switch < den.num_steps
    assert all(t >= boundary for t in den.timesteps[:switch]) and all(t < boundary for t in den.timesteps[switch:])
    assert den.expert(switch) is wan22_pipe.transformer_2 and den.expert(0) is wan22_pipe.transformer


def test_reuse_changes_result_and_needs_a_cache(wan21_pipe):
    embeds = prompt_embeds()
    config = DenoiserConfig(**CFG)
    plain = run_denoiser(wan21_pipe, config, 0, embeds).latents
    reused = run_denoiser(wan21_pipe, config, 0, embeds, [0, 1, 1, 0, 1, 0, 1, 1, 0, 1, 0, 0]).latents
    assert (plain - reused).abs().max() > 1e-4
    den = StepwiseDenoiser(wan21_pipe, config)
    den.start(prompt_embeds=embeds[0], negative_prompt_embeds=embeds[1])
    with pytest.raises(RuntimeError, match="cached residual"):
        den.step(reuse=True)


def test_decode_matches_wan_pipeline_video_and_errors(wan21_pipe):
    """decode() gives the frames WanPipeline itself outputs (latent de-normalisation, VAE, [-1, 1] -> [0, 1])."""
    embeds = prompt_embeds(seed=2)
    expected = wan21_pipe(prompt_embeds=embeds[0], negative_prompt_embeds=embeds[1], guidance_scale=5.0,
                          output_type="pt", generator=torch.Generator().manual_seed(3), height=32, width=32,
                          num_frames=9, num_inference_steps=12).frames[0]  # (F, 3, H, W) in [0, 1]
    den = run_denoiser(wan21_pipe, DenoiserConfig(guidance_scale=5.0, **CFG), 3, embeds)
    video = den.decode()
    assert video.shape == (9, 32, 32, 3)
    assert 0.05 < float(video.std()) and (video - expected.permute(0, 2, 3, 1)).abs().max().item() <= 1e-5
    with pytest.raises(RuntimeError, match="no denoising step left"):
        den.step(reuse=False)
    with pytest.raises(ValueError, match="no text encoder"):
        den.start(prompt="a red ball")


def test_text_encoder_path_matches_pipeline():
    from tests.conftest import make_pipe

    pipe = make_pipe("wan21", with_text_encoder=True, with_vae=False, vocabulary=["red", "ball"])
    latents = torch.randn(1, 4, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    expected = pipe(prompt="a red ball", latents=latents, output_type="latent", num_inference_steps=6,
                    height=16, width=16, max_sequence_length=8).frames
    den = StepwiseDenoiser(pipe, DenoiserConfig(num_inference_steps=6, height=16, width=16, num_frames=3,
                                                max_sequence_length=8))
    den.start(prompt="a red ball", latents=latents)
    while not den.done:
        den.step(reuse=False)
    assert (den.latents - expected).abs().max().item() <= 1e-6


@pytest.mark.parametrize("field,value", [("num_inference_steps", 0), ("height", -1), ("guidance_scale", -1.0)])
def test_config_validation(field, value):
    with pytest.raises(ValueError, match=field):
        DenoiserConfig(**{field: value})


def test_a_batch_starts_each_video_as_its_own_start_and_takes_one_decision_per_video():
    from morca_env.models.random_wan import build_tiny_wan_pipeline

    pipe = build_tiny_wan_pipeline("wan21", with_vae=True, vocabulary=["red", "blue", "ball"])
    config = DenoiserConfig(num_inference_steps=6, height=32, width=32, num_frames=9)
    den = StepwiseDenoiser(pipe, config)
    singles = []
    for prompt, seed in (("a red ball", 3), ("a blue ball", 4)):
        latents = den.start(prompt=prompt, seed=seed).clone()
        singles.append((latents, den.prompt_embeds.clone()))
    batch = den.start_batch(["a red ball", "a blue ball"], [3, 4])
    assert den.batch_size == 2
    for n, (latents, embeds) in enumerate(singles):  # bitwise: each encoded and drawn on its own
        assert torch.equal(batch[n:n + 1], latents) and torch.equal(den.prompt_embeds[n:n + 1], embeds)
    den.step(reuse=[False, False])
    with pytest.raises(ValueError, match="3 decisions for a batch of 2 videos"):
        den.step(reuse=[True, False, True])
    den.step(reuse=[True, False])
    while not den.done:
        den.step(reuse=False)
    assert den.decode_batch().shape == (2, 9, 32, 32, 3)
    with pytest.raises(RuntimeError, match="call decode_batch"):
        den.decode()
    with pytest.raises(ValueError, match="one seed per prompt"):
        den.start_batch(["a red ball"], [1, 2])
    den.close()
