"""Every model's command defaults train on its own training suite, never on held-out prompts."""

import pytest

from morca_env.models.presets import PRESETS, preset_for_env
from morca_env.prompts import evaluation_prompts, get_suite, is_evaluation_suite


@pytest.mark.parametrize("name", ["tiny", "scenes"])
def test_a_testbeds_default_prompts_are_its_own_disjoint_training_slices(name):
    preset = PRESETS[name]
    assert preset_for_env(preset.env_id) is preset
    p = preset.prompts
    specs = [p.trainers, p.fit_fixed, p.select_on, p.fit_rules, p.anchor]
    held_out = evaluation_prompts()
    for spec in specs:
        assert spec.startswith(preset.train_suite) and not is_evaluation_suite(spec)
        assert not set(get_suite(spec).prompts) & held_out
    prompts = lambda spec: set(get_suite(spec).prompts)  # noqa: E731
    assert not prompts(p.fit_fixed) & prompts(p.select_on)  # selection validates the fit
    assert not prompts(p.anchor) & (prompts(p.fit_fixed) | prompts(p.select_on))
    assert len(get_suite(p.fit_fixed)) == 12


def test_evaluation_suites_are_recognised_in_every_spec_form():
    for spec in ("scenes-eval", "scenes-eval:4", "scenes-eval[::6]", "tiny-eval[1:3]", "vbench-all"):
        assert is_evaluation_suite(spec)
    for spec in ("scenes-train", "tiny-train:250", "vbench-train[::2]"):
        assert not is_evaluation_suite(spec)
    assert set(get_suite("scenes-eval").prompts) <= evaluation_prompts()


def test_an_unknown_env_id_names_the_valid_ones():
    with pytest.raises(ValueError, match="MorcaTinyX-v0.*valid: .*MorcaScenes-v0"):
        preset_for_env("MorcaTinyX-v0")
