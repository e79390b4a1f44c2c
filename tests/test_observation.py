"""ObservationBuilder on synthetic latents: every scalar, the mask and the feature stack, step by step."""

import numpy as np
import pytest
import torch

from morca_env.budget import BudgetSpec, forced_recompute_steps
from morca_env.features import latent_features, stack_features
from morca_env.observation import ObservationBuilder
from morca_env.signals import relative_l1, sea_filter

N, K = 5, 2
SIGMAS = [0.9, 0.7, 0.5, 0.3, 0.1]


def latents(count=N + 1):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, 2, 4, 8, 8, generator=g) for _ in range(count)]


def filtered(x, i):
    return sea_filter(x, SIGMAS[i], (2, 3, 4))


def test_scalars_mask_and_feature_stack_follow_the_executed_actions():
    xs = latents()
    spec = BudgetSpec(N, forced_recompute_steps(N))
    builder = ObservationBuilder(spec, signal_kind="latent")
    builder.reset(K)
    actions = [0, 1, 0, 1, 0]
    valid = [False, True, True, True, True]
    expected_d = [0.0] + [relative_l1(filtered(xs[i], i), filtered(xs[i - 1], i - 1)) for i in range(1, N)]
    expected_big_d = [0.0, expected_d[1], expected_d[1] + expected_d[2], expected_d[3], expected_d[3] + expected_d[4]]
    last_recompute = [None, 0, 0, 2, 2]
    used = [0, 0, 1, 1, 2]
    masks = [[1, 0], [1, 1], [1, 1], [0, 1], [1, 0]]
    phi = [latent_features(x) for x in xs]
    for i in range(N):
        obs = builder.observe(i, xs[i], xs[i], SIGMAS[i], valid[i])
        since = 0 if last_recompute[i] is None else i - last_recompute[i]
        np.testing.assert_allclose(
            obs["scalars"], [expected_d[i], expected_big_d[i], (N - i) / N, since / N, used[i] / N, K / N, valid[i]],
            rtol=1e-5, atol=1e-7)
        assert obs["action_mask"].tolist() == masks[i] and obs["action_mask"].dtype == np.int8
        assert obs["scalars"].dtype == np.float32  # as the env's observation space declares
        previous = phi[i - 1] if i else phi[i]
        last = phi[last_recompute[i]] if last_recompute[i] is not None else phi[i]
        pooled, temporal = stack_features(phi[i], previous, last)
        assert np.array_equal(obs["pooled"], pooled) and np.array_equal(obs["temporal"], temporal), i
        assert builder.project(actions[i], i, valid[i]) == (actions[i], False)
        builder.record(i, actions[i])
    terminal = builder.observe(None, xs[N])
    np.testing.assert_allclose(terminal["scalars"], [0, 0, 0, 1 / N, K / N, K / N, 0], atol=1e-7)
    assert terminal["action_mask"].tolist() == [1, 0]
    pooled, _ = stack_features(phi[N], phi[N - 1], phi[N - 1])
    assert np.array_equal(terminal["pooled"], pooled)


def test_projection_and_budget_free_mask():
    xs = latents()
    spec = BudgetSpec(N, forced_recompute_steps(N))
    builder = ObservationBuilder(spec, signal_kind="latent")
    builder.reset(1)
    builder.observe(0, xs[0], xs[0], SIGMAS[0], False)
    assert builder.project(1, 0, False) == (0, True)  # reuse without a cache is projected onto recompute
    builder.record(0, 0)
    builder.observe(1, xs[1], xs[1], SIGMAS[1], True)
    builder.record(1, 1)
    obs = builder.observe(2, xs[2], xs[2], SIGMAS[2], True)
    assert obs["action_mask"].tolist() == [1, 0] and builder.project(1, 2, True) == (0, True)  # budget spent
    builder.reset(1, enforce_budget=False)
    assert builder.used == 0 and builder.last_recompute is None
    builder.observe(0, xs[0], xs[0], SIGMAS[0], False)
    builder.record(0, 0)
    builder.observe(1, xs[1], xs[1], SIGMAS[1], True)
    builder.record(1, 1)
    obs = builder.observe(2, xs[2], xs[2], SIGMAS[2], True)
    assert obs["action_mask"].tolist() == [1, 1]  # budget-free: a second reuse stays allowed
    assert builder.project(1, 2, True) == (1, False)
    assert builder.observe(4, xs[4], xs[4], SIGMAS[4], True)["action_mask"].tolist() == [1, 0]  # forced last step


def test_without_latent_features_pooled_and_temporal_are_zero_with_the_right_shapes():
    xs = latents(2)
    builder = ObservationBuilder(BudgetSpec(N, forced_recompute_steps(N)), signal_kind="latent", latent_features=False)
    builder.reset(K)
    obs = builder.observe(0, xs[0], xs[0], SIGMAS[0], False)
    assert obs["pooled"].shape == (6, 4, 8, 8) and obs["temporal"].shape == (12, 8, 8)
    assert obs["pooled"].dtype == obs["temporal"].dtype == np.float32
    assert not obs["pooled"].any() and not obs["temporal"].any()
    full = ObservationBuilder(BudgetSpec(N, forced_recompute_steps(N)), signal_kind="latent")
    full.reset(K)
    np.testing.assert_array_equal(obs["scalars"], full.observe(0, xs[0], xs[0], SIGMAS[0], False)["scalars"])


def test_power_exponent_reaches_the_distance():
    xs = latents(2)
    distances = []
    for power in (3.0, 1.0):
        builder = ObservationBuilder(BudgetSpec(N, forced_recompute_steps(N)), signal_kind="latent", power_exp=power)
        builder.reset(K)
        builder.observe(0, xs[0], xs[0], SIGMAS[0], False)
        builder.record(0, 0)
        distances.append(builder.observe(1, xs[1], xs[1], SIGMAS[1], True)["scalars"][0])
    expected = relative_l1(sea_filter(xs[1], SIGMAS[1], (2, 3, 4), 1.0), sea_filter(xs[0], SIGMAS[0], (2, 3, 4), 1.0))
    assert distances[1] == pytest.approx(expected, rel=1e-5) and distances[0] != pytest.approx(distances[1], rel=1e-3)


def test_defaults_are_the_official_signal_and_power_three():
    """MorcaEnv's default observation uses SeaCache's official signal and p = 3."""
    builder = ObservationBuilder(BudgetSpec(N, forced_recompute_steps(N)))
    assert builder.tracker.kind == "official" and builder.tracker.power_exp == 3.0 and builder.latent_features


@pytest.mark.parametrize("enforce_budget", [True, False])
def test_a_missing_cache_forbids_reuse_on_a_free_step(enforce_budget):
    """cache_valid reaches the mask (and defaults to False): no reuse without a residual."""
    xs = latents(3)
    builder = ObservationBuilder(BudgetSpec(N, forced_recompute_steps(N)), signal_kind="latent")
    builder.reset(K, enforce_budget=enforce_budget)
    builder.observe(0, xs[0], xs[0], SIGMAS[0], False)
    builder.record(0, 0)
    assert builder.observe(1, xs[1], xs[1], SIGMAS[1], False)["action_mask"].tolist() == [1, 0]
    assert builder.observe(1, xs[1], xs[1], SIGMAS[1])["action_mask"].tolist() == [1, 0]
    assert builder.observe(1, xs[1], xs[1], SIGMAS[1], True)["action_mask"].tolist() == [1, 1]
