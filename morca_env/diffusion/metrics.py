"""Video fidelity against the no-cache reference: PSNR, SSIM (torchmetrics) and LPIPS (lpips).

Videos are (F, H, W, 3). Both sides are quantised to 8 bits first, as saved
videos are, so identical generations give PSNR = inf. PSNR uses the MSE over
the whole video; SSIM and LPIPS are averaged over frames (frames form the batch).
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path

import torch
from torchmetrics.functional.image import structural_similarity_index_measure

from ..utils.extras import MissingExtra, require

ALEXNET_FILE = "alexnet-owt-7be5be79.pth"


def to_uint8(video: torch.Tensor) -> torch.Tensor:
    """[0, 1] float video -> uint8 (round to nearest)."""
    if video.dtype == torch.uint8:
        return video
    return (video.float().clamp(0, 1) * 255).round().to(torch.uint8)


def _frames(video: torch.Tensor) -> torch.Tensor:
    """(F, H, W, 3) uint8 or float -> (F, 3, H, W) float32 in [0, 1]."""
    video = to_uint8(video).float() / 255.0
    if video.ndim != 4 or video.shape[-1] != 3:
        raise ValueError(f"expected a video of shape (F, H, W, 3), got {tuple(video.shape)}")
    return video.permute(0, 3, 1, 2)


def _check_pair(video: torch.Tensor, reference: torch.Tensor) -> None:
    if video.shape != reference.shape:
        raise ValueError(f"video shape {tuple(video.shape)} differs from reference shape {tuple(reference.shape)}")


def psnr(video: torch.Tensor, reference: torch.Tensor) -> float:
    _check_pair(video, reference)
    mse = float(torch.mean((_frames(video) - _frames(reference)) ** 2))
    return math.inf if mse == 0 else 10.0 * math.log10(1.0 / mse)


def ssim(video: torch.Tensor, reference: torch.Tensor) -> float:
    _check_pair(video, reference)
    preds, target = _frames(video), _frames(reference)
    # torchmetrics' Gaussian SSIM: an 11-tap window from sigma 1.5 whatever the frame size (a kernel_size
    # argument only counts with gaussian_kernel=False; an odd size from the frame size had no effect)
    return float(structural_similarity_index_measure(preds, target, data_range=1.0))


class LpipsUnavailable(RuntimeError):
    """LPIPS cannot run: its AlexNet backbone weights are not on disk (they download from the internet on
    first use) or the `lpips` package (the `[lpips]` extra) is not installed."""


def alexnet_weights_path() -> Path:
    return Path(torch.hub.get_dir()) / "checkpoints" / ALEXNET_FILE


class Lpips:
    """LPIPS (AlexNet) that never downloads: it needs a pre-seeded ``$TORCH_HOME``.

    Raises `LpipsUnavailable` with instructions when the weights are missing.
    Frames smaller than 64 px (MorcaTiny's 16 px) are bilinearly upsampled to 64 px first.
    """

    MIN_SIDE = 64

    def __init__(self, device: str | torch.device = "cpu"):
        try:  # the package first: without it the weights would not help
            lpips = require("lpips", "LPIPS")
        except MissingExtra as error:
            raise LpipsUnavailable(str(error)) from error
        path = alexnet_weights_path()
        if not path.is_file():
            raise LpipsUnavailable(
                f"LPIPS needs torchvision's AlexNet weights at {path} (TORCH_HOME={os.environ.get('TORCH_HOME', '<unset>')}). "
                "On a machine with internet run `python -c \"import torchvision; torchvision.models.alexnet(weights='DEFAULT')\"` "
                "and copy its $TORCH_HOME/hub/checkpoints here, or point TORCH_HOME at a directory that holds them."
            )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.model = lpips.LPIPS(net="alex", verbose=False).to(device).eval()
        self.device = torch.device(device)

    def __call__(self, video: torch.Tensor, reference: torch.Tensor, batch_size: int = 16) -> float:
        with torch.no_grad():  # not a decorator: mutmut leaves decorated functions unmutated
            _check_pair(video, reference)
            preds, target = _frames(video) * 2 - 1, _frames(reference) * 2 - 1
            side = min(preds.shape[-2:])
            if side < self.MIN_SIDE:  # AlexNet's pooling needs >= ~32 px; tiny videos are upsampled
                size = [round(s * self.MIN_SIDE / side) for s in preds.shape[-2:]]
                preds, target = (torch.nn.functional.interpolate(x, size=size, mode="bilinear", align_corners=False)
                                 for x in (preds, target))
            scores = []
            for start in range(0, preds.shape[0], batch_size):
                p = preds[start:start + batch_size].to(self.device)
                t = target[start:start + batch_size].to(self.device)
                scores.append(self.model(p, t).flatten().cpu())
            return float(torch.cat(scores).mean())


def video_metrics(video: torch.Tensor, reference: torch.Tensor, lpips_model: Lpips | None = None) -> dict[str, float]:
    out = {"psnr": psnr(video, reference), "ssim": ssim(video, reference)}
    if lpips_model is not None:
        out["lpips"] = lpips_model(video, reference)
    return out
