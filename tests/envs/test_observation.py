"""ObservationBuilder on synthetic latents: every scalar, the mask and the feature stack, step by step."""

import numpy as np
import pytest
import torch

from morca_env.budget import BudgetSpec, forced_recompute_steps
from morca_env.diffusion.features import latent_features, stack_features
from morca_env.observation import (OBS_KEYS, NUM_SCALARS, ObservationBuilder, Scalar, as_flat, observation_space,
                                   parse_action, step_of)
from morca_env.diffusion.signals import relative_l1, sea_filter

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


def test_observation_space_declares_every_key_shape_bound_and_dtype():
    space = observation_space(3)
    assert sorted(space.spaces) == sorted(["pooled", "temporal", "scalars", "action_mask"])
    for key, shape in (("pooled", (9, 4, 8, 8)), ("temporal", (18, 8, 8))):
        box = space[key]
        assert box.shape == shape and box.dtype == np.float32
        assert np.all(box.low == -np.inf) and np.all(box.high == np.inf)
    scalars = space["scalars"]
    assert scalars.shape == (NUM_SCALARS,) and scalars.dtype == np.float32
    assert scalars.low.tolist() == [0.0] * NUM_SCALARS
    assert scalars.high.tolist() == [np.inf, np.inf, 1.0, 1.0, 1.0, 1.0, 1.0]  # d_t and D_t unbounded
    assert space["action_mask"].n == 2
    # what the builder writes lies in it (features of a 3-channel latent)
    builder = ObservationBuilder(BudgetSpec(N, forced_recompute_steps(N)), signal_kind="latent")
    builder.reset(K)
    x = torch.randn(1, 3, 4, 8, 8, generator=torch.Generator().manual_seed(1))
    assert space.contains(builder.observe(0, x, x, SIGMAS[0], False))


def test_step_of_reads_the_step_back_from_the_remaining_steps_scalar():
    for n in (5, 7, 50):
        for i in range(n + 1):
            scalars = np.zeros(NUM_SCALARS, dtype=np.float32)
            scalars[Scalar.t] = (n - i) / n
            assert step_of({"scalars": scalars}, n) == i, (n, i)
    xs = latents()
    builder = ObservationBuilder(BudgetSpec(N, forced_recompute_steps(N)), signal_kind="latent")
    builder.reset(K)
    for i in range(N):
        assert step_of(builder.observe(i, xs[i], xs[i], SIGMAS[i], i > 0), N) == i
        builder.record(i, 0)
    assert step_of(builder.observe(None, xs[N]), N) == N


def test_as_flat_concatenates_each_row_in_gymnasiums_sorted_key_order_as_float32():
    t = 2
    obs = {"pooled": np.arange(t * 3 * 2, dtype=np.float16).reshape(t, 3, 2),
           "temporal": 100 + np.arange(t * 4, dtype=np.float16).reshape(t, 2, 2),
           "scalars": 200 + np.arange(t * 3, dtype=np.float64).reshape(t, 3) / 4,
           "action_mask": np.array([[1, 0], [1, 1]], dtype=np.int8)}
    flat = as_flat(obs)
    assert flat.dtype == np.float32 and flat.shape == (t, 6 + 4 + 3 + 2)
    for row in range(t):
        expected = np.concatenate([np.asarray(obs[k][row], dtype=np.float32).ravel()
                                   for k in ("action_mask", "pooled", "scalars", "temporal")])
        np.testing.assert_array_equal(flat[row], expected)


@pytest.mark.parametrize("action,expected", [(0, 0), (1, 1), (np.int64(1), 1), (np.int8(0), 0),
                                             (np.array([1]), 1), (np.array([[0]]), 0), (np.array(1), 1),
                                             (torch.tensor(1), 1), (torch.tensor([0]), 0)])
def test_parse_action_accepts_a_single_0_or_1(action, expected):
    value = parse_action(action)
    assert value == expected and type(value) is int


@pytest.mark.parametrize("action", [2, -1, 0.0, 1.0, 0.9, "1", True, False, np.bool_(True), None,
                                    np.array([0, 1]), np.array([]), torch.tensor([0, 1]), torch.tensor(1.0)])
def test_parse_action_rejects_anything_else(action):
    with pytest.raises(ValueError):
        parse_action(action)


def test_latents_that_require_grad_are_observed_without_autograd():
    """The builder runs the features and the distance under one no_grad: a latent that requires grad (a user's
    differentiable sampler) still gives plain arrays, and no graph is kept."""
    xs = [x.requires_grad_() for x in latents(3)]
    builder = ObservationBuilder(BudgetSpec(N, forced_recompute_steps(N)), signal_kind="latent")
    builder.reset(K)
    for i in range(2):
        obs = builder.observe(i, xs[i], xs[i], SIGMAS[i], cache_valid=i > 0)
        assert all(isinstance(obs[key], np.ndarray) for key in OBS_KEYS)
        builder.record(i, 0)
    assert not builder.tracker._previous.requires_grad
