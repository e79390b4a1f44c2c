"""EasyCache: hand-computed decisions on an input/output trace, the signal read from what the run computes, and every
form in the env, a collection recipe, evaluate.py and accelerate."""

import pytest
import torch

from morca_env import schedulers
from morca_env.schedulers.rules import forms, runtime
from morca_env.schedulers.rules.easycache import EasyCache
from tests.schedulers import rule_forms


def run(inputs, outputs, threshold, warmup, forced=(), branches=("cond", "uncond")):
    """(schedule, the gate) of EasyCache over a hand-written trace (1-element tensors; outputs read on computed
    steps only: None elsewhere)."""
    rule = EasyCache(warmup)
    rule.prepare(forms.RunContext(len(inputs), frozenset(forced), branches))
    signal = runtime.TraceSignal(inputs=[[x] for x in inputs], outputs=[[o] if o is not None else [0.0]
                                                                        for o in outputs])
    gates = rule.gates(threshold, [signal])
    return forms.simulate(gates, len(inputs), frozenset(forced)), gates[0]


def test_gate_follows_the_official_rule_on_a_hand_written_trace():
    # N = 8, warmup .25: steps 0, 1 and the last (7) compute.
    # 0: o 1; 1: o 1.2, k = |1.2 - 1| / |9 - 10| = .2; 2: pred .2 * |8 - 9| / 1.2 = .167 -> A .167 reuse;
    # 3: .2 * .5 / 1.2 = .083 -> A .25 reuse; 4: A .333 >= .3 -> compute, A = 0, o 1.5,
    # k = |1.5 - 1.2| / |x_4 - x_1| = .3 / 2 = .15 (the last two *computed* steps);
    # 5: .15 * .5 / 1.5 = .05 reuse; 6: A .1 reuse; 7: last, computes
    inputs = [10, 9, 8, 7.5, 7, 6.5, 6, 5]
    outputs = [1, 1.2, None, None, 1.5, None, None, 2.0]
    schedule, gate = run(inputs, outputs, 0.3, 0.25)
    assert schedule == [0, 0, 1, 1, 0, 1, 1, 0]
    # (with k from consecutive inputs, |1.5 - 1.2| / |7 - 7.5| = .6, step 6 would compute: A .2 + .2)
    assert gate.k == pytest.approx(0.25)  # the last step computed too: |2 - 1.5| / |5 - 7|


def test_k_comes_from_the_last_two_computed_steps_and_the_skip_test_is_strict():
    # 0: o 1; 1: o 2, k = 1 / 1 = 1; 2: pred = 1 * |2 - 3| / 2 = .5 = tau -> not < tau: compute
    inputs, outputs = [4.0, 3.0, 2.0, 1.0], [1.0, 2.0, 2.5, 3.0]
    schedule, gate = run(inputs, outputs, 0.5, 0.5)
    assert schedule == [0, 0, 0, 0]
    schedule, _ = run(inputs, outputs, 0.5000001, 0.5)
    assert schedule == [0, 0, 1, 0]


def test_one_shared_decision_on_the_cond_branch_and_forced_steps_reset():
    rule = EasyCache()
    rule.prepare(forms.RunContext(10, frozenset(), ("cond", "uncond")))
    assert rule.rule_forced(10) == frozenset({0, 1, 9}) and rule.rule_forced(50) == frozenset(range(10)) | {49}

    class View:
        caches = []

    signals = rule.signals(View())
    assert [s.branch for s in signals] == ["cond"]  # the uncond call follows the cond decision
    # an env-forced compute at step 3 resets A and sets k from its output
    inputs = [10, 9, 8, 7.5, 7, 6.5, 6, 5]
    outputs = [1, 1.2, None, 1.35, 1.5, None, None, 2.0]
    schedule, gate = run(inputs, outputs, 0.3, 0.25, forced={3})
    # 2: A .167 reuse; 3 forced: A 0, k = |1.35 - 1.2| / |7.5 - 9| = .1; 4: .1 * .5 / 1.35 = .037 reuse;
    # 5: A .074 reuse; 6: A .111 reuse; 7 last
    assert schedule == [0, 0, 1, 0, 1, 1, 1, 0]


def test_bad_settings_say_what_is_valid():
    with pytest.raises(ValueError, match=r"warmup=1.5 must be a fraction of the steps in \[0, 1\]"):
        EasyCache(1.5)
    with pytest.raises(ValueError, match="setting='4x'; valid: default, 2x, 3x"):
        schedulers.make("easycache", setting="4x")
    with pytest.raises(ValueError, match="threshold=-1 must be a finite number >= 0"):
        schedulers.make("easycache", threshold=-1)


def test_signal_is_what_the_run_computes(wan21_pipe):
    """The cache keeps the transformer's cond output of each computed call (the signal's o), by observing."""
    from morca_env.diffusion.denoiser import DenoiserConfig, StepwiseDenoiser
    from tests.conftest import prompt_embeds

    embeds = prompt_embeds()
    seen = []
    hook = wan21_pipe.transformer.register_forward_hook(lambda m, a, out: seen.append(out[0]))
    den = StepwiseDenoiser(wan21_pipe, DenoiserConfig(num_inference_steps=4, height=32, width=32, num_frames=9))
    try:
        den.start(prompt_embeds=embeds[0], negative_prompt_embeds=embeds[1], seed=0)
        EasyCache().observe(den.caches)
        signal = runtime.OutputSignal(den, "cond")
        assert torch.equal(signal.input(0), den.latents)
        den.step(reuse=False)
        assert torch.equal(signal.output(0), seen[0]) and torch.equal(den.cache(0).model_output("uncond"), seen[1])
        den.step(reuse=True)  # a reused call's output is not kept
        assert torch.equal(signal.output(1), seen[0]) and not torch.equal(seen[2], seen[0])
    finally:
        hook.remove()
        den.close()


# ---------------------------------------------------------------- the three forms, end to end
def test_exact_form_is_the_native_rule_at_the_found_threshold(envs):
    rule_forms.check_exact_is_native("easycache", *envs)
