"""FirstBlockCache: hand-computed decisions on signal traces, parity with diffusers' FirstBlockCacheConfig hook on a
tiny Wan, the block-0 probe and its cost, and every form in the env, a collection recipe, evaluate.py and accelerate."""

import pytest
import torch

from morca_env import schedulers
from morca_env.schedulers.rules import forms, runtime
from morca_env.schedulers.rules.first_block_cache import FirstBlockCache
from tests.schedulers import rule_forms


def rule_for(num_steps, forced=(), branches=("cond", "uncond"), convention="official"):
    rule = FirstBlockCache(convention)
    rule.prepare(forms.RunContext(num_steps, frozenset(forced), branches))
    return rule


def masks(rule, threshold, traces):
    """Each branch's own decisions over its trace of block-0 residuals (1-element tensors)."""
    return {branch: forms.simulate([rule.gate(runtime.TraceSignal([[v] for v in trace]), threshold)], len(trace))
            for branch, trace in traces.items()}


def shared(rule, threshold, traces, forced=frozenset()):
    gates = rule.gates(threshold, [runtime.TraceSignal([[v] for v in t]) for t in traces.values()])
    return forms.simulate(gates, len(next(iter(traces.values()))), forced)


def test_gate_follows_the_rule_on_a_hand_written_trace():
    # threshold .1; the reference is the residual of the last computed step:
    # 0: no reference -> compute (ref 1); 1: |1.05-1|/1 = .05 reuse; 2: .12 compute (ref 1.12);
    # 3: .08/1.12 = .071 reuse; 4: .13/1.12 = .116 compute (ref 1.25); 5: .35/1.25 = .28 compute
    trace = [1.0, 1.05, 1.12, 1.2, 1.25, 0.9]
    assert masks(rule_for(6), 0.1, {"cond": trace}) == {"cond": [0, 1, 0, 1, 0, 0]}
    # no accumulation: many small changes against the same reference reuse until the sum of drifts passes it
    assert masks(rule_for(5), 0.1, {"cond": [1.0, 1.04, 1.08, 1.12, 1.04]})["cond"] == [0, 1, 1, 0, 1]
    # 4: |1.04 - 1.12| / 1.12 = .071 -> reuse (against step 3's residual, not step 0's)


def test_strictness_official_below_diffusers_at_or_below():
    trace = [1.0, 1.5, 1.5]  # step 1: diff = .5 exactly (exact in float32)
    assert masks(rule_for(3), 0.5, {"cond": trace})["cond"] == [0, 0, 1]  # ParaAttention: diff < threshold
    assert masks(rule_for(3, convention="diffusers"), 0.5, {"cond": trace})["cond"] == [0, 1, 1]  # diff <= threshold
    # 2 (diffusers): reference still step 0's: |1.5 - 1| / 1 = .5 <= .5 -> reuse


def test_branches_decide_alone_and_the_env_decides_once_for_both():
    traces = {"cond": [1.0, 1.05, 1.08, 1.3], "uncond": [1.0, 1.2, 1.21, 1.22]}
    # cond alone: .05, .08 reuse, .3 compute; uncond alone: .2 compute (ref 1.2), .0083 and .0167 reuse
    assert masks(rule_for(4), 0.1, traces) == {"cond": [0, 1, 1, 0], "uncond": [0, 0, 1, 1]}
    # shared: 1 computes (uncond says no), so both references move to step 1: 2: cond .03/1.05, uncond .0083
    # reuse; 3: cond .25/1.05 = .24 computes
    assert shared(rule_for(4), 0.1, traces) == [0, 0, 1, 0]


def test_forced_steps_compute_without_a_probe_and_become_the_reference():
    class Counting(runtime.TraceSignal):
        probed: list = []

        def probe(self, step):
            self.probed.append(step)
            return super().probe(step)

    trace = [1.0, 1.05, 1.1]
    rule = rule_for(3)
    # free: 1 reuses (.05); 2: |1.1 - 1| / 1 = .1, not < .1 -> compute
    assert shared(rule, 0.1, {"cond": trace}) == [0, 1, 0]
    # step 1 forced: it computes and becomes the reference: 2: .05 / 1.05 -> reuse
    signal = Counting([[v] for v in trace])
    assert forms.simulate(rule_for(3, forced={1}).gates(0.1, [signal]), 3, frozenset({1})) == [0, 0, 1]
    assert signal.probed == [2]  # no probe at step 0 (no reference) nor at the forced step 1


