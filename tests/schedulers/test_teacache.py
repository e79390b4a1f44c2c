"""TeaCache: hand-computed decisions (plain and retention steps), the signal from the model's own time embedding,
and every form in the env, in a collection recipe, in evaluate.py and under accelerate."""

import numpy as np
import pytest
import torch

from morca_env import schedulers
from morca_env.rollout import rollout
from morca_env.schedulers.rules import forms, teacache
from morca_env.schedulers.rules.teacache import TeaCache
from tests.schedulers import rule_forms

IDENTITY = [0.0, 0.0, 0.0, 1.0, 0.0]  # p(x) = x: increments are the distances themselves


def rule_for(distances, coefficients=IDENTITY, use_ret_steps=False, forced=(), branches=("cond", "uncond")):
    rule = TeaCache(coefficients, use_ret_steps, distances=distances)
    rule.prepare(forms.RunContext(len(distances), frozenset(forced), branches))
    return rule


def test_plain_rule_on_a_hand_written_trace():
    # plain: steps 0 and N-1 forced. delta .7: 1: A .25 reuse; 2: A .5 reuse; 3: A 1.0 -> compute, A = 0;
    # 4: A .125 reuse; 5: last step forced
    rule = rule_for([0.0, 0.25, 0.25, 0.5, 0.125, 0.125])
    assert forms.branch_masks(rule, 0.7) == {"cond": [0, 1, 1, 0, 1, 0], "uncond": [0, 1, 1, 0, 1, 0]}
    # strict: at delta .5 step 2's A = .5 exactly is not < .5 -> compute; then 3: A .5 -> compute; 4: .125 reuse
    assert forms.branch_masks(rule, 0.5)["cond"] == [0, 1, 0, 0, 1, 0]
    # both branches see one signal, so the shared schedule is each branch's
    assert forms.simulate(rule.gates(0.7), 6) == [0, 1, 1, 0, 1, 0]


def test_retention_steps_force_the_first_five_and_not_the_last():
    trace = [0.0, 9.0, 9.0, 9.0, 0.25, 0.25, 0.25, 0.25]
    # retention steps: 0-4 forced (step 4's .25 never accumulates); 5: A .25; 6: A .5; 7: A .75 -> reuse at delta 1
    assert forms.branch_masks(rule_for(trace, use_ret_steps=True), 1.0)["cond"] == [0, 0, 0, 0, 0, 1, 1, 1]
    # plain: 1-3: A 9 -> compute; 4: .25, 5: .5, 6: .75 reuse; 7 (the last) forced
    assert forms.branch_masks(rule_for(trace), 1.0)["cond"] == [0, 0, 0, 0, 1, 1, 1, 0]


def test_native_form_follows_what_the_env_executed():
    """When the mask overrides the rule, the accumulator follows the executed action, as the authors' code
    resets A on every computed step."""
    from morca_env.observation import NUM_SCALARS, Scalar

    def obs(step, used, n=6):
        scalars = np.zeros(NUM_SCALARS, dtype=np.float32)
        scalars[Scalar.t], scalars[Scalar.u_t] = (n - step) / n, used / n
        return {"scalars": scalars, "action_mask": np.array([1, 1], dtype=np.int8)}

    policy = forms.NativeRule(TeaCache(IDENTITY, distances=[0.0] + [0.25] * 5), 0.6, forms.Source())
    info = {"num_steps": 6, "forced_steps": [0, 5]}
    policy.reset(obs(0, 0), info)
    # free run: 1: A .25 reuse; 2: A .5 reuse; 3: A .75 compute; 4: A .25 reuse
    assert [policy(obs(i, used)) for i, used in enumerate([0, 0, 1, 2, 2])] == [0, 1, 1, 0, 1]
    policy.reset(obs(0, 0), info)
    # step 1 wanted reuse but the env computed it (used stays 0): A = 0, so 2: .25, 3: .5 reuse, 4: .75 computes
    assert [policy(obs(i, used)) for i, used in enumerate([0, 0, 0, 1, 2])] == [0, 1, 1, 1, 0]
    assert policy(obs(4, 2)) == 0  # asked again at the same step: the same decision, nothing accumulated twice
    with pytest.raises(RuntimeError, match="expected step 0"):
        policy.reset(obs(0, 0), info)
        policy(obs(2, 0))


def test_the_polynomial_has_its_highest_degree_first():
    c = teacache.COEFFICIENTS["wan21"]
    x = [0.0, 0.05, 0.1, 0.02, 0.1, 0.0]
    by_hand = [c[0] * v**4 + c[1] * v**3 + c[2] * v**2 + c[3] * v + c[4] for v in x]
    assert by_hand[1] == pytest.approx(0.07738, abs=1e-5) and by_hand[2] == pytest.approx(0.24992, abs=1e-5)
    assert by_hand[3] == pytest.approx(0.04234, abs=1e-5)
    rule = rule_for(x, c)
    assert rule.increments[1:5] == pytest.approx(by_hand[1:5])
    # delta .3: 1: A .0774 reuse; 2: A .3273 -> compute; 3: A .0423 reuse; 4: A .2923 reuse; 5: forced
    assert forms.branch_masks(rule, 0.3)["cond"] == [0, 1, 0, 1, 1, 0]
    assert forms.branch_masks(rule, 0.29)["cond"] == [0, 1, 0, 1, 0, 0]  # .2923 >= .29 computes


