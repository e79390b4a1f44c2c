"""Shared fixtures: small tiny pipelines, one torch thread, caches in a temp dir (never ~/.cache)."""

import os

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("morca_cache")
    old = os.environ.get("MORCA_CACHE_DIR")
    os.environ["MORCA_CACHE_DIR"] = str(root)
    yield root
    if old is None:
        os.environ.pop("MORCA_CACHE_DIR", None)
    else:
        os.environ["MORCA_CACHE_DIR"] = old


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
    from tests import rule_forms

    return rule_forms.make_envs(tmp_path)
