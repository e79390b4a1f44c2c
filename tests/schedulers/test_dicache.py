"""DiCache: hand-computed decisions on block-0 output traces, warm-up in calls, the probe and its cost, and every form
in the env, a collection recipe, evaluate.py and accelerate."""

import pytest
import torch

from morca_env import schedulers
from morca_env.rollout import rollout
from morca_env.schedulers.rules import forms, runtime
from morca_env.schedulers.rules.dicache import DiCache
from tests.schedulers import rule_forms


def rule_for(num_steps, retention, forced=(), branches=("cond", "uncond")):
    rule = DiCache(retention)
    rule.prepare(forms.RunContext(num_steps, frozenset(forced), branches))
    return rule


def traces(rule, threshold, trace, forced=frozenset()):
    """Each branch's own decisions (over the same block-0 output trace), and the env's shared one."""
    signals = [runtime.TraceSignal([[y] for y in trace]) for _ in rule.context.branches]
    own = {b: forms.simulate([gate], len(trace)) for b, gate in zip(rule.context.branches, rule.gates(threshold, signals))}
    return own, forms.simulate(rule.gates(threshold, signals), len(trace), forced)


def test_gate_follows_the_official_rule_on_a_hand_written_trace():
    # N = 6, R = .25: int(2 * 6 * .25) = 3 calls of warm-up: cond steps 0, 1 (calls 0, 2), uncond step 0 (call 1).
    # cond: 2: |1.04 - 1| / 1 = .04 -> A .04 reuse; 3: .04 / 1.04 = .0385 -> A .0785 reuse (against step 2's probe:
    # y is updated every step); 4: .04 / 1.08 = .037 -> A .1155 compute, A = 0; 5: .04 / 1.12 = .0357 reuse.
    # uncond: 1: 0 -> reuse; 2: A .04; 3: A .0785; 4: A .1155 compute; 5 reuse
    trace = [1.0, 1.0, 1.04, 1.08, 1.12, 1.16]
    own, shared = traces(rule_for(6, 0.25), 0.1, trace)
    assert own == {"cond": [0, 0, 1, 1, 0, 1], "uncond": [0, 1, 1, 1, 0, 1]}
    assert shared == [0, 0, 1, 1, 0, 1]  # a step reuses only when both branches' gates want to


def test_skip_test_is_strict_and_warm_up_counts_calls():
    own, _ = traces(rule_for(3, 1 / 3), 0.5, [1.0, 1.0, 1.5])  # int(2 * 3 / 3) = 2 calls: step 0 of both
    assert own["cond"] == [0, 1, 0]  # 2: A = 0 + .5 exactly -> not < .5 -> compute
    rule = rule_for(5, 0.3)  # int(2 * 5 * .3) = 3 calls
    assert (rule.retained_steps(0), rule.retained_steps(1)) == (2, 1)
    assert rule_for(50, 0.2).retained_steps(1) == 10  # the authors' 10 of 50 steps


def test_forced_steps_reset_the_accumulator_without_a_probe():
    class Counting(runtime.TraceSignal):
        def __init__(self, values):
            super().__init__(values)
            self.probed = []

        def probe(self, step):
            self.probed.append(step)
            return super().probe(step)

    trace = [1.0, 1.04, 1.08, 1.12, 1.16]
    rule = rule_for(5, 0.0, forced={2}, branches=("cond",))
    signal = Counting([[y] for y in trace])
    # 0: no previous y -> compute; 1: A .04 reuse; 2 forced: A = 0, y = 1.08 observed; 3: .037 reuse; 4: A .073 reuse
    assert forms.simulate(rule.gates(0.1, [signal]), 5, frozenset({2})) == [0, 1, 0, 1, 1]
    assert signal.probed == [1, 3, 4]


def test_bad_settings_say_what_is_valid():
    with pytest.raises(ValueError, match=r"retention \(R\)=2 must be a number in \[0, 1\]"):
        DiCache(2)
    with pytest.raises(ValueError, match="threshold=-0.08 must be a finite number >= 0"):
        schedulers.make("dicache", threshold=-0.08)
    with pytest.raises(ValueError, match="kind='input'; valid"):
        runtime.HeadSignal(None, "cond", kind="input")


def test_probe_is_block_0_of_the_step_and_costs_one_block_per_branch(wan21_pipe):
    """The probe's output equals block 0 of the call that then computes; a free run runs block 0 once more than
    block 1 per branch on every probed step (after warm-up): the probe's cost, inside the policy's time."""
    from morca_env.diffusion.denoiser import DenoiserConfig, StepwiseDenoiser
    from tests.conftest import prompt_embeds

    embeds = prompt_embeds()
    den = StepwiseDenoiser(wan21_pipe, DenoiserConfig(num_inference_steps=6, height=32, width=32, num_frames=9))
    calls = {0: 0, 1: 0}
    hooks = [wan21_pipe.transformer.blocks[i].attn1.register_forward_pre_hook(  # runs only when block i computes
        lambda *_, i=i: calls.__setitem__(i, calls[i] + 1)) for i in (0, 1)]
    try:
        start = {"prompt_embeds": embeds[0], "negative_prompt_embeds": embeds[1], "seed": 0}
        rule = rule_for(6, 2 / 12, forced={0, 5})  # warm-up: int(2) calls: step 0 of both branches
        den.start(**start)
        rule.observe(den.caches)
        den.step(reuse=False)
        signal = runtime.HeadSignal(den, "uncond", kind="output")
        probe = signal.probe(1)
        den.step(reuse=False)
        assert torch.equal(probe, signal.observed(1))
        calls.update({0: 0, 1: 0})
        schedule = runtime.free_run(rule, den, start, 0.15, frozenset({0, 5}))
        assert 0 < sum(schedule) < 4  # some probed steps compute: they run block 0 again
        computed_calls = 2 * (6 - sum(schedule))
        assert calls[1] == computed_calls and calls[0] == computed_calls + 2 * 4  # probes at steps 1-4
    finally:
        for hook in hooks:
            hook.remove()
        den.close()


# ---------------------------------------------------------------- the three forms, end to end
BUDGET = 6  # attainable by a threshold for this prompt on the random tiny model


def test_exact_form_is_the_native_rule_at_the_found_threshold(envs):
    env, free = envs
    exact = schedulers.make("dicache-exact", env)
    trajectory = rollout(env, exact, {"prompt": "a red circle", "seed": 1, "budget": BUDGET})
    assert exact.clipped is None and exact.last_threshold > 0
    native = rollout(free, schedulers.make("dicache", env, threshold=exact.last_threshold),
                     {"prompt": "a red circle", "seed": 1, "budget": BUDGET})
    assert native.schedule == trajectory.schedule