def test_signal_is_the_models_own_time_embedding(wan21_pipe):
    """Plain: temb of the transformer's condition_embedder; retention steps: its 6-way projection."""
    from morca_env.diffusion import wan_structure

    model = wan21_pipe.transformer
    timesteps = wan_structure.pipeline_timesteps(wan21_pipe, 8)
    text = torch.zeros(1, 1, model.config.text_dim)
    temb, proj = zip(*(model.condition_embedder(t.reshape(1), text)[:2] for t in timesteps))
    for use_ret, signal in ((False, temb), (True, proj)):
        rule = TeaCache(teacache.COEFFICIENTS["wan21"], use_ret)
        rule.prepare(forms.RunContext(8, frozenset({0, 7}), ("cond", "uncond"), timesteps, [model] * 8))
        by_hand = [0.0] + [float((signal[i] - signal[i - 1]).abs().mean() / signal[i - 1].abs().mean())
                           for i in range(1, 8)]
        assert rule.distances == pytest.approx(by_hand, rel=1e-5)
        assert rule.increments == pytest.approx(np.polyval(teacache.COEFFICIENTS["wan21"], by_hand))


def test_bad_constants_and_settings_say_what_is_valid():
    with pytest.raises(ValueError, match="5 finite numbers"):
        TeaCache([1.0, 2.0])
    with pytest.raises(ValueError, match="setting='warp'; valid: slow"):
        schedulers.make("teacache", setting="warp")
    with pytest.raises(ValueError, match="threshold=-1"):
        schedulers.make("teacache", delta=-1)


# ---------------------------------------------------------------- the three forms, end to end
def test_every_form_runs_in_the_env_at_exact_k(envs):
    rule_forms.check_forms_in_env("teacache", *envs)


def test_the_mask_is_fixed_per_setting_and_the_exact_form_is_the_native_rule(envs):
    env, free = envs
    exact = schedulers.make("teacache-exact", env)
    first = rollout(env, exact, {"prompt": "a red circle", "seed": 1, "budget": 7}).schedule
    assert exact.clipped is None
    assert rollout(env, exact, {"prompt": "a blue square", "seed": 9, "budget": 7}).schedule == first
    native = rollout(free, schedulers.make("teacache", env, delta=exact.last_threshold),
                     {"prompt": "a blue square", "seed": 3, "budget": 7})
    assert native.schedule == first
    ret = schedulers.make("teacache-exact", env, use_ret_steps=True)
    schedule = rollout(env, ret, {"prompt": "a red circle", "seed": 1, "budget": 7}).schedule
    assert schedule[:5] == [0] * 5 and sum(schedule) == 7


def test_global_threshold_tracks_the_target(envs):
    rule_forms.check_global_tracks_the_target("teacache", *envs)


def test_forms_run_in_a_collection_recipe_and_evaluate(envs):
    rule_forms.check_recipe_and_evaluate("teacache", *envs)


def test_forms_collect_datasets(tmp_path, monkeypatch):
    rule_forms.check_collection("teacache", tmp_path, monkeypatch)


@pytest.mark.parametrize("kind", ["wan21", "wan22"])
def test_every_form_runs_under_accelerate(kind):
    rule_forms.check_accelerate("teacache", kind)


def test_polynomial_fit_follows_the_authors_procedure(wan21_pipe):
    """fit_coefficients = least squares of the model output's relative L1 (consecutive steps, per branch) on the
    time embedding's, both measured here independently on a stock pipeline call."""
    from morca_env.diffusion import wan_structure
    from morca_env.diffusion.denoiser import DenoiserConfig, StepwiseDenoiser
    from tests.conftest import prompt_embeds

    steps, embeds = 8, prompt_embeds()
    call = dict(height=32, width=32, num_frames=9, num_inference_steps=steps, guidance_scale=5.0)
    model = wan21_pipe.transformer
    outputs = []
    hook = model.register_forward_hook(lambda m, a, out: outputs.append(out[0].float()))
    try:
        wan21_pipe(prompt_embeds=embeds[0], negative_prompt_embeds=embeds[1], output_type="latent",
                   generator=torch.Generator().manual_seed(2), **call)
    finally:
        hook.remove()
    timesteps = wan_structure.pipeline_timesteps(wan21_pipe, steps)
    temb = [model.condition_embedder(t.reshape(1), torch.zeros(1, 1, model.config.text_dim))[0] for t in timesteps]

    def rel(a, b):
        return float((a - b).abs().mean() / b.abs().mean())

    x = [rel(temb[i], temb[i - 1]) for i in range(1, steps)]
    y = [rel(outputs[2 * i + b], outputs[2 * (i - 1) + b]) for b in (0, 1) for i in range(1, steps)]
    denoiser = StepwiseDenoiser(wan21_pipe, DenoiserConfig(**call))
    try:
        fit = teacache.fit_coefficients(denoiser, [{"prompt_embeds": embeds[0], "negative_prompt_embeds": embeds[1],
                                                    "seed": 2}])
    finally:
        denoiser.close()
    expected = np.polyfit(x + x, y, 4)
    assert np.polyval(fit["coefficients"], x) == pytest.approx(np.polyval(expected, x), rel=1e-3, abs=1e-6)
    assert len(fit["coefficients_ret"]) == 5 and fit["input_range"] == pytest.approx([min(x), max(x)], rel=1e-5)
