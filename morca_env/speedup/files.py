"""The calibration's files and the threshold maps read from them: one home for where they live and how they load.

This machine's files live under the cache root's `calibration/` (written by
`morca calibrate`, found first); the packaged ones ship in
`morca_env/calibration/`. `resolve` turns what a caller passes (a name, a file, an object) into a calibration; `load_calibration` gives
the map K(rho)
(`morca_env.speedup.calibration.SpeedupCalibration`), `load_threshold_map` the global
threshold map g(rho) that turns a target speedup into a rule's threshold.
Measuring and fitting them is `morca_env.speedup.measure`'s job; this module only
reads, so the env and every scheduler can depend on it.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import replace
from importlib import resources
from pathlib import Path

import numpy as np

from .calibration import SpeedupCalibration
from ..utils.io import read_json
from ..utils.paths import cache_root


def user_calibration_dir() -> Path:
    return cache_root() / "calibration"


def packaged_calibration_path(name: str) -> Path:
    return Path(str(resources.files("morca_env"))) / "calibration" / f"{name}.json"


_warned: set[str] = set()


def calibration_file(filename: str, where: str = "user") -> Path:
    """Where a calibration file is written: `where` is "user" (this machine's, found first), "packaged" (the copy
    shipped with the package) or a directory."""
    if where == "user":
        return user_calibration_dir() / filename
    if where == "packaged":
        return packaged_calibration_path(filename.removesuffix(".json"))
    return Path(where) / filename


def find_calibration_file(filename: str) -> Path | None:
    """The user's calibration file (written by morca calibrate) if any, else the packaged one."""
    for path in (user_calibration_dir() / filename, packaged_calibration_path(filename.removesuffix(".json"))):
        if path.is_file():
            return path
    return None


def load_threshold_map(name: str):
    """g(rho) for the threshold-curve behaviour policy and the global-threshold SeaCache baseline."""
    path = find_calibration_file(f"{name}_threshold.json")
    if path is None:
        raise FileNotFoundError(f"no threshold map for {name!r}; run `morca calibrate --thresholds` "
                                "for this env")
    return ThresholdMap.from_file(path)


def load_calibration(name: str, num_steps: int, max_budget: int) -> SpeedupCalibration:
    """The calibration `morca calibrate` saved for this machine, else the packaged one, else the ideal model.

    A calibration made for another step count is rescaled (alpha, beta proportional
    to N, since each step costs the same) with a one-time warning.
    """
    from ..models.presets import PRESETS

    if name not in PRESETS:
        raise ValueError(f"calibration={name!r} is not a registered model; valid: {', '.join(sorted(PRESETS))}, "
                         "a SpeedupCalibration, or a path to a calibration JSON file")
    path = find_calibration_file(f"{name}.json")
    if path is not None:
        calib = SpeedupCalibration.from_json(path)
    else:
        if name not in _warned:
            warnings.warn(f"no speedup calibration for {name!r}; using the ideal model K = N (1 - 1/rho). "
                          "Run morca calibrate to measure one.", stacklevel=3)
            _warned.add(name)
        return SpeedupCalibration(alpha=float(num_steps), beta=float(num_steps), max_budget=max_budget,
                                  source="ideal model (uncalibrated)")
    steps = calib.num_steps or num_steps
    if steps != num_steps:
        scale = num_steps / steps
        if (name, num_steps) not in _warned:
            warnings.warn(f"calibration for {name!r} was made at {steps} steps; rescaling to {num_steps}", stacklevel=3)
            _warned.add((name, num_steps))
        full = calib.full_latency_s * scale if calib.full_latency_s else calib.full_latency_s
        points = [[k * scale, r] for k, r in calib.points] if calib.points else None
        calib = replace(calib, alpha=calib.alpha * scale, beta=calib.beta * scale, num_steps=num_steps,
                        full_latency_s=full, points=points, source=f"{calib.source} (rescaled from {steps} steps)")
    return replace(calib, max_budget=max_budget)


# ---------------------------------------------------------------- threshold maps
class ThresholdMap:
    """g(rho): the global SeaCache threshold whose mean realised speedup is rho (interpolated in log delta).

    Built from (speedup, threshold) pairs measured by `morca calibrate --thresholds`
    (or, for Wan2.1 / Wan2.2, the paper's Table 7 settings).
    """

    def __init__(self, speedups, thresholds, source: str = "unspecified"):
        order = np.argsort(speedups)
        self.speedups = np.asarray(speedups, dtype=float)[order]
        self.thresholds = np.asarray(thresholds, dtype=float)[order]
        if len(self.speedups) < 2 or np.any(self.thresholds <= 0) or np.any(np.diff(self.speedups) <= 0):
            raise ValueError("a threshold map needs >= 2 points with distinct speedups and positive thresholds")
        self.source = source

    def __call__(self, speedup: float) -> float:
        log_delta = np.log(self.thresholds)
        x, y = self.speedups, log_delta
        if speedup <= x[0]:
            slope = (y[1] - y[0]) / (x[1] - x[0])
            return float(np.exp(y[0] + slope * (speedup - x[0])))
        if speedup >= x[-1]:
            slope = (y[-1] - y[-2]) / (x[-1] - x[-2])
            return float(np.exp(y[-1] + slope * (speedup - x[-1])))
        return float(np.exp(np.interp(speedup, x, y)))

    def recalibrated(self, old, new) -> "ThresholdMap":
        """The same thresholds with speedups re-read through a newer calibration.

        The map's speedups are mean realised budgets K converted with the calibration
        of the time (`old`); a threshold's K does not depend on the machine, so reading
        `old` backwards and `new` forwards gives today's speedup.
        """
        speedups = [new.speedup_of_budget(old.budget_at(rho)) for rho in self.speedups]
        keep = []  # a strictly increasing, finite part: thresholds whose K reads as one speedup say nothing more
        for i, rho in enumerate(speedups):
            if np.isfinite(rho) and (not keep or rho > speedups[keep[-1]] + 1e-9):
                keep.append(i)
        if len(keep) < 2:
            raise ValueError(f"the threshold map re-read through {new.source!r} keeps fewer than 2 distinct speedups "
                             f"({[round(float(r), 3) for r in speedups]}); measure the calibration again")
        return ThresholdMap(np.asarray(speedups)[keep], self.thresholds[keep],
                            source=f"{self.source}, recalibrated: {new.source}")

    def to_dict(self) -> dict:
        return {"speedups": self.speedups.tolist(), "thresholds": self.thresholds.tolist(), "source": self.source}

    @classmethod
    def from_dict(cls, data: dict) -> "ThresholdMap":
        return cls(data["speedups"], data["thresholds"], data.get("source", "unspecified"))

    @classmethod
    def from_file(cls, path) -> "ThresholdMap":
        """A threshold map JSON file; a malformed one is an error naming the file and what it needs."""
        data = read_json(path, "threshold map")
        try:
            return cls.from_dict(data)
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"threshold map {path} is not a valid one ({type(error).__name__}: {error}); it needs "
                             "\"speedups\" and \"thresholds\": >= 2 points, distinct speedups, positive thresholds") \
                from None


