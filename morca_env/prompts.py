"""Prompt suites: named lists of prompts, optionally with fixed generation seeds.

* ``vbench-eval``: a fixed 200-prompt evaluation split of the 944 VBench prompts
  (the paper evaluates on 200 VBench prompts), each with a fixed seed;
* ``vbench-train``: the remaining 744 prompts (seeds drawn per episode);
* ``vbench-all``: all 944;
* ``tiny-train`` / ``tiny-eval``: MorcaTiny's prompt grammar (see ``morca_env.models.tiny``);
* ``scenes-train`` / ``scenes-eval``: MorcaScenes' grammar (``morca_env.models.scenes_data``):
  the eval suite is 30 fixed (prompt, seed) pairs from each of its 8 content classes, and
  ``scenes-train`` is every other prompt, in a fixed shuffled order (so a prefix spreads over
  the grammar);
* ``<suite>:<n>``: the first n prompts of a suite, each with a fixed seed, so that
  repeated draws reuse their no-cache references (the paper's Wan2.1 data has
  1000 prompts x 4 schedules): e.g. ``tiny-train:250``. ``tiny-train`` is in the
  grammar's order, so a prefix holds few colours and shapes (``tiny-train:250``: red
  circles and squares only);
* ``<suite>[start:stop:step]``: a Python slice of a suite, with the same fixed seeds:
  ``tiny-train[::22]`` spreads 253 prompts over the whole grammar, and
  ``tiny-train[11::132]`` is a 43-prompt validation set disjoint from it.

The split is a seeded permutation of the packaged prompt file, so it is the
same on every machine and never reads anything outside the installed package.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Sequence

import numpy as np

VBENCH_EVAL_SIZE = 200
_SPLIT_SEED = 2610_10457


@dataclass(frozen=True)
class PromptSuite:
    name: str
    prompts: tuple[str, ...]
    seeds: tuple[int, ...] | None = None  # fixed seed per prompt (evaluation suites)

    def __post_init__(self):
        if not self.prompts:
            raise ValueError(f"prompt suite {self.name!r} is empty")
        if self.seeds is not None and len(self.seeds) != len(self.prompts):
            raise ValueError("seeds must match prompts one to one")

    def __len__(self) -> int:
        return len(self.prompts)

    def sample(self, rng: np.random.Generator) -> tuple[str, int]:
        """A (prompt, generation seed) pair."""
        i = int(rng.integers(len(self.prompts)))
        seed = self.seeds[i] if self.seeds is not None else int(rng.integers(2**31 - 1))
        return self.prompts[i], seed

    def pairs(self) -> list[tuple[str, int]]:
        seeds = self.seeds if self.seeds is not None else tuple(range(len(self.prompts)))
        return list(zip(self.prompts, seeds))


@lru_cache(maxsize=1)
def vbench_prompts() -> tuple[str, ...]:
    data = json.loads(resources.files("morca_env.data_files").joinpath("vbench_prompts.json").read_text())
    return tuple(item["prompt"] for item in data)


def _vbench_split() -> tuple[np.ndarray, np.ndarray]:
    order = np.random.default_rng(_SPLIT_SEED).permutation(len(vbench_prompts()))
    return np.sort(order[:VBENCH_EVAL_SIZE]), np.sort(order[VBENCH_EVAL_SIZE:])


def _builtin(name: str) -> PromptSuite:
    if name.startswith("vbench-"):
        prompts = vbench_prompts()
        eval_idx, train_idx = _vbench_split()
        if name == "vbench-all":
            return PromptSuite(name, prompts)
        if name == "vbench-eval":
            seeds = tuple(int(s) for s in np.random.default_rng(_SPLIT_SEED + 1).integers(0, 2**31 - 1, len(eval_idx)))
            return PromptSuite(name, tuple(prompts[i] for i in eval_idx), seeds)
        if name == "vbench-train":
            return PromptSuite(name, tuple(prompts[i] for i in train_idx))
    if name.startswith("tiny-"):
        from .models.tiny_data import tiny_split

        prompts, seeds = tiny_split(name)
        return PromptSuite(name, prompts, seeds)
    if name.startswith("scenes-"):
        from .models.scenes_data import scenes_split

        prompts, seeds = scenes_split(name)
        return PromptSuite(name, prompts, seeds)
    raise KeyError(name)


SUITE_NAMES = ("vbench-train", "vbench-eval", "vbench-all", "tiny-train", "tiny-eval", "scenes-train", "scenes-eval")
EVALUATION_SUITES = ("vbench-eval", "vbench-all", "tiny-eval", "scenes-eval")  # held out: never fit or train on them


def is_evaluation_suite(spec: str) -> bool:
    """Whether a suite spec (`name`, `name:n`, `name[a:b:c]`) draws from a held-out evaluation suite."""
    return spec.partition("[")[0].partition(":")[0] in EVALUATION_SUITES


def evaluation_prompts() -> frozenset[str]:
    """Every held-out prompt of every model: what no training data may contain."""
    return frozenset(p for name in EVALUATION_SUITES for p in _builtin(name).prompts)


def _fixed_seeds(suite: PromptSuite) -> tuple[int, ...]:
    """One fixed seed per prompt of a suite; `<suite>:<n>` and `<suite>[a:b:c]` pick from the same stream."""
    if suite.seeds is not None:
        return suite.seeds
    return tuple(int(s) for s in np.random.default_rng(_SPLIT_SEED + 2).integers(0, 2**31 - 1, len(suite)))


def _sliced(spec: str) -> PromptSuite:
    """`<suite>[start:stop:step]`, Python slice semantics: e.g. `tiny-train[::22]`, prompts spread over the
    whole grammar (a prefix `tiny-train:250` holds only its first scenes: red circles and squares)."""
    base, _, inner = spec[:-1].partition("[")
    parts = inner.split(":")
    try:
        if base not in SUITE_NAMES or not 1 <= len(parts) <= 3 or len(parts) == 1:
            raise ValueError
        start, stop, step = (int(x) if x.strip() else None for x in parts + [""] * (3 - len(parts)))
    except ValueError:
        raise ValueError(f"prompts={spec!r}: expected <suite>[start:stop:step] (Python slice, integers) with a suite "
                         f"among {', '.join(SUITE_NAMES)}") from None
    if step is not None and step < 1:
        raise ValueError(f"prompts={spec!r}: step={step} must be >= 1")
    suite = _builtin(base)
    picked = range(len(suite))[slice(start, stop, step)]
    if not picked:
        raise ValueError(f"prompts={spec!r} selects no prompt of {base!r} ({len(suite)} prompts)")
    seeds = _fixed_seeds(suite)
    return PromptSuite(spec, tuple(suite.prompts[i] for i in picked), tuple(seeds[i] for i in picked))


def get_suite(prompts: str | Sequence[str] | PromptSuite) -> PromptSuite:
    """Resolve the env's `prompts` argument: a suite name, a list of prompts, or a suite."""
    if isinstance(prompts, PromptSuite):
        return prompts
    if isinstance(prompts, str):
        if prompts.endswith("]") and "[" in prompts:
            return _sliced(prompts)
        base, _, count = prompts.partition(":")
        if count:
            if base not in SUITE_NAMES or not count.isdigit() or int(count) < 1:
                raise ValueError(f"prompts={prompts!r}: expected <suite>:<n> with a suite among {', '.join(SUITE_NAMES)}"
                                 " and n >= 1")
            suite = _builtin(base)
            if int(count) > len(suite):
                raise ValueError(f"prompts={prompts!r}: suite {base!r} has {len(suite)} prompts; valid: "
                                 f"{base}:1 .. {base}:{len(suite)}")
            n = int(count)
            return PromptSuite(prompts, suite.prompts[:n], _fixed_seeds(suite)[:n])
        if prompts not in SUITE_NAMES:
            raise ValueError(f"unknown prompt suite {prompts!r}; valid suites: {', '.join(SUITE_NAMES)} (or pass a list of prompts)")
        return _builtin(prompts)
    if isinstance(prompts, Sequence) and prompts and all(isinstance(p, str) and p.strip() for p in prompts):
        return PromptSuite("custom", tuple(prompts))
    raise ValueError(f"prompts={prompts!r} must be a suite name ({', '.join(SUITE_NAMES)}) or a non-empty list of non-empty strings")
