import pytest
import torch
from diffusers import SeaCacheConfig

from morca_env.env import MorcaEnv
from morca_env.schedulers.rules.seacache import SeaCacheThreshold
from morca_env.diffusion.signals import (
    StepDistanceTracker, official_signal_input, relative_l1, sea_filter, seacache_reuses)
from tests.conftest import make_pipe

N = 20


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


@pytest.mark.parametrize("shape,axes", [((2, 5, 6, 7), (1, 2, 3)), ((1, 3, 4, 4, 8), (1, 2, 3)), ((3, 6, 8), (1, 2)),
                                         ((4, 10), (1,))])
@pytest.mark.parametrize("sigma", [0.02, 0.5, 0.97, 1.0])
def test_sea_filter_matches_formula(shape, axes, sigma):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    ours = sea_filter(x, sigma, axes)
    assert torch.allclose(ours.double(), reference_filter(x, sigma, axes), rtol=1e-4, atol=1e-5)


def official_indicator(module, args, kwargs):
    """diffusers' `raw_vision_callback` for the official signal: block 0's modulated input, as (D, F', H', W')."""
    u = official_signal_input(module, kwargs["hidden_states"], kwargs["timestep"])
    return [item.movedim(-1, 0) for item in u.unbind(0)]


def diffusers_schedule(pipe, threshold, signal):
    """The schedule diffusers' own SeaCache runs, set to the official rule: reuse the last residual
    (order 0), no cap on consecutive reuses, first and last steps forced, power 3, our signal."""
    pipe.transformer.enable_cache(SeaCacheConfig(
        threshold=threshold, residual_order=0, max_consecutive_cached=0, retention_steps=1, cache_end_steps=1,
        power_exp=3.0, raw_vision_callback=official_indicator if signal == "official" else None))
    calls, schedule = [], []
    handle = pipe.transformer.blocks[0].attn1.register_forward_hook(lambda *_: calls.append(1))

    def on_step_end(p, i, t, kwargs):
        schedule.append(0 if calls else 1)
        calls.clear()
        return {}

    pipe(prompt="a red ball", negative_prompt="", guidance_scale=5.0, height=32, width=32, num_frames=9,
         num_inference_steps=N, output_type="latent", max_sequence_length=512,
         generator=torch.Generator().manual_seed(0), callback_on_step_end=on_step_end)
    handle.remove()
    pipe.transformer.disable_cache()
    return schedule


def shipped_schedule(env, delta):
    """The shipped `SeaCacheThreshold` scheduler played in MorcaEnv (budget-free: only forced steps bind)."""
    policy = SeaCacheThreshold(delta)
    obs, info = env.reset(options={"prompt": "a red ball", "seed": 0})
    policy.reset(obs, info)
    done = False
    while not done:
        obs, _, done, _, info = env.step(policy(obs))
        assert not info["projected"]
    return info["schedule"]


@pytest.mark.parametrize("signal,thresholds", [("official", (0.1, 0.2, 0.4, 0.8)), ("latent", (0.1, 0.2, 0.4, 0.8))])
def test_seacache_threshold_scheduler_matches_diffusers_seacache(signal, thresholds, tmp_path):
    pipe = make_pipe("wan21", with_text_encoder=True, with_vae=True, vocabulary=["red", "ball"])
    expected = {delta: diffusers_schedule(pipe, delta, signal) for delta in thresholds}
    env = MorcaEnv("wan21", pipeline=pipe, signal=signal, enforce_budget=False, budget=0, num_inference_steps=N,
                   height=32, width=32, num_frames=9, reference_cache_dir=str(tmp_path), lpips=False)
    assert env.config.guidance_scale == 5.0 and env.config.max_sequence_length == 512
    for delta in thresholds:
        assert shipped_schedule(env, delta) == expected[delta], delta
    env.close()
    assert len({tuple(s) for s in expected.values()}) >= 3  # the thresholds give different schedules


@pytest.mark.parametrize("dtype,fp32_time_embedder", [(torch.float32, True), (torch.bfloat16, True),
                                                      (torch.bfloat16, False)])
