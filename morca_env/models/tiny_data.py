"""MorcaTiny's world: a prompt grammar and procedurally rendered videos that follow it.

A prompt names one object (size, colour, shape), its motion (direction, speed)
and the background, e.g. "a large red circle moving left quickly on a navy
background". Videos are 8 frames of 16x16 RGB in [-1, 1], rendered with
anti-aliased signed-distance shapes, vectorised over a batch in torch.

The same module provides the pixel-statistics check of prompt following used to
evaluate the trained model (dominant foreground colour, centroid motion).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

FRAMES, HEIGHT, WIDTH = 8, 16, 16

COLOURS = {
    "red": (0.95, 0.10, 0.10),
    "green": (0.10, 0.85, 0.15),
    "blue": (0.15, 0.35, 1.00),
    "yellow": (1.00, 0.92, 0.10),
    "magenta": (0.95, 0.15, 0.95),
    "cyan": (0.10, 0.95, 0.95),
    "orange": (1.00, 0.55, 0.05),
    "white": (1.00, 1.00, 1.00),
}
BACKGROUNDS = {
    "black": (0.00, 0.00, 0.00),
    "gray": (0.40, 0.40, 0.40),
    "navy": (0.04, 0.06, 0.32),
    "maroon": (0.32, 0.05, 0.06),
    "olive": (0.28, 0.30, 0.05),
}
SHAPES = ("circle", "square", "triangle", "diamond")
DIRECTIONS = {"left": (-1.0, 0.0), "right": (1.0, 0.0), "up": (0.0, -1.0), "down": (0.0, 1.0)}
SIZES = {"small": 1.75, "": 2.5, "large": 3.5}  # radius in pixels; "" = unnamed medium
SPEEDS = {"slowly": 0.5, "": 1.0, "quickly": 1.5}  # pixels per frame

TINY_EVAL_SIZE = 200
_SPLIT_SEED = 4_2024


@dataclass(frozen=True)
class Scene:
    colour: str
    shape: str
    direction: str
    background: str
    size: str = ""
    speed: str = ""

    @property
    def prompt(self) -> str:
        obj = " ".join(w for w in ("a", self.size, self.colour, self.shape) if w)
        motion = " ".join(w for w in ("moving", self.direction, self.speed) if w)
        return f"{obj} {motion} on a {self.background} background"


def all_scenes() -> list[Scene]:
    return [Scene(c, s, d, b, z, v) for c, s, d, b, z, v in
            itertools.product(COLOURS, SHAPES, DIRECTIONS, BACKGROUNDS, SIZES, SPEEDS)]


def training_scenes() -> list[Scene]:
    """MorcaTiny's packaged weights were trained on its whole grammar, `tiny-eval`'s prompts included
    (kept so that `morca train-testbed --model tiny` remakes them; MorcaScenes holds its eval prompts out)."""
    return all_scenes()


def parse_prompt(prompt: str) -> Scene:
    """Inverse of `Scene.prompt` (raises ValueError for prompts outside the grammar)."""
    words = prompt.lower().replace(",", " ").split()
    pick = lambda options, default=None: next((w for w in words if w in options), default)  # noqa: E731
    scene = Scene(colour=pick(COLOURS), shape=pick(SHAPES), direction=pick(DIRECTIONS), background=pick(BACKGROUNDS),
                  size=pick({k for k in SIZES if k}, ""), speed=pick({k for k in SPEEDS if k}, ""))
    if None in (scene.colour, scene.shape, scene.direction, scene.background):
        raise ValueError(f"prompt {prompt!r} is not in MorcaTiny's grammar (e.g. {all_scenes()[0].prompt!r})")
    return scene


def vocabulary() -> list[str]:
    words = {"a", "moving", "on", "background", *COLOURS, *BACKGROUNDS, *SHAPES, *DIRECTIONS}
    words |= {w for w in (*SIZES, *SPEEDS) if w}
    return sorted(words)


def tiny_split(name: str) -> tuple[tuple[str, ...], tuple[int, ...] | None]:
    """(prompts, seeds) of `tiny-eval` (200 fixed pairs) or `tiny-train` (every other prompt of the grammar, no
    seeds); `morca_env.prompts.get_suite` makes them a PromptSuite."""
    scenes = all_scenes()
    rng = np.random.default_rng(_SPLIT_SEED)
    order = rng.permutation(len(scenes))
    eval_idx, train_idx = np.sort(order[:TINY_EVAL_SIZE]), np.sort(order[TINY_EVAL_SIZE:])
    if name == "tiny-eval":
        seeds = tuple(int(s) for s in rng.integers(0, 2**31 - 1, TINY_EVAL_SIZE))
        return tuple(scenes[i].prompt for i in eval_idx), seeds
    if name == "tiny-train":
        return tuple(scenes[i].prompt for i in train_idx), None
    raise KeyError(name)


def _sdf(shape: str, dx: torch.Tensor, dy: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    if shape == "circle":
        return torch.sqrt(dx**2 + dy**2) - r
    if shape == "square":
        return torch.maximum(dx.abs(), dy.abs()) - 0.85 * r
    if shape == "diamond":
        return (dx.abs() + dy.abs()) / 1.2 - r
    # upward triangle: apex at dy = -r, base at dy = +0.8 r, half-width 0.9 r at the base
    edge = (dx.abs() - 0.5 * (dy + r)) / np.sqrt(1.25)
    return torch.maximum(edge, dy - 0.8 * r)


def render(scenes: list[Scene], generator: torch.Generator | None = None) -> torch.Tensor:
    """Videos for `scenes` as (B, 3, F, H, W) in [-1, 1]; start positions are random."""
    b = len(scenes)
    g = generator
    radius = torch.tensor([SIZES[s.size] for s in scenes])
    speed = torch.tensor([SPEEDS[s.speed] for s in scenes])
    direction = torch.tensor([DIRECTIONS[s.direction] for s in scenes])
    travel = speed * (FRAMES - 1)
    # start so that the object stays inside the frame for the whole clip where possible
    lo = radius[:, None] + 1 + torch.clamp(-direction, min=0) * travel[:, None]
    hi = torch.tensor([WIDTH, HEIGHT], dtype=torch.float32) - radius[:, None] - 1 - torch.clamp(direction, min=0) * travel[:, None]
    u = torch.rand(b, 2, generator=g)
    start = torch.where(hi > lo, lo + u * (hi - lo), (lo + hi) / 2)
    t = torch.arange(FRAMES, dtype=torch.float32)
    centre = start[:, None, :] + direction[:, None, :] * speed[:, None, None] * t[None, :, None]  # (B, F, 2)
    ys, xs = torch.meshgrid(torch.arange(HEIGHT) + 0.5, torch.arange(WIDTH) + 0.5, indexing="ij")
    dx = xs[None, None] - centre[..., 0, None, None]
    dy = ys[None, None] - centre[..., 1, None, None]
    coverage = torch.empty(b, FRAMES, HEIGHT, WIDTH)
    for i, scene in enumerate(scenes):
        coverage[i] = (0.5 - _sdf(scene.shape, dx[i], dy[i], radius[i])).clamp(0, 1)
    colour = torch.tensor([COLOURS[s.colour] for s in scenes])[:, :, None, None, None]
    background = torch.tensor([BACKGROUNDS[s.background] for s in scenes])[:, :, None, None, None]
    # a faint fixed vertical gradient keeps backgrounds from being perfectly flat
    shade = 0.06 * (ys / HEIGHT - 0.5)[None, None, None]
    video = background + shade + coverage[:, None] * (colour - background - shade)
    return (video.clamp(0, 1) * 2 - 1).contiguous()


# --------------------------------------------------------------- prompt check
class Foreground(NamedTuple):
    colour: np.ndarray  # (3,) the object's median colour, NaN if nothing stands out
    centroids: np.ndarray  # (F, 2) x, y per frame, NaN where a frame has no foreground
    background: np.ndarray  # (3,) median colour of the border


def foreground_stats(video: torch.Tensor) -> Foreground:
    """Per video (F, H, W, 3) in [0, 1]: the object's colour, per-frame centroids and the background.

    The background is the median colour of the border pixels. Foreground pixels are
    those at least half as far from it (Euclidean in RGB) as the farthest 1% of the
    video, and never closer than 0.25: a fixed threshold alone lets pixel noise in a
    sample's background into the mask, and a mean over that mask reads the object on
    a noisy navy background as blue. The colour is the per-channel median of the
    foreground, which shadows and fringes do not drag.
    """
    v = video.float()
    border = torch.cat([v[:, 0], v[:, -1], v[:, :, 0], v[:, :, -1]], dim=1).reshape(-1, 3)
    background = border.median(dim=0).values
    distance = (v - background).norm(dim=-1)  # (F, H, W)
    mask = distance > max(0.25, 0.5 * float(torch.quantile(distance.flatten(), 0.99)))
    if mask.sum() == 0:
        return Foreground(np.full(3, np.nan), np.full((v.shape[0], 2), np.nan), background.numpy())
    colour = v[mask].median(dim=0).values.numpy()
    ys, xs = torch.meshgrid(torch.arange(v.shape[1]).float(), torch.arange(v.shape[2]).float(), indexing="ij")
    weights = mask.float()
    total = weights.sum(dim=(1, 2)).clamp(min=1)
    centroids = torch.stack([(weights * xs).sum(dim=(1, 2)) / total, (weights * ys).sum(dim=(1, 2)) / total], dim=-1)
    centroids[weights.sum(dim=(1, 2)) == 0] = float("nan")
    return Foreground(colour, centroids.numpy(), background.numpy())


def classify_colour(rgb: np.ndarray, background: np.ndarray | None = None, min_coverage: float = 0.5) -> str | None:
    """The named colour nearest to `rgb`; with `background`, nearest as a partly covered pixel.

    A 16-pixel frame has objects of radius 1.75 px with few fully covered pixels, so the
    foreground's colour is often a blend, bg + a (colour - bg): a small cyan triangle on navy
    is nearer to plain blue than to cyan. Given the background, each named colour is matched
    at its best coverage a in [`min_coverage`, 1].
    """
    if np.isnan(rgb).any():
        return None
    names = list(COLOURS)
    palette = np.array([COLOURS[n] for n in names])
    if background is None:
        return names[int(np.argmin(((palette - rgb) ** 2).sum(axis=1)))]
    towards = palette - background
    coverage = np.clip(towards @ (rgb - background) / np.maximum((towards**2).sum(axis=1), 1e-12), min_coverage, 1.0)
    return names[int(np.argmin(((background + coverage[:, None] * towards - rgb) ** 2).sum(axis=1)))]


def classify_direction(centroids: np.ndarray) -> str | None:
    valid = centroids[~np.isnan(centroids).any(axis=1)]
    if len(valid) < 2:
        return None
    dx, dy = valid[-1] - valid[0]
    if abs(dx) >= abs(dy):
        return "right" if dx > 0 else "left"
    return "down" if dy > 0 else "up"


def prompt_following(video: torch.Tensor, prompt: str) -> dict[str, bool]:
    """Does a (F, H, W, 3) video in [0, 1] show the prompt's colour and motion direction?"""
    scene = parse_prompt(prompt)
    seen = foreground_stats(video)
    return {"colour": classify_colour(seen.colour, seen.background) == scene.colour,
            "direction": classify_direction(seen.centroids) == scene.direction}
