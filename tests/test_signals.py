import pytest
import torch
from diffusers import SeaCacheConfig

from morca_env.denoiser import DenoiserConfig, StepwiseDenoiser
from morca_env.signals import (StepDistanceTracker, official_signal_input, relative_l1, sea_filter,
                               seacache_reuses)
from tests.conftest import make_pipe

N = 20
CFG = DenoiserConfig(num_inference_steps=N, height=32, width=32, num_frames=9, max_sequence_length=8)


def reference_filter(x, sigma, axes, p=3.0):
    """DESIGN.md's formula with complex FFTs over the full grid."""
    sigma = min(max(sigma, 1e-6), 1 - 1e-6)
    a, b = 1 - sigma, sigma
    gain = torch.ones(())
    for axis in axes:
        s = 1.0 / (torch.fft.fftfreq(x.shape[axis], dtype=torch.float64).abs() ** p + 1e-16)
        g = a * s / (a * a * s + b * b + 1e-16)
        shape = [1] * x.ndim
        shape[axis] = -1
        gain = gain * g.reshape(shape)
    gain = gain / gain.mean()
    return torch.fft.ifftn(torch.fft.fftn(x.double(), dim=axes) * gain, dim=axes).real


@pytest.mark.parametrize("shape,axes", [((2, 5, 6, 7), (1, 2, 3)), ((1, 3, 4, 4, 8), (1, 2, 3))])
@pytest.mark.parametrize("sigma", [0.02, 0.5, 0.97, 1.0])
def test_sea_filter_matches_formula(shape, axes, sigma):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    ours = sea_filter(x, sigma, axes)
    assert torch.allclose(ours.double(), reference_filter(x, sigma, axes), rtol=1e-4, atol=1e-5)


def diffusers_schedule(pipe, threshold):
    pipe.transformer.enable_cache(SeaCacheConfig(threshold=threshold, residual_order=0, max_consecutive_cached=0,
                                                 retention_steps=1, cache_end_steps=1))
    calls, schedule = [], []
    handle = pipe.transformer.blocks[0].attn1.register_forward_hook(lambda *_: calls.append(1))

    def on_step_end(p, i, t, kwargs):
        schedule.append(0 if calls else 1)
        calls.clear()
        return {}

    pipe(prompt="a red ball", height=32, width=32, num_frames=9, num_inference_steps=N, output_type="latent",
         max_sequence_length=8, generator=torch.Generator().manual_seed(0), callback_on_step_end=on_step_end)
    handle.remove()
    pipe.transformer.disable_cache()
    return schedule


def our_schedule(pipe, threshold):
    den = StepwiseDenoiser(pipe, CFG)
    tracker = StepDistanceTracker("latent")
    den.start(prompt="a red ball", seed=0)
    schedule = []
    while not den.done:
        i = den.step_index
        tracker.observe(den.latents, den.sigma(i))
        action = int(i not in (0, N - 1) and seacache_reuses(tracker.accumulated, threshold))
        tracker.record(action)
        den.step(reuse=bool(action))
        schedule.append(action)
    den.close()
    return schedule


def test_latent_signal_threshold_rule_matches_diffusers_seacache():
    pipe = make_pipe("wan21", with_text_encoder=True, with_vae=True, vocabulary=["red", "ball"])
    schedules = set()
    for threshold in (0.1, 0.2, 0.4, 0.8):
        ours = our_schedule(pipe, threshold)
        assert ours == diffusers_schedule(pipe, threshold), threshold
        schedules.add(tuple(ours))
    assert len(schedules) >= 3


def test_official_signal_is_block0_modulated_input(wan21_pipe):
    transformer = wan21_pipe.transformer
    captured = {}
    handle = transformer.blocks[0].attn1.register_forward_pre_hook(lambda m, args: captured.setdefault("u", args[0]))
    x = torch.randn(1, 4, 3, 4, 4)
    t = torch.tensor(637.0)
    with torch.no_grad():
        transformer(x, t.expand(1), torch.randn(1, 8, 16), return_dict=False)
        ours = official_signal_input(transformer, x, t)
    handle.remove()
    assert ours.shape == (1, 3, 2, 2, 32)  # (B, F', H', W', D)
    assert torch.allclose(ours.reshape(1, 12, 32), captured["u"], atol=1e-6)


def test_tracker_accumulates_until_recompute():
    tracker = StepDistanceTracker("latent")
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(1, 2, 3, 8, 8, generator=g) for _ in range(4)]
    assert tracker.observe(xs[0], 0.9) == 0.0
    tracker.record(0)
    d1 = tracker.observe(xs[1], 0.8)
    expected = relative_l1(sea_filter(xs[1], 0.8, (2, 3, 4)), sea_filter(xs[0], 0.9, (2, 3, 4)))
    assert d1 == pytest.approx(expected)
    tracker.record(1)
    d2 = tracker.observe(xs[2], 0.7)
    assert tracker.accumulated == pytest.approx(d1 + d2)
    tracker.record(0)
    d3 = tracker.observe(xs[3], 0.6)
    assert tracker.accumulated == pytest.approx(d3)
    with pytest.raises(ValueError, match="signal kind"):
        StepDistanceTracker("teacache")