def test_bad_settings_say_what_is_valid():
    with pytest.raises(ValueError, match="convention='exact'; valid"):
        FirstBlockCache("exact")
    with pytest.raises(ValueError, match="threshold=-0.1 must be a finite number >= 0"):
        schedulers.make("first-block-cache", threshold=-0.1)
    with pytest.raises(ValueError, match="fit_prompts=0 must be a positive integer"):
        schedulers.make("first-block-cache-global", fit_prompts=0)
    with pytest.raises(ValueError, match="must hold >= 2 increasing positive thresholds"):
        schedulers.make("first-block-cache-global", grid=[0.1, 0.01])
    with pytest.raises(ValueError, match="iterations=0 must be a positive integer"):
        schedulers.make("first-block-cache-exact", iterations=0)
    with pytest.raises(ValueError, match="decides from the run's own signals"):
        rule_for(3).gates(0.1)


# ---------------------------------------------------------------- the probe, and parity with diffusers
def _record_diffusers(pipe, threshold, steps, call):
    """Per branch, block 0's output residual at every transformer call of diffusers' FirstBlockCache run (block 0's
    inputs recorded, its plain output recomputed after the run: the hook hides it on reuse calls) and whether the
    other blocks ran."""
    from diffusers import FirstBlockCacheConfig

    inputs, computed = [], []

    def head(module, args, kwargs):
        inputs.append((args, kwargs))
        computed.append(0)

    block = pipe.transformer.blocks[0]
    hooks = [block.register_forward_pre_hook(head, with_kwargs=True),
             pipe.transformer.blocks[1].attn1.register_forward_pre_hook(lambda *_: computed.__setitem__(-1, 1))]
    pipe.transformer.enable_cache(FirstBlockCacheConfig(threshold=threshold))
    try:
        pipe(num_inference_steps=steps, generator=torch.Generator().manual_seed(0), **call)
    finally:
        pipe.transformer.disable_cache()
        for hook in hooks:
            hook.remove()
    assert len(computed) == 2 * steps
    with torch.no_grad():
        residuals = [block(*args, **kwargs) - args[0] for args, kwargs in inputs]
    return ({"cond": residuals[0::2], "uncond": residuals[1::2]},
            {"cond": [1 - c for c in computed[0::2]], "uncond": [1 - c for c in computed[1::2]]})


def test_decisions_equal_diffusers_first_block_cache_on_a_tiny_wan(wan21_pipe):
    """diffusers' hook runs block 0 on every call: given the block-0 residuals it saw, our gate (diffusers'
    convention) makes its decisions per branch at every threshold; the official one differs only at equality."""
    from tests.conftest import prompt_embeds

    embeds = prompt_embeds()
    call = dict(prompt_embeds=embeds[0], negative_prompt_embeds=embeds[1], height=32, width=32, num_frames=9,
                guidance_scale=5.0, output_type="latent")
    steps, reused = 10, 0
    for threshold in (0.02, 0.08, 0.2):
        traces, theirs = _record_diffusers(wan21_pipe, threshold, steps, call)
        ours = {b: forms.simulate([rule_for(steps, convention="diffusers").gate(runtime.TraceSignal(traces[b]),
                                                                                threshold)], steps)
                for b in traces}
        assert ours == theirs, threshold
        official = {b: forms.simulate([rule_for(steps).gate(runtime.TraceSignal(traces[b]), threshold)], steps)
                    for b in traces}
        assert official == theirs  # no residual change lands exactly on these thresholds
        reused += sum(map(sum, theirs.values()))
    assert reused > 0


def test_block_0_arguments_are_kept_only_for_rules_that_probe(wan21_pipe):
    """Binding block 0's call arguments costs every transformer call: only runs with `keep_head` pay it."""
    from morca_env.diffusion.denoiser import DenoiserConfig, StepwiseDenoiser
    from tests.conftest import prompt_embeds

    embeds = prompt_embeds()
    den = StepwiseDenoiser(wan21_pipe, DenoiserConfig(num_inference_steps=4, height=32, width=32, num_frames=9))
    try:
        den.start(prompt_embeds=embeds[0], negative_prompt_embeds=embeds[1], seed=0)
        den.step(reuse=False)
        assert den.cache(0).head_arguments("cond") is None
        den.caches[0].keep_head = True
        den.step(reuse=False)
        assert {"encoder_hidden_states", "temb"} <= set(den.cache(1).head_arguments("cond"))
    finally:
        den.close()