def test_official_signal_is_block0_modulated_input(wan21_pipe, dtype, fp32_time_embedder):
    """Matches the input block 0's attention sees, on a non-square grid and for a bf16 model (float32 latents),
    with the time embedder kept in float32 (Wan's _keep_in_fp32_modules) or cast with the rest."""
    transformer = wan21_pipe.transformer.to(dtype)
    if fp32_time_embedder:
        transformer.condition_embedder.time_embedder.float()  # as Wan's _keep_in_fp32_modules loads it
    captured = {}
    handle = transformer.blocks[0].attn1.register_forward_pre_hook(lambda m, args: captured.setdefault("u", args[0]))
    x = torch.randn(1, 4, 3, 4, 8)  # (F', H', W') = (3, 2, 4) tokens
    t = torch.tensor(637.0)
    with torch.no_grad():
        transformer(x.to(dtype), t.expand(1), torch.randn(1, 8, 16, dtype=dtype), return_dict=False)
        ours = official_signal_input(transformer, x, t)
    handle.remove()
    assert ours.shape == (1, 3, 2, 4, 32)  # (B, F', H', W', D)
    tolerance = 1e-6 if dtype == torch.float32 else 2e-2
    assert torch.allclose(ours.reshape(1, 24, 32).to(dtype).float(), captured["u"].float(), atol=tolerance)


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


def test_relative_l1_is_a_per_item_ratio_averaged_over_the_batch():
    """Each video's distance is relative to its own scale, then the batch is averaged."""
    previous = torch.stack([torch.ones(2, 3), 10 * torch.ones(2, 3)])
    current = previous + torch.stack([torch.full((2, 3), 0.5), torch.full((2, 3), 1.0)])
    assert relative_l1(current, previous) == pytest.approx((0.5 / 1 + 1.0 / 10) / 2)
    assert relative_l1(torch.ones(1, 4), torch.zeros(1, 4)) > 1e6  # a zero previous signal: huge, not negative
    one_video = torch.tensor([[2.0, -4.0, 2.0, -2.0]])  # one video (its own code path): mean|diff| / mean|previous|
    assert relative_l1(one_video + torch.tensor([[1.0, 1.0, -1.0, 1.0]]), one_video) == pytest.approx(1.0 / 2.5)
    assert relative_l1(one_video, one_video) == 0.0


def test_official_signal_follows_a_weight_change_after_the_memo(wan21_pipe):
    """The time modulation is memoised per timestep; writing or replacing a weight it reads must not serve stale values."""
    transformer = wan21_pipe.transformer
    x, t = torch.randn(1, 4, 3, 4, 8), torch.tensor(637.0)

    def fresh():  # block 0's input as the transformer computes it, no memo involved
        captured = {}
        handle = transformer.blocks[0].attn1.register_forward_pre_hook(lambda m, args: captured.setdefault("u", args[0]))
        with torch.no_grad():
            transformer(x, t.expand(1), torch.randn(1, 8, 16), return_dict=False)
        handle.remove()
        return captured["u"].reshape(1, 3, 2, 4, 32)

    first = official_signal_input(transformer, x, t)
    assert torch.equal(official_signal_input(transformer, x, t), first)  # a memo hit gives the same tensor values
    with torch.no_grad():
        transformer.blocks[0].scale_shift_table.add_(0.5)  # in place
    assert torch.allclose(official_signal_input(transformer, x, t), fresh(), atol=1e-5)
    linear = transformer.condition_embedder.time_proj
    linear.weight = torch.nn.Parameter(linear.weight.detach() * 2)  # replaced
    changed = official_signal_input(transformer, x, t)
    assert torch.allclose(changed, fresh(), atol=1e-5)
    assert not torch.allclose(changed, first, atol=1e-3)
    assert torch.allclose(official_signal_input(transformer, x, torch.tensor(200.0)).reshape(1, -1),
                          official_signal_input(transformer, x, torch.tensor(200.0)).reshape(1, -1))
    # a weight replaced by a tensor on the same storage (same address and version, other values): a
    # transposed view of the square linear_2 weight; only the parameter's identity tells it apart
    square = transformer.condition_embedder.time_embedder.linear_2
    before = official_signal_input(transformer, x, t)
    transposed = torch.nn.Parameter(square.weight.detach().t())
    assert transposed.data_ptr() == square.weight.data_ptr() and transposed._version == square.weight._version
    square.weight = transposed
    assert torch.allclose(official_signal_input(transformer, x, t), fresh(), atol=1e-5)
    assert not torch.allclose(official_signal_input(transformer, x, t), before, atol=1e-3)
    # a bias (not only the first parameter of a module) and a weight one module deeper are read too
    before = official_signal_input(transformer, x, t)
    first = transformer.condition_embedder.time_embedder.linear_1
    first.bias = torch.nn.Parameter(first.bias.detach() + 1.0)
    assert torch.allclose(official_signal_input(transformer, x, t), fresh(), atol=1e-5)
    assert not torch.allclose(official_signal_input(transformer, x, t), before, atol=1e-3)


