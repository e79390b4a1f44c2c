"""Shared fixtures: small tiny pipelines, one torch thread, caches in a temp dir (never ~/.cache)."""

import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

CHECKOUT = Path(__file__).resolve().parents[1]

# The modules the core CI venv runs (`pytest -m core`: the core install on the newest gymnasium, with torchrl,
# tianshou, stable-baselines3 and sb3-contrib, no d3rlpy / lpips): the env, the cache rules, data, the benchmark and the examples.
# A test in them that needs an extra skips itself (pytest.importorskip); test_extras checks the full venv has all.
CORE_MODULES = {
    "test_accelerate", "test_acid", "test_benchmark", "test_budget", "test_cache", "test_collect", "test_dicache",
    "test_easycache", "test_env", "test_library_policies", "test_examples", "test_extras", "test_features", "test_first_block_cache",
    "test_k_references", "test_magcache", "test_metrics", "test_observation", "test_observation_tracks", "test_policies", "test_prompts", "test_registry",
    "test_runtime_rule_forms", "test_sencache", "test_signals", "test_teacache", "test_vector_env", "test_info_pickles",
}


if os.environ.get("MORCA_CORE_ONLY") == "1":  # the core venv: the other modules import extras at the top
    _here = Path(__file__).parent
    collect_ignore = [str(p.relative_to(_here)) for p in _here.rglob("test_*.py") if p.stem not in CORE_MODULES]


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module.__name__.rpartition(".")[2] in CORE_MODULES:
            item.add_marker(pytest.mark.core)


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Our caches, and stable-baselines3's logger folder (by default a new empty /tmp/SB3-<time> per `learn`), in
    pytest's temp dir, so a test run leaves nothing behind. Subprocesses import this checkout first: a venv shared
    by two checkouts has only one of them installed, and a child would otherwise test that one."""
    root = tmp_path_factory.mktemp("morca_cache")
    saved = {name: os.environ.get(name) for name in ("MORCA_CACHE_DIR", "SB3_LOGDIR", "PYTHONPATH")}
    os.environ["MORCA_CACHE_DIR"] = str(root)
    os.environ["SB3_LOGDIR"] = str(tmp_path_factory.mktemp("sb3_logs"))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(CHECKOUT), saved["PYTHONPATH"]) if p)
    yield root
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def make_pipe(kind="wan21", **kwargs):
    from morca_env.models.random_wan import build_tiny_wan_pipeline

    return build_tiny_wan_pipeline(kind, **kwargs)


@pytest.fixture
def wan21_pipe():
    """Wan2.1-style: one expert, tiny VAE, no text encoder (prompt embeddings injected)."""
    return make_pipe("wan21", with_text_encoder=False, with_vae=True)


@pytest.fixture
def wan22_pipe():
    """Wan2.2-style: two experts switched at boundary 0.875, tiny VAE, no text encoder."""
    return make_pipe("wan22", with_text_encoder=False, with_vae=True)


def prompt_embeds(seed=0, length=8, dim=16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, length, dim, generator=g), torch.randn(1, length, dim, generator=g)


@pytest.fixture
def envs(tmp_path):
    """An exact-budget MorcaTinyRandom env and a budget-free one on its pipeline (`rule_forms.make_envs`), for the
    rule-form checks every cache rule's test runs."""
    from tests.schedulers import rule_forms

    return rule_forms.make_envs(tmp_path)


def child_pids(pid: int) -> list[int]:
    """The live (not zombie) children of `pid`, from Linux's /proc: what a killed parent may leave running."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended while we looked
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def process_running(pid: int) -> bool:
    """Alive and not a zombie (a reaped-later child of init counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False