def test_probe_equals_the_computed_block_and_costs_one_block_per_branch(wan21_pipe):
    """The probe (block 0 on the step's input, before the decision) equals block 0 of the call that then computes,
    bit for bit; block 0 runs once more than the other blocks on each probed step and branch: that is the probe's
    cost, inside the policy's time."""
    from morca_env.diffusion.denoiser import DenoiserConfig, StepwiseDenoiser
    from morca_env.diffusion.signals import head_block_residual
    from tests.conftest import prompt_embeds

    embeds = prompt_embeds()
    den = StepwiseDenoiser(wan21_pipe, DenoiserConfig(num_inference_steps=6, height=32, width=32, num_frames=9))
    calls = {0: 0, 1: 0}
    hooks = [wan21_pipe.transformer.blocks[i].attn1.register_forward_pre_hook(  # runs only when block i computes
        lambda *_, i=i: calls.__setitem__(i, calls[i] + 1)) for i in (0, 1)]
    try:
        start = {"prompt_embeds": embeds[0], "negative_prompt_embeds": embeds[1], "seed": 0}
        den.start(**start)
        den.caches[0].keep_head = True
        den.step(reuse=False)
        with pytest.raises(ValueError, match=r"probe depth=3 must be in \[1, 2\]"):
            head_block_residual(*den.step_input(1)[:1], den.cache(1), "cond", *den.step_input(1)[1:], depth=3)
        probes = {b: head_block_residual(den.expert(1), den.cache(1), b, *den.step_input(1)[1:]) for b in den.branches}
        den.step(reuse=False)
        for branch in den.branches:
            assert torch.equal(probes[branch], den.cache(1).head_residual(branch))
        # a free run of the rule: block 0 runs on computed calls plus one probe per branch on steps 1..5
        calls.update({0: 0, 1: 0})
        rule = FirstBlockCache()
        rule.prepare(forms.RunContext(6, frozenset({0, 5}), den.branches))
        schedule = runtime.free_run(rule, den, start, 0.2, frozenset({0, 5}))
        assert 0 < sum(schedule) < 4
        computed_calls = 2 * (6 - sum(schedule))
        assert calls[1] == computed_calls and calls[0] == computed_calls + 2 * 4  # probes at free steps 1-4
        with pytest.raises(RuntimeError, match="the run is at step 6, not 2"):
            den.step_input(2)
    finally:
        for hook in hooks:
            hook.remove()
        den.close()


# ---------------------------------------------------------------- the three forms, end to end
def test_exact_form_is_the_native_rule_at_the_found_threshold(envs):
    exact = rule_forms.check_exact_is_native("first-block-cache", *envs)
    assert exact.replays > 1


def test_under_accelerate_the_exact_form_replays_the_call_itself(wan21_pipe):
    """The exact form searches on replays of the call before it runs (its noise drawn from the call's generator as
    the pipeline draws it): at K = 0 the output is the stock call's; the global form needs a map there."""
    import morca_env
    from tests.conftest import prompt_embeds

    embeds = prompt_embeds()
    call = dict(prompt_embeds=embeds[0], negative_prompt_embeds=embeds[1], height=32, width=32, num_frames=9,
                num_inference_steps=6, output_type="latent", guidance_scale=5.0)
    stock = wan21_pipe(generator=torch.Generator().manual_seed(0), **call).frames
    policy = schedulers.make("first-block-cache-exact", pipe=wan21_pipe)
    result = morca_env.accelerate(wan21_pipe, policy, budget=0, generator=torch.Generator().manual_seed(0), **call)
    assert torch.equal(result.output.frames, stock) and policy.replays == 0
    result = morca_env.accelerate(wan21_pipe, policy, budget=2, generator=torch.Generator().manual_seed(0), **call)
    assert policy.replays > 0 and result.num_projected == 0 and sum(result.schedule) == 2
    with pytest.raises(ValueError, match="needs a threshold_map"):
        morca_env.accelerate(wan21_pipe, schedulers.make("first-block-cache-global", pipe=wan21_pipe), speedup=1.5,
                             calibration=morca_env.SpeedupCalibration(alpha=6.0, beta=6.0, max_budget=4), **call)
    with pytest.raises(ValueError, match="searches its threshold on replays"):
        schedulers.make("first-block-cache-exact").reset(None, {"num_steps": 6, "forced_steps": [0, 5], "budget": 2})
