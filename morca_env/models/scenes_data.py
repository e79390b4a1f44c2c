"""MorcaScenes' world: a prompt grammar whose videos differ in motion, complexity, events and scale.

MorcaTiny's videos all pose the same denoising problem (one shape on a near-flat
background). MorcaScenes sets each factor that the caching literature says
changes a good schedule independently from the prompt:

- motion: ``still``, ``drifting`` (0.3 px/frame), ``racing`` (0.9 px/frame) or
  ``camera panning`` (the whole frame, background included, at 0.6 px/frame), left or right;
- complexity: one to three objects, on a flat, gradient, striped, checkerboard or
  noisy (a fixed texture) background;
- a temporal event: objects ``appearing`` or ``vanishing`` at mid-clip, a colour ``flash``,
  or a ``cut`` to another background;
- scale change: objects ``growing`` or ``shrinking``.

e.g. "two red circles racing left growing with a flash on a striped background".
Videos are 12 frames of 16x16 RGB in [-1, 1], rendered with anti-aliased
signed-distance shapes over periodic background textures, vectorised in torch.

Also here: the pixel-statistics check of prompt following per factor, used by the
model card (objects are bright and saturated, backgrounds dark, so a brightness
threshold separates them; every other measurement reads that mask).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

FRAMES, HEIGHT, WIDTH = 12, 16, 16
EVENT_FRAME = 6  # events happen between frame 5 and 6: a temporal token boundary at patch 2
FLASH_FRAMES = (6, 7)  # one temporal token

COLOURS = {
    "red": (0.95, 0.12, 0.10),
    "green": (0.12, 0.88, 0.18),
    "yellow": (1.00, 0.90, 0.10),
    "magenta": (0.95, 0.18, 0.95),
}
SHAPES = ("circle", "square")
COUNTS = {"one": 1, "two": 2, "three": 3}
# the amount of motion, in pixels per frame; a pan moves everything, background included
MOTIONS = {"still": 0.0, "drifting": 0.3, "panning": 0.6, "racing": 0.9}
DIRECTIONS = {"left": -1.0, "right": 1.0}
SCALES = {"": (2.0, 2.0), "growing": (1.5, 2.75), "shrinking": (2.75, 1.5)}  # radius at the first and last frame
EVENTS = ("", "appearing", "vanishing", "flash", "cut")
BACKGROUNDS = ("flat", "gradient", "striped", "checkerboard", "noisy")
_BACKGROUND_WORDS = {"flat": "flat", "gradient": "gradient", "striped": "striped", "checkerboard": "checkerboard",
                     "noisy": "noisy"}
CUT_BACKGROUND = (0.34, 0.06, 0.07)  # a cut always goes to flat maroon
DARK, LIGHT = (0.06, 0.08, 0.26), (0.26, 0.28, 0.38)  # the two tones of every textured background
_TEXTURE = 32  # backgrounds are periodic textures this wide, so a pan can slide them
_ROWS = {1: (8.0,), 2: (4.5, 11.5), 3: (2.5, 8.0, 13.5)}  # object rows: 3 objects of radius 2 leave 1.5 px gaps

SCENES_EVAL_PER_CLASS = 30
_SPLIT_SEED = 4_2026


@dataclass(frozen=True)
class Scene:
    count: str
    colour: str
    shape: str
    motion: str
    background: str
    direction: str = ""
    scale: str = ""
    event: str = ""

    def __post_init__(self):
        if (self.motion == "still") != (self.direction == ""):
            raise ValueError(f"motion {self.motion!r} with direction {self.direction!r}: only 'still' has none")

    @property
    def prompt(self) -> str:
        noun = self.shape if self.count == "one" else self.shape + "s"
        motion = {"still": "still", "panning": f"camera panning {self.direction}"}.get(
            self.motion, f"{self.motion} {self.direction}")
        event = {"": "", "appearing": "appearing", "vanishing": "vanishing", "flash": "with a flash",
                 "cut": "with a cut"}[self.event]
        words = (self.count, self.colour, noun, motion, self.scale, event, "on a",
                 _BACKGROUND_WORDS[self.background], "background")
        return " ".join(w for w in words if w)

    @property
    def content_class(self) -> str:
        """Motion amount x complexity: the strata of the splits and of the one-or-many study."""
        return f"{self.motion}/{'simple' if self.is_simple else 'complex'}"

    @property
    def is_simple(self) -> bool:
        return self.count == "one" and self.background in ("flat", "gradient")


def all_scenes() -> list[Scene]:
    motions = [("still", "")] + [(m, d) for m in MOTIONS if m != "still" for d in DIRECTIONS]
    return [Scene(n, c, s, m, b, d, z, e) for n, c, s, (m, d), z, e, b in
            itertools.product(COUNTS, COLOURS, SHAPES, motions, SCALES, EVENTS, BACKGROUNDS)]



def training_scenes() -> list[Scene]:
    """The scenes the model trains on: `scenes-train`'s prompts, so `scenes-eval` stays unseen."""
    by_prompt = {s.prompt: s for s in all_scenes()}
    return [by_prompt[p] for p in scenes_split("scenes-train")[0]]


