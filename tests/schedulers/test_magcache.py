"""MagCache: hand-computed gate decisions, the authors' published step counts, parity with diffusers' hook,
and every form in the env, in a collection recipe, in evaluate.py and under accelerate."""

import warnings

import numpy as np
import pytest
import torch

import morca_env
from morca_env import schedulers
from morca_env.schedulers.rules import forms, magcache
from morca_env.schedulers.rules.magcache import MagCache
from morca_env.rollout import rollout
from tests.schedulers import rule_forms


def interleave(cond, uncond):
    return [v for pair in zip(cond, uncond) for v in pair]


def rule_for(cond, uncond, max_skip=2, retention=0.0, convention="official", forced=(), branches=("cond", "uncond")):
    rule = MagCache(interleave(cond, uncond), max_skip, retention, convention)
    rule.prepare(forms.RunContext(len(cond), frozenset(forced), branches))
    return rule


def test_gate_follows_the_official_rule_on_a_hand_written_trace():
    # cond, by hand (delta 0.3, K_max 2, step 0 retained):
    # 1: rho .9, E .1, k 1 -> reuse; 2: rho .81, E .29, k 2 -> reuse; 3: rho .729, E .561 -> compute, reset;
    # 4: rho 1, E 0, k 1 -> reuse; 5: rho .5, E .5 -> compute
    cond = [1.0, 0.9, 0.9, 0.9, 1.0, 0.5]
    rule = rule_for(cond, cond, retention=1 / 6)  # int(2 * 6 / 6) = 2 calls: step 0 of both branches
    assert forms.branch_masks(rule, 0.3) == {"cond": [0, 1, 1, 0, 1, 0], "uncond": [0, 1, 1, 0, 1, 0]}
    # K_max: ratios of 1 never add error, so only k <= K_max = 2 ends a run of reuses (k = 3 computes)
    flat = rule_for([1.0] * 6, [1.0] * 6)  # no retention: the gate alone would reuse step 0 too
    assert forms.branch_masks(flat, 0.3)["cond"] == [1, 1, 0, 1, 1, 0]
    assert forms.simulate(flat.gates(0.3), 6, frozenset({0})) == [0, 1, 1, 0, 1, 1]  # the env forces step 0


def test_strict_skip_test_and_the_diffusers_convention_differ_only_at_equality():
    cond = [1.0, 0.5, 1.0, 1.0]  # step 1: rho .5, E = .5 exactly (dyadic, exact in float32 and float64)
    official = rule_for(cond, cond, retention=0.25)  # int(2 * 4 * .25) = 2 calls: step 0
    diffusers = rule_for(cond, cond, retention=0.25, convention="diffusers")  # int(.25 * 4 + .5) = 1 step
    assert forms.branch_masks(official, 0.5)["cond"] == [0, 0, 1, 1]  # E < delta is false at E == delta
    assert forms.branch_masks(diffusers, 0.5)["cond"] == [0, 1, 0, 1]  # E <= delta reuses; then E = 1.0 > .5
    assert forms.branch_masks(official, 0.5000001)["cond"] == forms.branch_masks(diffusers, 0.5000001)["cond"]


def test_retention_counts_calls_and_branches_keep_their_own_accumulators():
    # N = 5, R = .3: int(2 * 5 * .3) = 3 calls retained: cond steps 0, 1 (calls 0, 2), uncond step 0 (call 1)
    rule = rule_for([1.0] * 5, [1.0] * 5, max_skip=5, retention=0.3)
    assert forms.branch_masks(rule, 0.1) == {"cond": [0, 0, 1, 1, 1], "uncond": [0, 1, 1, 1, 1]}
    # diffusers retains int(.3 * 5 + .5) = 2 steps of every branch
    assert forms.branch_masks(rule_for([1.0] * 5, [1.0] * 5, 5, 0.3, "diffusers"), 0.1)["uncond"] == [0, 0, 1, 1, 1]
    # different ratios per branch: uncond's error grows, cond's does not
    both = rule_for([1.0] * 5, [1.0, 0.8, 0.8, 1.0, 1.0], max_skip=5, retention=0.1)  # 1 call: cond step 0
    assert forms.branch_masks(both, 0.3) == {"cond": [0, 1, 1, 1, 1], "uncond": [1, 1, 0, 1, 1]}
    # uncond step 0: no retention and rho = 1 -> its gate would reuse; 1: E .2; 2: rho .64, E .56 -> compute
    # the shared decision: a step reuses only if every branch wants to, and a computed step resets both
    assert forms.simulate(both.gates(0.3), 5, frozenset({0})) == [0, 1, 0, 1, 1]


