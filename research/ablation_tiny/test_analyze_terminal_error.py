"""The Table 1 script's split and ridge: a prompt split never puts one prompt on both sides."""

from types import SimpleNamespace

import numpy as np
from analyze_terminal_error import fit_cv, split


def fake_dataset(prompts):
    metadata = [{"options": {"prompt": p}} for p in prompts]
    return SimpleNamespace(storage=SimpleNamespace(get_episode_metadata=lambda indices: [metadata[i] for i in indices]))


def test_a_prompt_split_holds_out_whole_prompts_and_an_episode_split_does_not():
    prompts = [f"prompt {i // 4}" for i in range(80)]  # groups of 4 episodes share a prompt, as anchored data does
    dataset = fake_dataset(prompts)
    train, test = split(dataset, 80, "prompt", np.random.default_rng(0))
    assert sorted([*train, *test]) == list(range(80)) and len(test) == 16
    assert not {prompts[i] for i in train} & {prompts[i] for i in test}
    train, test = split(dataset, 80, "episode", np.random.default_rng(0))
    assert {prompts[i] for i in train} & {prompts[i] for i in test}  # the leak the prompt split avoids


def test_the_ridge_recovers_a_linear_target():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 5))
    y = x @ np.array([1.0, -2.0, 0.0, 0.5, 3.0]) + 7.0
    model, _ = fit_cv(x, y, rng)
    np.testing.assert_allclose(model(x[:10]), y[:10], atol=0.05)