def parse_prompt(prompt: str) -> Scene:
    """Inverse of `Scene.prompt` (raises ValueError for prompts outside the grammar)."""
    words = prompt.lower().replace(",", " ").split()
    pick = lambda options, default=None: next((w for w in words if w in options), default)  # noqa: E731
    shape = next((s for s in SHAPES if s in words or s + "s" in words), None)
    event = "flash" if "flash" in words else "cut" if "cut" in words else pick(("appearing", "vanishing"), "")
    background = next((b for b, w in _BACKGROUND_WORDS.items() if w in words), None)
    fields = dict(count=pick(COUNTS), colour=pick(COLOURS), shape=shape, motion=pick(MOTIONS),
                  background=background, direction=pick(DIRECTIONS, ""), scale=pick(("growing", "shrinking"), ""),
                  event=event)
    if None in fields.values():
        missing = sorted(k for k, v in fields.items() if v is None)
        raise ValueError(f"prompt {prompt!r} is not in MorcaScenes' grammar (no {', '.join(missing)}; "
                         f"e.g. {all_scenes()[0].prompt!r})")
    try:
        return Scene(**fields)
    except ValueError as err:
        raise ValueError(f"prompt {prompt!r} is not in MorcaScenes' grammar: {err}") from None


def vocabulary() -> list[str]:
    words = {"on", "a", "background", "camera", "with", *COUNTS, *COLOURS, *SHAPES, *(s + "s" for s in SHAPES),
             *MOTIONS, *DIRECTIONS, "growing", "shrinking", "appearing", "vanishing", "flash", "cut",
             *_BACKGROUND_WORDS.values()}
    return sorted(words)


def scenes_split(name: str) -> tuple[tuple[str, ...], tuple[int, ...] | None]:
    """(prompts, seeds) of `scenes-eval` or `scenes-train`.

    `scenes-eval` holds `SCENES_EVAL_PER_CLASS` fixed (prompt, seed) pairs from each content
    class (`Scene.content_class`, 8 classes), drawn with a fixed seed and listed class after
    class (so every sixth pair is 5 of each class); `scenes-train` is every
    other prompt of the grammar, in a fixed shuffled order, without seeds.
    """
    scenes = all_scenes()
    rng = np.random.default_rng(_SPLIT_SEED)
    order = rng.permutation(len(scenes))
    classes = sorted({s.content_class for s in scenes})
    chosen: list[int] = []
    for cls in classes:  # class by class, so `scenes-eval[::6]` takes 5 pairs of each class
        chosen += sorted([int(i) for i in order if scenes[i].content_class == cls][:SCENES_EVAL_PER_CLASS])
    if name == "scenes-eval":
        seeds = tuple(int(s) for s in rng.integers(0, 2**31 - 1, len(chosen)))
        return tuple(scenes[i].prompt for i in chosen), seeds
    if name == "scenes-train":
        held = set(chosen)
        return tuple(scenes[i].prompt for i in order if int(i) not in held), None
    raise KeyError(name)