def test_official_signal_of_a_batch_is_block0_input_per_item(wan21_pipe):
    """A batch of two (per-item timesteps, or one timestep for both) takes the unfused path: it must match
    block 0's input for the whole batch and each item's own signal."""
    transformer = wan21_pipe.transformer
    g = torch.Generator().manual_seed(3)
    x, t = torch.randn(2, 4, 3, 4, 8, generator=g), torch.tensor([637.0, 200.0])
    captured = {}
    handle = transformer.blocks[0].attn1.register_forward_pre_hook(lambda m, args: captured.setdefault("u", args[0]))
    with torch.no_grad():
        transformer(x, t, torch.randn(2, 8, 16, generator=g), return_dict=False)
    handle.remove()
    ours = official_signal_input(transformer, x, t)
    assert ours.shape == (2, 3, 2, 4, 32)
    assert torch.allclose(ours.reshape(2, 24, 32), captured["u"], atol=1e-5)
    for i in range(2):
        assert torch.allclose(ours[i:i + 1], official_signal_input(transformer, x[i:i + 1], t[i]), atol=1e-5)
    shared = official_signal_input(transformer, x, torch.tensor(637.0))  # one timestep for the batch
    assert torch.allclose(shared[1:], official_signal_input(transformer, x[1:], torch.tensor(637.0)), atol=1e-5)
    assert not torch.allclose(shared[1:], ours[1:], atol=1e-3)


def test_seacache_reuses_only_strictly_below_the_threshold():
    assert seacache_reuses(0.19, 0.2) and not seacache_reuses(0.2, 0.2) and not seacache_reuses(0.21, 0.2)
    assert not seacache_reuses(0.0, 0.0)


def test_sea_filter_applies_each_axis_once_in_any_order():
    x = torch.randn(1, 3, 4, 6, 8, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(sea_filter(x, 0.4, (4, 2, 3)), sea_filter(x, 0.4, (2, 3, -1)), atol=1e-6)
    assert torch.allclose(sea_filter(x, 0.4, (2, 3, 4)).double(), reference_filter(x, 0.4, (2, 3, 4)), rtol=1e-4, atol=1e-5)


def test_tracker_distance_is_relative_l1_per_item_averaged_over_a_batch():
    """Each video of a batch is measured against its own scale (relative_l1), also inside the tracker."""
    tracker = StepDistanceTracker("latent")
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(2, 2, 3, 8, 8, generator=g) * torch.tensor([1.0, 5.0]).view(2, 1, 1, 1, 1) for _ in range(3)]
    sigmas = (0.9, 0.7, 0.5)
    tracker.observe(xs[0], sigmas[0])
    for i in (1, 2):
        expected = relative_l1(sea_filter(xs[i], sigmas[i], (2, 3, 4)), sea_filter(xs[i - 1], sigmas[i - 1], (2, 3, 4)))
        assert tracker.observe(xs[i], sigmas[i]) == pytest.approx(expected, rel=1e-5)
    tracker.reset()
    assert tracker.observe(xs[2], 0.5) == 0.0


