"""Old import paths of moved modules keep working for one release, with a `DeprecationWarning` naming the new one.

`import morca_env.benchmark` (or `from morca_env import benchmark`) finds the module at its new home,
`morca_env.evaluation.benchmark`, and registers it under the old name too, so both names hold the same module
object (a monkeypatch through either reaches the code that runs).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {
    "morca_env.benchmark": "morca_env.evaluation.benchmark",
    "morca_env.search": "morca_env.evaluation.search",
    "morca_env.calibrate": "morca_env.speedup.measure",
    "morca_env.calibration_files": "morca_env.speedup.files",
    "morca_env.governor": "morca_env.speedup.governor",
    "morca_env.cache": "morca_env.diffusion.cache",
    "morca_env.denoiser": "morca_env.diffusion.denoiser",
    "morca_env.features": "morca_env.diffusion.features",
    "morca_env.metrics": "morca_env.diffusion.metrics",
    "morca_env.references": "morca_env.diffusion.reference_videos",
    "morca_env.signals": "morca_env.diffusion.signals",
    "morca_env.video": "morca_env.diffusion.video",
    "morca_env.wan_structure": "morca_env.diffusion.wan_structure",
    "morca_env.dataset_integrity": "morca_env.data.integrity",
    "morca_env.executors": "morca_env.parallel.executors",
    "morca_env.workers": "morca_env.parallel.workers",
    "morca_env.extras": "morca_env.utils.extras",
    "morca_env.io": "morca_env.utils.io",
    "morca_env.paths": "morca_env.utils.paths",
    "morca_env.quiet": "morca_env.utils.quiet",
    "morca_env.threads": "morca_env.utils.threads",
    "morca_env.schedulers.seacache": "morca_env.schedulers.rules.seacache",
}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, old: str, new: str):
        self.old, self.new = old, new

    def create_module(self, spec):
        warnings.warn(f"{self.old} moved to {self.new}; the old import path goes in the next release",
                      DeprecationWarning, stacklevel=3)
        module = importlib.import_module(self.new)
        self.own_spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = self.own_spec  # the import system set the alias spec on the real module: undo it


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(fullname, MOVED[fullname]))


def install() -> None:
    """Put the finder first on `sys.meta_path` (once)."""
    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedModuleFinder())
