"""ACID over run-time rules: hand-computed decisions (critical steps test against the low threshold), and every
form in the env, a collection recipe, evaluate.py and accelerate."""

import pytest

from morca_env import schedulers
from morca_env.schedulers.rules import forms, runtime
from morca_env.schedulers.rules.acid import Acid
from morca_env.schedulers.rules.dicache import DiCache
from morca_env.schedulers.rules.first_block_cache import FirstBlockCache


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
    with pytest.raises(ValueError, match="rule='seacache'; valid: dicache, easycache, first-block-cache, magcache, "
                                         "sencache, teacache"):
        schedulers.make("acid", rule="seacache")
    with pytest.raises(TypeError, match=r"unexpected options \['iterations'\]: ACID over 'teacache' plays a fixed mask"):
        schedulers.make("acid-exact", rule="teacache", iterations=3)
    with pytest.raises(ValueError, match=r"ratio=0 must be a number in \(0, 1\]"):
        Acid(DiCache(), ratio=0)
    with pytest.raises(ValueError, match="kappa=-1 must be a number > 0"):
        Acid(DiCache(), kappa=-1)
    assert schedulers.make("acid", rule="easycache", rule_options={"warmup": 0.1}).rule.inner.warmup == 0.1


def test_acid_wraps_sencache_through_its_predicted_error():
    """SenCache's gate exposes its predicted error as the drift ACID reads."""
    from morca_env.schedulers.rules import forms, runtime
    from morca_env.schedulers.rules.sencache import SenCache

    assert schedulers.make("acid", rule="sencache").rule.inner.name == "sencache"
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


def mask_decisions(rule, threshold, num_steps):
    rule.prepare(forms.RunContext(num_steps, frozenset({0}), ("cond",)))
    return forms.simulate(rule.gates(threshold), num_steps, frozenset({0}))


def test_wraps_teacache_through_its_increments():
    """Over TeaCache (identity polynomial: increments = distances; its own forced steps 0 and N-1) the drift is
    p(x_i), not the accumulated value; tau .1, low .05, kappa 1. 1: .03 reuse (A .03); 2: .01, rate .67 -> A .04
    reuse; 3: .025, rate 1.5: critical, A .065 >= .05 -> compute (TeaCache alone: .065 < .1, reuse; the accumulated
    value's rate, .625, is not critical); 4: .01, rate .6 -> A .01 reuse; 5: .012 -> A .022 reuse; 6: forced."""
    from morca_env.schedulers.rules.acid import AcidMask, acid
    from morca_env.schedulers.rules.teacache import TeaCache

    distances = [0.0, 0.03, 0.01, 0.025, 0.01, 0.012, 0.0]
    identity = [0, 0, 0, 1, 0]
    wrapped = acid(TeaCache(identity, distances=distances))
    assert isinstance(wrapped, AcidMask) and wrapped.name == "acid-teacache"
    assert mask_decisions(wrapped, 0.1, 7) == [0, 1, 1, 0, 1, 1, 0]
    assert mask_decisions(TeaCache(identity, distances=distances), 0.1, 7) == [0, 1, 1, 1, 1, 1, 0]


def test_wraps_magcache_through_its_error_increments():
    """Over MagCache (no retention, K_max 10) the drift is |1 - rho|; tau .2, low .1. 1: rho .99, drift .01, E .01
    reuse; 2: rho .9801, drift .0199 (rate .99) -> E .0299 reuse; 3: rho .88209, drift .11791 (rate 4.9): critical,
    E .14781 >= .1 -> compute (MagCache alone: < .2, reuse); 4: restarts, rho .99, E .01 reuse (MagCache alone:
    E .27454 >= .2 -> compute)."""
    from morca_env.schedulers.rules.acid import acid
    from morca_env.schedulers.rules.magcache import MagCache

    cond = [1.0, 0.99, 0.99, 0.9, 0.99, 0.99, 0.99]
    ratios = [r for pair in zip(cond, cond) for r in pair]  # interleaved cond / uncond
    assert mask_decisions(acid(MagCache(ratios, max_skip=10, retention=0.0)), 0.2, 7)[:5] == [0, 1, 1, 0, 1]
    assert mask_decisions(MagCache(ratios, max_skip=10, retention=0.0), 0.2, 7)[:5] == [0, 1, 1, 1, 0]


@pytest.mark.parametrize("inner", ["teacache", "magcache"])
def test_acid_over_mask_rules_runs_every_form_in_the_env(inner, tmp_path):
    from tests.schedulers import rule_forms

    env, free = rule_forms.make_envs(tmp_path)
    rule_forms.check_forms_in_env("acid", env, free, rule=inner)
    assert schedulers.make("acid-exact", env, rule=inner).rule.inner.name == inner


@pytest.mark.parametrize("kind", ["wan21", "wan22"])
@pytest.mark.parametrize("inner", ["teacache", "magcache"])
def test_acid_over_mask_rules_runs_under_accelerate(inner, kind):
    from tests.schedulers import rule_forms

    rule_forms.check_accelerate("acid", kind, rule=inner)
