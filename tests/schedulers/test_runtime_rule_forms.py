"""The checks every run-time cache rule's three forms must pass (tests/schedulers/rule_forms.py), once per rule: in the env
at exact K, the global map tracking its target, in a collection recipe and evaluate.py, collecting datasets, and
under accelerate on a tiny Wan2.1 and Wan2.2. Each rule's own module tests its decisions by hand."""

import pytest

from tests.schedulers import rule_forms



def runtime_rules() -> tuple[str, ...]:
    """Every rule module whose rule reads run-time signals, found in the registry (a new rule needs no entry here)."""
    from morca_env import schedulers
    from morca_env.schedulers.rules.runtime import RuntimeRule

    return tuple(name for name in schedulers.rule_names() if isinstance(schedulers.make(name).rule, RuntimeRule))


RUNTIME_RULES = runtime_rules()


def test_the_registry_finds_every_runtime_rule():
    assert set(RUNTIME_RULES) >= {"first-block-cache", "easycache", "dicache", "acid", "sencache"}  # and new ones
    assert "teacache" not in RUNTIME_RULES and "magcache" not in RUNTIME_RULES  # known before the run


@pytest.mark.slow  # fits the global map on free runs; test_registry runs each name at exact K too
@pytest.mark.parametrize("rule", RUNTIME_RULES)
def test_every_form_runs_in_the_env_at_exact_k(rule, envs):
    rule_forms.check_forms_in_env(rule, *envs)


@pytest.mark.slow  # fits the global map on free runs
@pytest.mark.parametrize("rule", RUNTIME_RULES)
def test_global_threshold_tracks_the_target(rule, envs):
    rule_forms.check_global_tracks_the_target(rule, *envs)


@pytest.mark.parametrize("rule", RUNTIME_RULES)
def test_forms_run_in_a_collection_recipe_and_evaluate(rule, envs):
    rule_forms.check_recipe_and_evaluate(rule, *envs)


@pytest.mark.slow  # collects with every form (the global one fits its map on free runs)
@pytest.mark.parametrize("rule", RUNTIME_RULES)
def test_forms_collect_datasets(rule, tmp_path, monkeypatch):
    rule_forms.check_collection(rule, tmp_path, monkeypatch)


@pytest.mark.parametrize("kind", ["wan21", "wan22"])
@pytest.mark.parametrize("rule", RUNTIME_RULES)
def test_every_form_runs_under_accelerate(rule, kind):
    given = {"speedups": [1.0, 3.0], "thresholds": [0.01, 1.0]}  # the global form needs a map without an env
    rule_forms.check_accelerate(rule, kind, threshold_map=given)


def test_threshold_search_plays_no_schedule_it_does_not_need():
    """Each schedule played by a run-time rule's exact form is a generation: once a threshold gives K, stop."""
    from morca_env.schedulers.rules import forms

    played = []

    def schedule_at(threshold):  # reuses grow with the threshold: 1 reuse per 0.01
        played.append(threshold)
        return [1] * min(10, int(threshold / 0.01)) + [0] * (10 - min(10, int(threshold / 0.01)))

    threshold, schedule = forms.search_threshold(schedule_at, 4, start=0.04)
    assert sum(schedule) == 4 and threshold == 0.04 and played == [0.04]  # not the bracket's bottom, 0.0