def test_env_forced_steps_compute_and_reset_the_gates():
    rule = rule_for([1.0, 0.9, 0.9, 0.9, 0.9], [1.0, 0.9, 0.9, 0.9, 0.9], max_skip=9, retention=0.1)
    assert forms.branch_masks(rule, 0.5)["cond"] == [0, 1, 1, 0, 1]  # E: .1, .29 | .561 -> compute | .1
    # a forced compute at step 2 resets: 3: E .1 -> reuse; 4: E .29 -> reuse
    assert forms.simulate(rule.gates(0.5), 5, frozenset({0, 2})) == [0, 1, 0, 1, 1]


def test_a_reuse_the_budget_forces_during_retention_advances_the_accumulators():
    # an exact budget's mask may reuse a retained step; the gate then accumulates as on any reuse
    gate = rule_for([1.0, 0.9, 0.9, 0.9], [1.0, 0.9, 0.9, 0.9], max_skip=9, retention=0.5).gates(0.5)[0]
    assert gate.wants_reuse(0) is False
    gate.commit(True)  # forced reuse at step 0 (ratio 1: rho 1, E 0, k 1)
    assert gate.wants_reuse(1) is False  # step 1 still retained (4 calls of cond + uncond)
    gate.commit(True)  # forced again: rho .9, E .1, k 2
    assert (gate.rho, round(gate.err, 9), gate.k) == (0.9, 0.1, 2)
    assert gate.wants_reuse(2) is True  # rho .81, E .29 < .5
    gate.commit(False)
    assert (gate.rho, gate.err, gate.k) == (1.0, 0.0, 0)


def test_shipped_wan21_ratios_give_the_published_computed_steps():
    """Facts file: slow / fast (E012K2R02 / E012K4R02) compute 25 / 21 steps with the raw shipped ratios, 24 / 19
    with the square-rooted ones of the paper's Table 1; at MORCA's 3.0x setting cond and uncond differ."""
    raw = np.array(magcache.WAN21_T2V_13B_RATIOS)
    assert len(raw) == 100 and raw[:2].tolist() == [1.0, 1.0]
    for setting, computed_raw, computed_sqrt in (("slow", 25, 24), ("fast", 21, 19)):
        delta, k_max, r = magcache.SETTINGS[setting]
        for ratios, computed in ((raw, computed_raw), (np.sqrt(raw), computed_sqrt)):
            rule = MagCache(ratios, k_max, r)
            rule.prepare(forms.RunContext(50, frozenset(), ("cond", "uncond")))
            masks = forms.branch_masks(rule, delta)
            assert [50 - sum(m) for m in masks.values()] == [computed, computed], setting
    delta, k_max, r = magcache.SETTINGS["morca-3.0x"]
    rule = MagCache(raw, k_max, r)
    rule.prepare(forms.RunContext(50, frozenset(), ("cond", "uncond")))
    masks = forms.branch_masks(rule, delta)
    assert masks["cond"] != masks["uncond"]
    assert sum(forms.simulate(rule.gates(delta), 50)) <= min(sum(m) for m in masks.values())  # shared: no more