def test_tracker_plans_the_filter_per_sigma_and_equals_the_public_functions():
    """The tracker's planned filter in its own layout gives bitwise the distances of `sea_filter` + `relative_l1`,
    for every sigma of a video and again for a second video (plans reused), on the official (tokens-last) layout."""
    tracker = StepDistanceTracker("official")
    g = torch.Generator().manual_seed(2)
    sigmas = (0.95, 0.8, 0.6, 0.35, 0.1)
    for video in range(2):
        tracker.reset()
        xs = [torch.randn(1, 4, 8, 8, 16, generator=g) for _ in sigmas]
        assert tracker.observe(xs[0], sigmas[0]) == 0.0
        for i in range(1, len(sigmas)):
            expected = relative_l1(sea_filter(xs[i], sigmas[i], (1, 2, 3)), sea_filter(xs[i - 1], sigmas[i - 1], (1, 2, 3)))
            assert tracker.observe(xs[i], sigmas[i]) == expected, (video, i)


def _denoiser(pipe, steps=8):
    from morca_env.diffusion.denoiser import DenoiserConfig, StepwiseDenoiser
    from tests.conftest import prompt_embeds

    den = StepwiseDenoiser(pipe, DenoiserConfig(num_inference_steps=steps, height=16, width=16, num_frames=5))
    cond, uncond = prompt_embeds()
    return den, dict(prompt_embeds=cond, negative_prompt_embeds=uncond)


@pytest.mark.parametrize("kind", ["wan21", "wan22"])
@pytest.mark.parametrize("hooked", [False, True])
def test_signal_of_each_step_is_official_signal_input(kind, hooked):
    """The env's per-step signal (transformer read once per video, conv + layer norm fused) equals
    `official_signal_input` at every step, for both experts of Wan2.2, on the fused path and on the
    generic one a hooked patch embedding takes; and over a second video served from the memo."""
    from morca_env.diffusion.signals import signal_input_for_step

    pipe = make_pipe(kind, with_text_encoder=False, with_vae=True)
    den, embeds = _denoiser(pipe)
    if hooked:
        for model in den.experts:
            model.patch_embedding.register_forward_hook(lambda module, args, out: out * 1.5)
    for seed in (0, 1):
        den.start(seed=seed, **embeds)
        for i in range(den.num_steps):
            ours = signal_input_for_step("official", den)
            expected = official_signal_input(*den.step_input(i))
            assert ours.shape == expected.shape and not ours.requires_grad  # the weights do require grad
            assert torch.allclose(ours, expected, atol=1e-6, rtol=1e-6), (kind, hooked, seed, i)
            den.step(reuse=i % 3 == 2 and den.cache_valid(i))
    assert len({den.expert_of_step[i] for i in range(den.num_steps)}) == (2 if kind == "wan22" else 1)


def test_signal_through_an_affine_norm1_builds_no_graph(wan21_pipe):
    """A block-0 norm with trained affine weights (not Wan's) is called as a module, under no_grad: the signal
    equals `official_signal_input` and carries no autograd graph."""
    from morca_env.diffusion.signals import signal_input_for_step

    den, embeds = _denoiser(wan21_pipe)
    block = den.experts[0].blocks[0]
    original = block.norm1
    dim = block.scale_shift_table.shape[-1]
    block.norm1 = torch.nn.LayerNorm(dim, eps=1e-6, elementwise_affine=True)
    try:
        with torch.no_grad():
            block.norm1.weight.uniform_(0.5, 1.5)
        assert block.norm1.weight.requires_grad
        den.start(seed=0, **embeds)
        ours = signal_input_for_step("official", den)
        assert not ours.requires_grad and ours.grad_fn is None
        assert torch.allclose(ours, official_signal_input(*den.step_input(0)), atol=1e-6)
    finally:
        block.norm1 = original


def test_signal_reads_the_weights_once_per_video(wan21_pipe):
    """A weight written mid-video is seen from the next video on (as a pipeline call reads its weights once)."""
    from morca_env.diffusion.signals import signal_input_for_step

    den, embeds = _denoiser(wan21_pipe)
    den.start(seed=0, **embeds)
    before = signal_input_for_step("official", den)
    den.step(reuse=False)
    with torch.no_grad():
        den.experts[0].blocks[0].scale_shift_table.add_(0.5)
    den.start(seed=0, **embeds)
    after = signal_input_for_step("official", den)
    assert torch.allclose(after, official_signal_input(*den.step_input(0)), atol=1e-6)
    assert not torch.allclose(after, before, atol=1e-3)
