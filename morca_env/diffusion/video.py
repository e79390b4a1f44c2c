"""Side-by-side videos (GIF / MP4) of a reference and cached generations, with labels."""

from __future__ import annotations

from pathlib import Path

import imageio.v3 as iio
import numpy as np
import torch
from PIL import Image, ImageDraw

from ..utils.io import atomic_path


def _as_uint8(video) -> np.ndarray:
    if isinstance(video, torch.Tensor):
        video = video.cpu().numpy()
    video = np.asarray(video)
    if video.dtype != np.uint8:
        video = (np.clip(video, 0, 1) * 255).round().astype(np.uint8)
    return video


def side_by_side(videos: dict[str, object], min_height: int = 128, label_height: int = 14) -> np.ndarray:
    """Tile (F, H, W, 3) videos horizontally under their labels; small videos are upscaled (nearest)."""
    tiles = []
    for label, video in videos.items():
        v = _as_uint8(video)
        scale = max(1, int(np.ceil(min_height / v.shape[1])))
        v = v.repeat(scale, axis=1).repeat(scale, axis=2)
        frames = []
        for frame in v:
            canvas = Image.new("RGB", (frame.shape[1], frame.shape[0] + label_height), "white")
            canvas.paste(Image.fromarray(frame), (0, label_height))
            ImageDraw.Draw(canvas).text((2, 1), label, fill="black")
            frames.append(np.asarray(canvas))
        tiles.append(np.stack(frames))
    gap = np.full((tiles[0].shape[0], tiles[0].shape[1], 4, 3), 255, np.uint8)
    out = [tiles[0]]
    for tile in tiles[1:]:
        out += [gap, tile]
    return np.concatenate(out, axis=2)


def write_video(frames: np.ndarray, path: str | Path, fps: int = 8) -> Path:
    """Write frames (F, H, W, 3) uint8 to .gif or .mp4 atomically."""
    path = Path(path)
    with atomic_path(path) as tmp:
        if path.suffix == ".gif":
            iio.imwrite(tmp, frames, extension=".gif", duration=int(1000 / fps), loop=0)
        else:
            iio.imwrite(tmp, frames, extension=path.suffix, fps=fps, codec="libx264", macro_block_size=1)
    return path