def threshold_map_from_counts(name: str, grid, counts, calibration, source: str) -> ThresholdMap:
    """A ThresholdMap from reuse counts (mean K over prompts, or one K) measured at increasing thresholds `grid`:
    each distinct count with the geometric middle of its thresholds, at the speedup `calibration` predicts."""
    grid, counts = np.asarray(grid, dtype=float), np.asarray(counts, dtype=float)
    speedups, thresholds = [], []
    for k in np.unique(counts):
        run = grid[counts == k]
        speedup = calibration.speedup_of_budget(float(k))
        if math.isfinite(speedup):
            speedups.append(speedup)
            thresholds.append(float(np.sqrt(run[0] * run[-1])))
    if len(speedups) < 2:
        raise ValueError(f"{name}: its reuse count takes fewer than two values over thresholds "
                         f"{grid[0]:g}..{grid[-1]:g}; no threshold map can be fitted")
    order = np.argsort(speedups)
    speedups, thresholds = np.asarray(speedups)[order], np.asarray(thresholds)[order]
    keep = np.concatenate([[True], np.diff(speedups) > 0])
    return ThresholdMap(speedups[keep], thresholds[keep], source=f"{name}: {source}")


# transformer config fields that tell the calibrated models apart (latency follows the architecture, not the
# weights, so MorcaTinyRandom's pipeline reads MorcaTiny's calibration)
_ARCHITECTURES = {
    "wan21": {"num_layers": 30, "num_attention_heads": 12, "attention_head_dim": 128, "in_channels": 16},
    "wan22": {"num_layers": 40, "num_attention_heads": 40, "attention_head_dim": 128, "in_channels": 16},
    # MorcaTiny and MorcaScenes have the same width and differ in their heads (2 x 48 and 3 x 32)
    "tiny": {"num_layers": 4, "num_attention_heads": 2, "attention_head_dim": 48, "in_channels": 3},
    "scenes": {"num_layers": 4, "num_attention_heads": 3, "attention_head_dim": 32, "in_channels": 3},
}


def _config_value(config: dict, key: str):
    value = config.get(key)
    return tuple(value) if isinstance(value, list) else value  # from_pretrained reads tuples back as lists


def calibration_for_pipeline(pipe) -> str:
    """The registered model whose speedup calibration fits `pipe`, read from its transformer's config (Wan2.2
    by its second expert as well); a pipeline of another architecture is refused rather than given another
    model's curve (a Wan2.1 curve on MorcaTiny plays K=5 where 6 gives the asked speedup)."""
    config = dict(getattr(getattr(pipe, "transformer", None), "config", {}) or {})
    two_experts = getattr(pipe, "transformer_2", None) is not None
    for name, fields in _ARCHITECTURES.items():
        if all(_config_value(config, k) == v for k, v in fields.items()) and two_experts == (name == "wan22"):
            return name
    seen = {k: config.get(k) for k in ("num_layers", "num_attention_heads", "attention_head_dim", "in_channels")}
    raise ValueError(f"no speedup calibration is known for this pipeline's transformer ({seen}, "
                     f"{'two experts' if two_experts else 'one transformer'}): pass calibration= a registered model "
                     "name ('wan21', 'wan22', 'tiny', 'scenes'), a calibration JSON from `morca calibrate`, or a "
                     "SpeedupCalibration, or pass budget= instead of speedup=")


def resolve(calibration, num_steps: int, max_budget: int) -> SpeedupCalibration:
    """A `SpeedupCalibration` from what a caller may pass: the object itself, a calibration JSON file (a path or a
    string), or a registered model name (its packaged or user calibration, `morca calibrate` writes one)."""
    check_calibration(calibration)
    if isinstance(calibration, SpeedupCalibration):
        return calibration
    calibration = os.fspath(calibration)
    if Path(calibration).is_file():
        return SpeedupCalibration.from_json(calibration)
    return load_calibration(calibration, num_steps, max_budget)


def check_calibration(calibration) -> None:
    """Refuse what `resolve` cannot read, before any work (`None` means the model's own calibration)."""
    if calibration is not None and not isinstance(calibration, (str, os.PathLike, SpeedupCalibration)):
        raise TypeError(f"calibration={calibration!r}; valid: a registered model name, a calibration JSON path "
                        "or a SpeedupCalibration")
