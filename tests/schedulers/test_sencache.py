"""SenCache: hand-computed decisions on an input/timestep/output trace, the sensitivity fit, the signal read from
what the run computes, and its exact form; the forms' shared checks are in test_runtime_rule_forms.py."""

import pytest

from morca_env import schedulers
from morca_env.schedulers.rules import forms, runtime
from morca_env.schedulers.rules.sencache import SenCache, fit_sensitivities
from tests.schedulers import rule_forms


def run(inputs, timesteps, outputs, threshold, warmup=0.25, forced=(), history=3):
    """(schedule, the gate) of SenCache over a hand-written trace (1-element tensors; outputs are read on computed
    steps only: None elsewhere)."""
    rule = SenCache(warmup, history)
    rule.prepare(forms.RunContext(len(inputs), frozenset(forced), ("cond", "uncond")))
    signal = runtime.TraceSignal(inputs=[[x] for x in inputs], timesteps=timesteps,
                                 outputs=[[o] if o is not None else [0.0] for o in outputs])
    gates = rule.gates(threshold, [signal])
    return forms.simulate(gates, len(inputs), frozenset(forced)), gates[0]


def test_fit_is_non_negative_least_squares():
    # dv = 2 dx + 0.5 dtau exactly
    assert fit_sensitivities([(1, 2, 3), (2, 1, 4.5)]) == pytest.approx((2.0, 0.5))
    # the unconstrained solution has S_tau < 0 (dv falls as dtau grows): clipped to 0, S_x refitted alone
    s_x, s_tau = fit_sensitivities([(1, 1, 2), (1, 2, 1)])
    assert s_tau == 0 and s_x == pytest.approx(1.5)
    assert fit_sensitivities([(2, 0, 1)]) == pytest.approx((0.5, 0.0))  # one equation: the non-negative fit


def test_gate_follows_the_derived_rule_on_a_hand_written_trace():
    # N = 8, warmup .25: steps 0, 1 and the last (7) compute. Step 1 gives the first equation
    # (|9 - 10|, |.9 - 1|, |1.2 - 1|) = (1, .1, .2); the error of steps 2 and 3 is measured from step 1.
    inputs = [10, 9, 8, 7.5, 7, 6.5, 6, 5]
    timesteps = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3]
    outputs = [1, 1.2, None, None, 1.5, None, None, 2.0]
    s_x, s_t = fit_sensitivities([(1.0, 0.1, 0.2)])
    e2 = (s_x * 1 + s_t * 0.1) / 1.2  # step 2 from the last computed step 1: |8-9|, |.8-.9|
    e3 = (s_x * 1.5 + s_t * 0.2) / 1.2  # step 3 from step 1 (nothing accumulated): |7.5-9|, |.7-.9|
    threshold = (e2 + e3) / 2  # reuse 2, compute 3
    schedule, gate = run(inputs, timesteps, outputs[:3] + [1.4] + outputs[4:], threshold)
    assert e2 < threshold < e3
    assert schedule[:4] == [0, 0, 1, 0]
    # step 3 computed: a second equation from steps 1 -> 3, (|7.5-9|, |.7-.9|, |1.4-1.2|)
    assert gate.equations[:2] == [pytest.approx((1.0, 0.1, 0.2)), pytest.approx((1.5, 0.2, 0.2))]
    assert schedule[-1] == 0  # the last step computes


def test_prediction_is_from_the_last_computed_step_and_the_skip_test_is_strict():
    # S from one equation (dx 1, dtau 0, dv .5): S_x = .5, S_tau = 0; step 2: e = .5 * |2 - 3| / 2 = .25
    inputs, timesteps, outputs = [4.0, 3.0, 2.0, 1.0], [0.5, 0.5, 0.5, 0.5], [1.5, 2.0, 2.5, 3.0]
    schedule, gate = run(inputs, timesteps, outputs, 0.25, warmup=0.5)
    assert schedule == [0, 0, 0, 0] and gate.sensitivity == pytest.approx((0.5, 0.0))
    schedule, _ = run(inputs, timesteps, outputs, 0.2500001, warmup=0.5)
    assert schedule == [0, 0, 1, 0]


def test_timestep_sensitivity_counts():
    """With inputs that do not change, only the timestep term can stop a reuse."""
    inputs = [1.0] * 6
    timesteps = [1.0, 0.8, 0.6, 0.4, 0.2, 0.0]
    outputs = [1.0, 1.4, None, None, None, 3.0]  # dv .4 for dtau .2: S_tau = 2 (S_x: dx = 0)
    schedule, gate = run(inputs, timesteps, outputs, 0.5, warmup=0.34)  # forced: 0, 1 (round(.34*6)=2) and 5
    # step 2: e = 2 * |.6 - .8| / 1.4 = .286 < .5 reuse; step 3: 2 * .4 / 1.4 = .571 -> compute (output None: 0.0)
    assert gate.sensitivity is not None
    assert schedule[:4] == [0, 0, 1, 0]


def test_one_shared_decision_on_the_cond_branch_and_bad_settings():
    rule = SenCache()
    rule.prepare(forms.RunContext(10, frozenset(), ("cond", "uncond")))
    assert rule.rule_forced(10) == frozenset({0, 9}) and rule.rule_forced(50) == frozenset(range(5)) | {49}

    class View:
        caches = []

    assert [s.branch for s in rule.signals(View())] == ["cond"]
    with pytest.raises(ValueError, match=r"warmup=2 must be a fraction of the steps in \[0, 1\]"):
        SenCache(2)
    with pytest.raises(ValueError, match=r"history=0 must be an integer >= 1"):
        SenCache(history=0)
    with pytest.raises(ValueError, match="threshold=-1 must be a finite number >= 0"):
        schedulers.make("sencache", threshold=-1)


def test_timestep_signal_is_the_runs_timestep(wan21_pipe):
    from morca_env.diffusion.denoiser import DenoiserConfig, StepwiseDenoiser
    from tests.conftest import prompt_embeds

    embeds = prompt_embeds()
    den = StepwiseDenoiser(wan21_pipe, DenoiserConfig(num_inference_steps=4, height=32, width=32, num_frames=9))
    try:
        den.start(prompt_embeds=embeds[0], negative_prompt_embeds=embeds[1], seed=0)
        signal = runtime.OutputSignal(den, "cond")
        first = signal.timestep(0)
        assert first == pytest.approx(float(den.timesteps[0]) / 1000)
        den.step(reuse=False)
        second = signal.timestep(1)
        assert second == pytest.approx(float(den.timesteps[1]) / 1000) and second < first
    finally:
        den.close()


def test_exact_form_is_the_native_rule_at_the_found_threshold(envs):
    rule_forms.check_exact_is_native("sencache", *envs)
