"""ACID over run-time rules: hand-computed decisions (critical steps test against the low threshold), and every
form in the env, a collection recipe, evaluate.py and accelerate."""

import pytest

from morca_env import policies
from morca_env.rules import forms, runtime
from morca_env.rules.acid import Acid
from morca_env.rules.dicache import DiCache
from morca_env.rules.first_block_cache import FirstBlockCache


def decisions(rule, threshold, trace):
    rule.prepare(forms.RunContext(len(trace), frozenset(), ("cond",)))
    gates = rule.gates(threshold, [runtime.TraceSignal([[v] for v in trace])])
    return forms.simulate(gates, len(trace)), gates[0]


def test_critical_steps_use_the_low_threshold_over_dicache():
    # DiCache, no warm-up, tau .1 (low .05), kappa 1: 1: d .01 (no earlier drift) A .01 reuse;
    # 2: d .0099, rate .01 -> A .0199 reuse; 3: d .04 / 1.02 = .0392, rate 2.96 > 1: critical ->
    # A .0591 tested against .05 -> compute, A = 0; 4: d .0094, rate .76 -> A .0094 reuse; 5: A .0188 reuse
    trace = [1.0, 1.01, 1.02, 1.06, 1.07, 1.08]
    schedule, gate = decisions(Acid(DiCache(0.0)), 0.1, trace)
    assert schedule == [0, 1, 1, 0, 1, 1]
    assert decisions(DiCache(0.0), 0.1, trace)[0] == [0, 1, 1, 1, 1, 1]  # DiCache alone reuses step 3
    # kappa 3: the rate 2.96 is not critical
    assert decisions(Acid(DiCache(0.0), kappa=3.0), 0.1, trace)[0] == [0, 1, 1, 1, 1, 1]


def test_wraps_first_block_cache_keeping_its_strictness():
    # FBC tau .1 (low .05): 1: diff .01 reuse; 2: diff .07 vs step 0, rate 6 -> critical: .07 >= .05 -> compute
    trace = [1.0, 1.01, 1.07]
    assert decisions(Acid(FirstBlockCache()), 0.1, trace)[0] == [0, 1, 0]
    assert decisions(FirstBlockCache(), 0.1, trace)[0] == [0, 1, 1]
    # at a critical step the test is the rule's own: diffusers' convention reuses at diff == low
    exact = [1.0, 1.0625, 1.25]  # diffs .0625, .25 exact in float32; rate 3 -> critical at step 2, low .25
    assert decisions(Acid(FirstBlockCache("diffusers")), 0.5, exact)[0] == [0, 1, 1]
    assert decisions(Acid(FirstBlockCache()), 0.5, exact)[0] == [0, 1, 0]


def test_bad_settings_say_what_is_valid():
    with pytest.raises(ValueError, match="rule='teacache'; valid: dicache, easycache, first-block-cache, sencache"):
        policies.make("acid", rule="teacache")
    with pytest.raises(ValueError, match=r"ratio=0 must be a number in \(0, 1\]"):
        Acid(DiCache(), ratio=0)
    with pytest.raises(ValueError, match="kappa=-1 must be a number > 0"):
        Acid(DiCache(), kappa=-1)
    assert policies.make("acid", rule="easycache", rule_options={"warmup": 0.1}).rule.inner.warmup == 0.1


def test_acid_wraps_sencache_through_its_predicted_error():
    """SenCache's gate exposes its predicted error as the drift ACID reads."""
    from morca_env.rules import forms, runtime
    from morca_env.rules.sencache import SenCache

    assert policies.make("acid", rule="sencache").rule.inner.name == "sencache"
    inputs = [10, 9, 8.8, 8.1, 8.0, 7.9, 7.8, 7.7]
    signal = runtime.TraceSignal(inputs=[[x] for x in inputs], timesteps=[0.5] * 8,
                                 outputs=[[1.0 + i] for i in range(8)])

    def schedule(rule):
        rule.prepare(forms.RunContext(8, frozenset(), ("cond", "uncond")))
        return forms.simulate(rule.gates(0.6, [signal]), 8, frozenset())

    # steps 0, 1 computed: S_x = 1 (dv 1 for dx 1). Error from step 1 (o = 2): step 2 .1 -> reuse; step 3 .45:
    # below SenCache's .6, but it grew 350% (> kappa .5): critical, ACID's low threshold .3 -> compute
    assert schedule(SenCache(0.25))[:4] == [0, 0, 1, 1]
    assert schedule(Acid(SenCache(0.25), ratio=0.5, kappa=0.5))[:4] == [0, 0, 1, 0]