def test_ratios_are_resampled_per_branch_by_nearest_index():
    cond, uncond = magcache.branch_ratios([1, 10, 2, 20, 3, 30, 4, 40, 5, 50], 3)
    assert cond.tolist() == [1, 3, 5] and uncond.tolist() == [10, 30, 50]
    with pytest.raises(ValueError, match="even length"):
        MagCache([1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="max_skip"):
        MagCache(max_skip=-1)
    with pytest.raises(ValueError, match="setting='turbo'; valid: slow, fast"):
        schedulers.make("magcache", setting="turbo")


def _diffusers_decisions(pipe, ratios, threshold, max_skip, retention, steps):
    """Which transformer calls diffusers' MagCache hook computed, per branch (block 0's attention ran)."""
    from diffusers import MagCacheConfig

    from tests.conftest import prompt_embeds

    calls = []
    hooks = [pipe.transformer.register_forward_pre_hook(lambda *_: calls.append(0)),
             pipe.transformer.blocks[0].attn1.register_forward_pre_hook(lambda *_: calls.__setitem__(-1, 1))]
    pipe.transformer.enable_cache(MagCacheConfig(threshold=threshold, max_skip_steps=max_skip,
                                                 retention_ratio=retention, num_inference_steps=steps,
                                                 mag_ratios=torch.tensor(ratios)))
    try:
        embeds = prompt_embeds()
        pipe(prompt_embeds=embeds[0], negative_prompt_embeds=embeds[1], height=32, width=32, num_frames=9,
             num_inference_steps=steps, guidance_scale=5.0, output_type="latent",
             generator=torch.Generator().manual_seed(0))
    finally:
        pipe.transformer.disable_cache()
        for hook in hooks:
            hook.remove()
    assert len(calls) == 2 * steps
    return {"cond": [1 - c for c in calls[0::2]], "uncond": [1 - c for c in calls[1::2]]}


def test_decisions_equal_diffusers_magcache_hook_on_a_tiny_wan(wan21_pipe):
    """Same ratios (one list for both branches, as diffusers takes them): diffusers' per-branch decisions equal
    our gates under its convention everywhere, and the official convention's except at E == delta."""
    steps = 10
    ratios = [1.0, 0.5, 1.0, 0.75, 0.75, 1.0, 1.0, 0.5, 1.25, 1.0]  # dyadic: exact in float32 and float64
    for threshold, max_skip in ((0.5, 2), (0.3, 3), (1.0, 4)):
        theirs = _diffusers_decisions(wan21_pipe, ratios, threshold, max_skip, 0.1, steps)
        ours = rule_for(ratios, ratios, max_skip, 0.1, "diffusers")
        assert forms.branch_masks(ours, threshold) == theirs, (threshold, max_skip)
        assert sum(theirs["cond"]) > 0
    # at threshold .5 the error hits .5 exactly at step 1: diffusers (<=) reuses, the authors' (<) computes
    official = forms.branch_masks(rule_for(ratios, ratios, 2, 0.1), 0.5)["cond"]
    theirs = _diffusers_decisions(wan21_pipe, ratios, 0.5, 2, 0.1, steps)["cond"]
    assert theirs[1] == 1 and official[1] == 0


# ---------------------------------------------------------------- the three forms, end to end
def test_every_form_runs_in_the_env_at_exact_k(envs):
    rule_forms.check_forms_in_env("magcache", *envs)


def test_exact_form_is_the_native_rule_at_the_found_threshold(envs):
    env, free = envs
    exact = schedulers.make("magcache-exact", env)
    rollout(env, exact, {"prompt": "a red circle", "seed": 1, "budget": 9})
    assert exact.clipped is None and exact.last_threshold > 0
    native = rollout(free, schedulers.make("magcache", env, delta=exact.last_threshold, setting="morca-3.0x"),
                     {"prompt": "a red circle", "seed": 1, "budget": 9})
    assert native.num_reuse == 9 and native.schedule == exact.schedule


def test_exact_budget_reports_clipping(envs):
    env, _ = envs
    policy = schedulers.make("magcache-exact", env, max_skip=1)  # at most every other step after retention
    with pytest.warns(UserWarning, match="no threshold gives exactly K=14"):
        trajectory = rollout(env, policy, {"prompt": "a red circle", "seed": 1, "budget": 14})
    reached, wanted = policy.clipped
    assert wanted == 14 and reached < 14 and trajectory.num_reuse == 14  # the mask made up the difference


def test_global_threshold_tracks_the_target(envs):
    rule_forms.check_global_tracks_the_target("magcache", *envs)


def test_forms_run_in_a_collection_recipe_and_evaluate(envs):
    rule_forms.check_recipe_and_evaluate("magcache", *envs)


def test_forms_collect_datasets(tmp_path, monkeypatch):
    rule_forms.check_collection("magcache", tmp_path, monkeypatch)


@pytest.mark.parametrize("kind", ["wan21", "wan22"])
def test_every_form_runs_under_accelerate(kind):
    rule_forms.check_accelerate("magcache", kind)


def test_ratio_fit_equals_diffusers_calibration_mode(wan21_pipe, capsys):
    """The authors' calibration, as fit_ratios runs it on our residual cache, gives diffusers'
    `MagCacheConfig(calibrate=True)` ratios for the same tiny Wan call (per branch, first step 1.0)."""
    import ast

    from diffusers import MagCacheConfig

    from morca_env.diffusion.denoiser import DenoiserConfig, StepwiseDenoiser
    from tests.conftest import prompt_embeds

    steps, embeds = 6, prompt_embeds()
    call = dict(height=32, width=32, num_frames=9, num_inference_steps=steps, guidance_scale=5.0)
    wan21_pipe.transformer.enable_cache(MagCacheConfig(calibrate=True, num_inference_steps=steps))
    try:
        wan21_pipe(prompt_embeds=embeds[0], negative_prompt_embeds=embeds[1], output_type="latent",
                   generator=torch.Generator().manual_seed(3), **call)
    finally:
        wan21_pipe.transformer.disable_cache()
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    theirs = [ast.literal_eval(line) for line in printed if not line.startswith("[MagCache]")]
    assert len(theirs) == 2  # one list per branch: cond, then uncond
    denoiser = StepwiseDenoiser(wan21_pipe, DenoiserConfig(**call))
    try:
        ours = magcache.fit_ratios(denoiser, [{"prompt_embeds": embeds[0], "negative_prompt_embeds": embeds[1],
                                               "seed": 3}])
    finally:
        denoiser.close()
    assert len(ours) == 2 * steps and ours[:2] == [1.0, 1.0]
    assert ours[0::2] == pytest.approx(theirs[0], rel=1e-4) and ours[1::2] == pytest.approx(theirs[1], rel=1e-4)
    assert max(abs(r - 1) for r in ours) > 1e-3  # the ratios are not trivially 1