# ------------------------------------------------------------------ rendering
def _texture(kind: str) -> torch.Tensor:
    """The background `kind` as a (3, HEIGHT, _TEXTURE) periodic image in [0, 1]."""
    ys, xs = torch.meshgrid(torch.arange(HEIGHT) + 0.5, torch.arange(_TEXTURE) + 0.5, indexing="ij")
    dark, light = torch.tensor(DARK)[:, None, None], torch.tensor(LIGHT)[:, None, None]
    if kind == "flat":
        mix = torch.zeros(HEIGHT, _TEXTURE)
    elif kind == "gradient":  # along y, so a horizontal pan leaves it as it is
        mix = ys / HEIGHT
    elif kind == "striped":  # vertical stripes, period 8 px
        mix = ((xs // 4) % 2).float()
    elif kind == "checkerboard":  # 4-px cells
        mix = (((xs // 4) + (ys // 4)) % 2).float()
    elif kind == "noisy":  # a fixed smoothed noise texture, the same in every video
        g = torch.Generator().manual_seed(7)
        raw = torch.rand(1, 1, HEIGHT, _TEXTURE, generator=g)
        padded = torch.nn.functional.pad(raw, (1, 1, 1, 1), mode="circular")
        smooth = torch.nn.functional.avg_pool2d(padded, 3, stride=1)[0, 0]
        mix = ((smooth - smooth.min()) / (smooth.max() - smooth.min())).clamp(0, 1)
    else:
        raise ValueError(f"background {kind!r} is not one of {BACKGROUNDS}")
    return dark + mix[None] * (light - dark)


_TEXTURES: dict[str, torch.Tensor] = {}


def background_texture(kind: str) -> torch.Tensor:
    if kind not in _TEXTURES:
        _TEXTURES[kind] = _texture(kind)
    return _TEXTURES[kind]


def _slide(texture: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Per frame, the frame-wide window of a periodic texture starting at x = `offsets[f]` (linear interpolation)."""
    xs = (torch.arange(WIDTH, dtype=torch.float32)[None] + offsets[:, None]) % _TEXTURE  # (F, W)
    left = xs.floor().long()
    frac = (xs - left)[:, None, None, :]  # (F, 1, 1, W)
    a = texture[:, :, left].permute(2, 0, 1, 3)  # (F, 3, H, W)
    b = texture[:, :, (left + 1) % _TEXTURE].permute(2, 0, 1, 3)
    return (a + frac * (b - a)).permute(1, 0, 2, 3)  # (3, F, H, W)


def _sdf(shape: str, dx: torch.Tensor, dy: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    if shape == "circle":
        return torch.sqrt(dx**2 + dy**2) - r
    return torch.maximum(dx.abs(), dy.abs()) - 0.85 * r


def content_speed(scene: Scene) -> float:
    """Signed pixels per frame of everything that moves: a camera panning right moves the content left."""
    sign = -1.0 if scene.motion == "panning" else 1.0
    return sign * MOTIONS[scene.motion] * DIRECTIONS.get(scene.direction, 0.0)


def render_one(scene: Scene, generator: torch.Generator | None = None) -> torch.Tensor:
    """One video for `scene`, (3, F, H, W) in [-1, 1]; the start positions and rows are random."""
    t = torch.arange(FRAMES, dtype=torch.float32)
    r0, r1 = SCALES[scene.scale]
    radius = r0 + (r1 - r0) * t / (FRAMES - 1)  # (F,)
    speed = content_speed(scene)
    travel = abs(speed) * (FRAMES - 1)
    margin = max(r0, r1) + 0.5
    lo, hi = margin, WIDTH - margin - travel
    n = COUNTS[scene.count]
    u = torch.rand(n + 2, generator=generator)
    starts = lo + u[:n] * max(hi - lo, 0.0) if hi > lo else torch.full((n,), (lo + hi) / 2)
    if speed < 0:
        starts = WIDTH - starts  # mirror: leftward objects start on the right
    rows = torch.tensor(_ROWS[n]) + (u[n] - 0.5) * 0.5  # the rows move together, +-0.25 px
    ys, xs = torch.meshgrid(torch.arange(HEIGHT) + 0.5, torch.arange(WIDTH) + 0.5, indexing="ij")
    coverage = torch.zeros(FRAMES, HEIGHT, WIDTH)
    for i in range(n):
        cx = starts[i] + speed * t  # (F,)
        d = _sdf(scene.shape, xs[None] - cx[:, None, None], ys[None] - rows[i], radius[:, None, None])
        coverage = torch.maximum(coverage, (0.5 - d).clamp(0, 1))
    if scene.event == "appearing":
        coverage[:EVENT_FRAME] = 0
    elif scene.event == "vanishing":
        coverage[EVENT_FRAME:] = 0
    # a pan slides the background with the objects; otherwise it stays put at a random offset
    offset0 = float(u[n + 1]) * _TEXTURE
    offsets = offset0 - (speed * t if scene.motion == "panning" else torch.zeros(FRAMES))
    background = _slide(background_texture(scene.background), offsets)  # (3, F, H, W)
    if scene.event == "cut":
        background[:, EVENT_FRAME:] = torch.tensor(CUT_BACKGROUND)[:, None, None, None]
    colour = torch.tensor(COLOURS[scene.colour])[:, None, None, None]
    video = background + coverage[None] * (colour - background)
    if scene.event == "flash":
        idx = list(FLASH_FRAMES)
        video[:, idx] = video[:, idx] + 0.6 * (1 - video[:, idx])
    return video.clamp(0, 1) * 2 - 1


def render(scenes: list[Scene], generator: torch.Generator | None = None) -> torch.Tensor:
    """Videos for `scenes` as (B, 3, F, H, W) in [-1, 1]."""
    return torch.stack([render_one(s, generator) for s in scenes]).contiguous()


# --------------------------------------------------------------- prompt check
FOREGROUND_LEVEL = 0.62  # objects' brightest channel is >= 0.88, every background's <= 0.4


class SceneStats(NamedTuple):
    flash: np.ndarray  # (F,) bool: frames much brighter than the clip's median
    area: np.ndarray  # (F,) foreground pixels per frame (NaN on flash frames)
    centroid_x: np.ndarray  # (F,) NaN where a frame shows no object (or flashes)
    count: int  # objects seen: median number of connected components over frames that show any
    background_features: np.ndarray  # (2, 7): texture features before and after the event frame


def _background_features(frames: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Texture features of frames (n, H, W, 3) outside the foreground `mask` (n, H, W).

    [contrast, mean |d/dx|, mean |d/dy|, correlation at the texture period along x and along y,
    the vertical gradient, red minus blue]: translation-invariant, so a pan does not change them.
    """
    if len(frames) == 0:
        return np.full(7, np.nan)
    from scipy import ndimage

    keep = ~ndimage.binary_dilation(mask, structure=np.ones((1, 3, 3), bool))  # object fringes are not texture
    grey = frames.mean(axis=-1)
    fill = np.median(grey[keep]) if keep.any() else 0.0
    grey = np.where(keep, grey, fill)
    dx = np.abs(np.diff(grey, axis=2)).mean()
    dy = np.abs(np.diff(grey, axis=1)).mean()
    centred = grey - grey.mean(axis=(1, 2), keepdims=True)
    var = (centred**2).mean() + 1e-4
    # half the texture period (8 px): stripes anti-correlate along x only, a checkerboard along both
    lag_x = (centred[:, :, 4:] * centred[:, :, :-4]).mean() / var
    lag_y = (centred[:, 4:] * centred[:, :-4]).mean() / var
    rows = grey.mean(axis=2)
    gradient = rows[:, -4:].mean() - rows[:, :4].mean()
    warmth = (frames[..., 0] - frames[..., 2])[keep].mean() if keep.any() else 0.0
    return np.array([np.sqrt(var), dx, dy, lag_x, lag_y, gradient, warmth])


def _denoised(video) -> np.ndarray:
    """A 5-pixel (plus-shaped) spatial median per channel: pixel noise off, objects of radius 1.5 px
    kept, and the one-pixel gaps between neighbouring objects too (a 3x3 square would close them)."""
    from scipy import ndimage

    v = video.float().numpy() if isinstance(video, torch.Tensor) else np.asarray(video, dtype=np.float32)
    return ndimage.median_filter(v, footprint=_PLUS, mode="nearest")


_PLUS = np.zeros((1, 3, 3, 1), bool)
_PLUS[0, 1, :, 0] = _PLUS[0, :, 1, 0] = True


def scene_stats(video: torch.Tensor) -> SceneStats:
    """Per-frame measurements of a (F, H, W, 3) video in [0, 1], read by the per-factor checks."""
    from scipy import ndimage

    v = _denoised(video)
    brightness = v.mean(axis=(1, 2, 3))
    flash = brightness > np.median(brightness) + 0.2
    mask = v.max(axis=-1) > FOREGROUND_LEVEL
    saturated = (v.max(axis=-1) - v.min(axis=-1)) > 0.35  # flash frames whiten: keep only saturated pixels there
    mask = np.where(flash[:, None, None], mask & saturated, mask)
    # soft coverage, not a pixel count: small objects' areas would jump with pixel quantisation
    coverage = np.clip((v.max(axis=-1) - 0.4) / (0.88 - 0.4), 0, 1) * mask
    area = coverage.sum(axis=(1, 2)).astype(float)
    xs = np.arange(v.shape[2]) + 0.5
    with np.errstate(invalid="ignore", divide="ignore"):
        centroid_x = (coverage * xs[None, None]).sum(axis=(1, 2)) / area
    shown = (area >= 3) & ~flash
    centroid_x[~shown] = np.nan
    sizes = [np.bincount(ndimage.label(mask[f], structure=np.ones((3, 3)))[0].ravel())[1:] for f in np.flatnonzero(shown)]
    counts = [int((s >= 2).sum()) for s in sizes]  # a single stray pixel is not an object
    count = int(np.median(counts)) if counts else 0
    area[flash] = np.nan
    calm = ~flash
    before = np.arange(v.shape[0]) < EVENT_FRAME
    features = np.stack([_background_features(v[calm & before], mask[calm & before]),
                         _background_features(v[calm & ~before], mask[calm & ~before])])
    return SceneStats(flash, area, centroid_x, count, features)


_REFERENCE_FEATURES: dict[str, np.ndarray] = {}


def _reference_features() -> dict[str, np.ndarray]:
    """The texture features of each clean background (the classifier's templates)."""
    if not _REFERENCE_FEATURES:
        for kind in BACKGROUNDS:
            frames = _slide(background_texture(kind), torch.arange(FRAMES) * 5.0).permute(1, 2, 3, 0).numpy()
            _REFERENCE_FEATURES[kind] = _background_features(frames, np.zeros(frames.shape[:3], bool))
    return _REFERENCE_FEATURES


_FEATURE_SCALE = np.array([0.04, 0.03, 0.03, 0.5, 0.5, 0.05, 0.05])


def classify_background(features: np.ndarray) -> str | None:
    if np.isnan(features).any():
        return None
    refs = _reference_features()
    return min(refs, key=lambda k: float((((features - refs[k]) / _FEATURE_SCALE) ** 2).sum()))


def classify_motion(centroid_x: np.ndarray) -> tuple[str, str] | None:
    """(amount, direction) from the slope of the foreground's centroid; thresholds halfway between speeds."""
    t = np.flatnonzero(~np.isnan(centroid_x))
    if len(t) < 3:
        return None
    slope = float(np.polyfit(t, centroid_x[t], 1)[0])
    speeds = sorted(MOTIONS.items(), key=lambda kv: kv[1])
    amount = min(speeds, key=lambda kv: abs(abs(slope) - kv[1]))[0]
    return amount, "" if amount == "still" else ("right" if slope > 0 else "left")


def classify_scale(area: np.ndarray, flash: np.ndarray) -> str | None:
    t = np.flatnonzero(~np.isnan(area) & (area >= 3))
    if len(t) < 3:
        return None
    slope = float(np.polyfit(t, np.log(area[t]), 1)[0]) * (FRAMES - 1)  # log-area change over the clip
    r0, r1 = SCALES["growing"]
    threshold = np.log(r1 / r0)  # half the log-area change of a growing object
    return "growing" if slope > threshold else "shrinking" if slope < -threshold else ""


def classify_event(stats: SceneStats) -> str:
    if stats.flash[list(FLASH_FRAMES)].all() and stats.flash.sum() <= len(FLASH_FRAMES) + 1:
        return "flash"
    shown = ~np.isnan(stats.area) & (np.nan_to_num(stats.area) >= 3)
    first, last = shown[:EVENT_FRAME - 1], shown[EVENT_FRAME + 1:]
    if last.mean() >= 0.75 and first.mean() <= 0.25:
        return "appearing"
    if first.mean() >= 0.75 and last.mean() <= 0.25:
        return "vanishing"
    before, after = stats.background_features
    if not np.isnan(before).any() and not np.isnan(after).any():
        if float(np.abs((after - before) / _FEATURE_SCALE).max()) > 2.0:
            return "cut"
    return ""


def prompt_following(video: torch.Tensor, prompt: str) -> dict[str, bool]:
    """Per factor, does a (F, H, W, 3) video in [0, 1] show what `prompt` asks?

    motion (amount and direction), count (objects), background (its texture, before any
    cut), event, scale, and colour (the foreground's median colour, nearest named one).
    """
    scene = parse_prompt(prompt)
    stats = scene_stats(video)
    v = _denoised(video)
    mask = (v.max(axis=-1) > FOREGROUND_LEVEL) & ~stats.flash[:, None, None]
    colour = None
    if mask.any():
        rgb = np.median(v[mask], axis=0)
        colour = min(COLOURS, key=lambda k: float(((np.asarray(COLOURS[k]) - rgb) ** 2).sum()))
    motion = classify_motion(stats.centroid_x)
    speed = content_speed(scene)
    expected = (scene.motion, "" if speed == 0 else "right" if speed > 0 else "left")
    return {"motion": motion == expected,
            "count": stats.count == COUNTS[scene.count],
            "background": classify_background(stats.background_features[0]) == scene.background,
            "event": classify_event(stats) == scene.event,
            "scale": classify_scale(stats.area, stats.flash) == scene.scale,
            "colour": colour == scene.colour}
