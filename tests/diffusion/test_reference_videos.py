"""The reference cache is bounded: least recently used videos go first, and `morca cache` shows and clears it."""

import os
import time

import pytest
import torch

from morca_env.commands import cache as cache_command
from morca_env.diffusion.reference_videos import ReferenceCache, cache_files


def video(i: int) -> torch.Tensor:
    return torch.full((8, 16, 16, 3), i, dtype=torch.uint8)  # 6 KiB of pixels, as a MorcaTiny reference


def test_the_cache_stays_under_its_bound_evicting_the_least_recently_used(tmp_path, monkeypatch):
    monkeypatch.setenv("MORCA_REFERENCE_CACHE_MB", str(40 / 1024))  # 40 KiB: a handful of references
    cache = ReferenceCache(tmp_path)
    for i in range(4):
        cache.store({"prompt": f"p{i}"}, video(i), 1.0)
    past = time.time() - 100
    for path in cache_files(tmp_path):
        os.utime(path, (past, past))
    assert cache.load({"prompt": "p0"}) is not None  # used now: p1 is the least recently used
    for i in range(4, 12):
        cache.store({"prompt": f"p{i}"}, video(i), 1.0)
    assert sum(p.stat().st_size for p in cache_files(tmp_path)) <= 40 * 1024
    assert cache.load({"prompt": "p11"}) is not None  # the newest stays
    assert cache.load({"prompt": "p1"}) is None and len(cache_files(tmp_path)) < 12


def test_a_bad_bound_is_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv("MORCA_REFERENCE_CACHE_MB", "lots")
    with pytest.raises(ValueError, match="MORCA_REFERENCE_CACHE_MB='lots' must be a positive number of MiB"):
        ReferenceCache(tmp_path)


def test_morca_cache_shows_and_clears(tmp_path, capsys):
    cache = ReferenceCache(tmp_path)
    for i in range(3):
        cache.store({"prompt": f"p{i}"}, video(i), 1.0)
    assert cache_command.main(["--dir", str(tmp_path)]) == 0
    assert "3 reference(s)" in capsys.readouterr().out
    assert cache_command.main(["--dir", str(tmp_path), "--clear"]) == 0
    assert "deleted 3 reference(s)" in capsys.readouterr().out and not cache_files(tmp_path)
