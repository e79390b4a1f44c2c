"""Fidelity metrics on tiny videos: 8-bit quantisation, PSNR over the whole video, SSIM per frame, LPIPS batching."""

import math

import numpy as np
import pytest
import torch

from morca_env.diffusion import metrics
from morca_env.diffusion.metrics import Lpips, psnr, ssim, to_uint8, video_metrics


def video(seed=0, frames=3, h=8, w=10):
    return torch.rand(frames, h, w, 3, generator=torch.Generator().manual_seed(seed))


def test_to_uint8_rounds_to_nearest_and_clamps():
    x = torch.tensor([-0.3, 0.0, 0.4 / 255, 0.6 / 255, 100.4 / 255, 1.0, 1.7])
    assert to_uint8(x).tolist() == [0, 0, 0, 1, 100, 255, 255]
    assert to_uint8(x).dtype == torch.uint8
    already = torch.tensor([3, 250], dtype=torch.uint8)
    assert to_uint8(already) is already


def test_psnr_is_the_mse_of_the_whole_quantised_video():
    a, b = video(0), video(1)
    qa, qb = (to_uint8(v).double() / 255 for v in (a, b))
    expected = 10 * math.log10(1.0 / float(((qa - qb) ** 2).mean()))
    assert psnr(a, b) == pytest.approx(expected, rel=1e-6)
    assert psnr(a, a) == math.inf
    # differences below half an 8-bit level vanish: the metric sees what a saved video shows
    assert psnr(a, (a + 0.4 / 255).clamp(0, 1)) > psnr(a, (a + 3 / 255).clamp(0, 1))
    with pytest.raises(ValueError, match="differs from reference shape"):
        psnr(a, video(0, frames=2))
    with pytest.raises(ValueError, match=r"expected a video of shape \(F, H, W, 3\)"):
        psnr(a[..., :2], a[..., :2])


def test_ssim_is_one_for_equal_videos_and_falls_with_noise_on_small_frames():
    a = video(0, h=8, w=10)  # smaller than the 11-tap Gaussian window (torchmetrics pads; it does not shrink it)
    slightly = (a + 0.02 * torch.randn(a.shape, generator=torch.Generator().manual_seed(5))).clamp(0, 1)
    assert ssim(a, a) == pytest.approx(1.0, abs=1e-6)
    assert 0.5 < ssim(a, slightly) < 0.999
    assert ssim(a, video(1, h=8, w=10)) < ssim(a, slightly)
    # per-frame SSIM averaged over frames: a video of two copies of a frame scores as the frame
    pair = torch.stack([a[0], a[0]]), torch.stack([slightly[0], slightly[0]])
    assert ssim(*pair) == pytest.approx(ssim(a[:1], slightly[:1]), rel=1e-5)


