import numpy as np
import pytest
import torch

from morca_env.diffusion.features import feature_shapes, latent_features, stack_features


@pytest.mark.parametrize("channels,frames,h,w", [(16, 21, 60, 104), (3, 8, 32, 32), (4, 3, 4, 4)])
def test_shapes_follow_latent_channels(channels, frames, h, w):
    x = torch.randn(1, channels, frames, h, w)
    f = latent_features(x)
    assert f.pooled.shape == (1, channels, 4, 8, 8)  # the latent's (1, C, time, H, W) layout
    assert f.mean.shape == f.var.shape == (1, channels, 1, 8, 8)
    assert latent_features(x[0]).mean.shape == (1, channels, 1, 8, 8)  # an unbatched latent alike
    pooled, temporal = stack_features(f, f, f)
    assert pooled.shape == feature_shapes(channels)["pooled"] and temporal.shape == feature_shapes(channels)["temporal"]
    assert pooled.dtype == temporal.dtype == np.float32


def test_values_are_block_means_of_the_latent():
    x = torch.randn(1, 2, 8, 16, 16, generator=torch.Generator().manual_seed(0))
    f = latent_features(x)
    block = x[0, 1, 2:4, 4:6, 10:12]  # pooled cell (t=1, h=2, w=5) of channel 1
    assert f.pooled[0, 1, 1, 2, 5] == pytest.approx(block.mean().item(), abs=1e-6)
    mean_t = x[0, 0].mean(dim=0)[6:8, 0:2].mean()
    var_t = x[0, 0].var(dim=0, unbiased=False)[6:8, 0:2].mean()
    assert f.mean[0, 0, 0, 3, 0] == pytest.approx(mean_t.item(), abs=1e-6)
    assert f.var[0, 0, 0, 3, 0] == pytest.approx(var_t.item(), abs=1e-6)


@pytest.mark.parametrize("frames,h,w", [(8, 16, 16), (21, 12, 20), (4, 9, 16)])
def test_pools_equal_torch_adaptive_pools_whether_or_not_the_grid_divides(frames, h, w):
    """The fixed-kernel shortcut (grid divides the latent) and the adaptive fallback give the adaptive pools' numbers."""
    x = torch.randn(1, 2, frames, h, w, generator=torch.Generator().manual_seed(1))
    f = latent_features(x)
    mean_t, var_t = x[0].mean(dim=1), x[0].var(dim=1, unbiased=False)
    assert torch.allclose(f.pooled[0], torch.nn.functional.adaptive_avg_pool3d(x[0], (4, 8, 8)), atol=1e-6)
    assert torch.allclose(f.mean[0, :, 0], torch.nn.functional.adaptive_avg_pool2d(mean_t, (8, 8)), atol=1e-6)
    assert torch.allclose(f.var[0, :, 0], torch.nn.functional.adaptive_avg_pool2d(var_t, (8, 8)), atol=1e-5)


def test_stack_order_current_previous_last_recompute():
    # two channels (value v + 10 c) whose frames alternate by +-c: each feature's channels stay together, in order
    def latent(v):
        x = torch.full((1, 2, 4, 8, 8), v)
        x[0, 1] += 10 + torch.tensor([1.0, -1.0, 1.0, -1.0])[:, None, None]
        return x
    a, b, c = (latent_features(latent(v)) for v in (1.0, 2.0, 3.0))
    pooled, temporal = stack_features(a, b, c)
    assert pooled[:, 0, 0, 0].tolist() == [1.0, 12.0, 2.0, 13.0, 3.0, 14.0]  # time cell 0 = frame 0
    assert temporal[:, 0, 0].tolist() == [1.0, 11.0, 2.0, 12.0, 3.0, 13.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0]


def test_rejects_batches():
    with pytest.raises(ValueError, match="batch size 1"):
        latent_features(torch.randn(2, 3, 4, 8, 8))


def test_stack_features_returns_float32_views_without_a_second_copy():
    # stack_features runs once per environment step: the float32 arrays are the concatenated
    # tensors' buffers (astype(copy=False)), not another copy of them
    a, b, c = (latent_features(torch.full((1, 2, 4, 8, 8), v)) for v in (1.0, 2.0, 3.0))
    pooled, temporal = stack_features(a, b, c)
    assert pooled.dtype == temporal.dtype == np.float32
    assert not pooled.flags.owndata and not temporal.flags.owndata