class RecordingNet(torch.nn.Module):
    """Stands in for LPIPS' AlexNet: score = mean |p - t| per frame; records the inputs it saw."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def forward(self, p, t):
        self.calls.append((p.clone(), t.clone()))
        return (p - t).abs().mean(dim=(1, 2, 3)).reshape(-1, 1, 1, 1)


def fake_lpips():
    model = Lpips.__new__(Lpips)  # the real constructor needs AlexNet weights on disk
    model.model, model.device = RecordingNet(), torch.device("cpu")
    return model


def test_lpips_upsamples_small_frames_scales_to_pm1_and_averages_every_frame_once():
    model = fake_lpips()
    a, b = video(0, frames=5, h=16, w=24), video(1, frames=5, h=16, w=24)
    score = model(a, b, batch_size=2)
    calls = model.model.calls
    assert [p.shape for p, _ in calls] == [(2, 3, 64, 96), (2, 3, 64, 96), (1, 3, 64, 96)]
    seen = torch.cat([p for p, _ in calls])
    assert seen.min() >= -1 and seen.max() <= 1 and seen.min() < -0.9 and seen.max() > 0.9
    expected = torch.cat([(p - t).abs().mean(dim=(1, 2, 3)) for p, t in calls]).mean()
    assert score == pytest.approx(float(expected), rel=1e-6)
    upsampled = torch.nn.functional.interpolate(metrics._frames(a) * 2 - 1, size=[64, 96], mode="bilinear",
                                                align_corners=False)
    assert torch.allclose(seen, upsampled, atol=1e-6)
    references = torch.nn.functional.interpolate(metrics._frames(b) * 2 - 1, size=[64, 96], mode="bilinear",
                                                 align_corners=False)
    assert torch.allclose(torch.cat([t for _, t in calls]), references, atol=1e-6)  # the reference side too
    big = video(2, frames=1, h=64, w=80)
    model(big, big)
    assert model.model.calls[-1][0].shape == (1, 3, 64, 80)  # large enough: no resampling


def test_video_metrics_reports_lpips_only_with_a_model():
    a, b = video(0), video(1)
    plain = video_metrics(a, b)
    assert plain == {"psnr": psnr(a, b), "ssim": ssim(a, b)}
    model = fake_lpips()
    full = video_metrics(a, b, model)
    assert set(full) == {"psnr", "ssim", "lpips"} and full["lpips"] == model(a, b)


def test_lpips_without_weights_says_how_to_get_them(tmp_path, monkeypatch):
    pytest.importorskip("lpips")  # an extra (`[lpips]`): skipped in the core CI venv
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    with pytest.raises(metrics.LpipsUnavailable, match="alexnet-owt-7be5be79.pth"):
        Lpips()
    assert metrics.alexnet_weights_path() == tmp_path / "hub" / "checkpoints" / metrics.ALEXNET_FILE


def test_frames_rejects_anything_but_a_video_of_rgb_frames():
    for bad in (torch.rand(8, 10, 3), torch.rand(2, 8, 10, 4), torch.rand(1, 2, 8, 10, 3)):
        with pytest.raises(ValueError, match=r"expected a video of shape \(F, H, W, 3\)"):
            metrics._frames(bad)
    frames = metrics._frames(video(0, frames=2, h=4, w=5))
    assert frames.shape == (2, 3, 4, 5) and frames.dtype == torch.float32


@pytest.mark.parametrize("h,w", [(8, 10), (9, 12), (16, 16), (12, 40)])
def test_ssim_is_torchmetrics_gaussian_ssim_on_the_quantised_frames(h, w):
    """torchmetrics' Gaussian SSIM (sigma 1.5, 11 taps) with data_range 1; `kernel_size` is only checked to be odd."""
    from torchmetrics.functional.image import structural_similarity_index_measure as tm_ssim

    a = video(0, h=h, w=w)
    b = (a + 0.05 * torch.randn(a.shape, generator=torch.Generator().manual_seed(3))).clamp(0, 1)
    expected = tm_ssim(metrics._frames(a), metrics._frames(b), data_range=1.0)
    assert ssim(a, b) == pytest.approx(float(expected), rel=1e-6)
    assert abs(float(tm_ssim(metrics._frames(a), metrics._frames(b), data_range=2.0)) - float(expected)) > 2e-5
    dim_a, dim_b = 0.3 + 0.3 * a, 0.3 + 0.3 * b  # low contrast: data_range stays 1, not the frames' spread
    expected = tm_ssim(metrics._frames(dim_a), metrics._frames(dim_b), data_range=1.0)
    assert ssim(dim_a, dim_b) == pytest.approx(float(expected), rel=1e-6)
    assert abs(float(tm_ssim(metrics._frames(dim_a), metrics._frames(dim_b))) - float(expected)) > 1e-4


def test_lpips_loads_alexnet_in_eval_mode_on_the_device(tmp_path, monkeypatch):
    pytest.importorskip("lpips")  # an extra (`[lpips]`): skipped in the core CI venv
    import lpips

    weights = tmp_path / "alexnet.pth"
    weights.write_bytes(b"")
    monkeypatch.setattr(metrics, "alexnet_weights_path", lambda: weights)
    made = {}

    class FakeLPIPS(torch.nn.Module):
        def __init__(self, **kwargs):
            super().__init__()
            made["kwargs"], made["device"], made["eval"] = kwargs, None, False

        def to(self, device):
            made["device"] = device
            return self

        def eval(self):
            made["eval"] = True
            return self

    monkeypatch.setattr(lpips, "LPIPS", FakeLPIPS)
    model = Lpips(device="cpu")
    assert made == {"kwargs": {"net": "alex", "verbose": False}, "device": "cpu", "eval": True}
    assert isinstance(model.model, FakeLPIPS) and model.device == torch.device("cpu")
    assert Lpips().device == torch.device("cpu") and made["device"] == "cpu"  # the default device
