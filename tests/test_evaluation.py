"""morca_env.evaluation: what the evaluation script and its Ray actors share."""

import gymnasium as gym

import morca_env  # noqa: F401
from morca_env.evaluation import Methods


def test_randomised_methods_draw_per_episode_not_per_run_order(tmp_path):
    """A resumed run or Ray actors run episodes in another order: a random method's schedules must not change."""
    env = gym.make("MorcaTinyRandom-v0", budget=0, num_inference_steps=10, lpips=False,
                   reference_cache_dir=str(tmp_path))
    free = gym.make("MorcaTinyRandom-v0", budget=0, enforce_budget=False, num_inference_steps=10, lpips=False,
                    pipeline=env.unwrapped.pipe, reference_cache_dir=str(tmp_path))
    spec = env.unwrapped.budget_spec
    episodes = [(2.0, 0), (2.0, 1), (3.0, 0), (3.0, 1)]

    def schedules(order):
        methods = Methods([("random", None), ("uniform", None)], env, free)
        plans = {}
        for target, index in order:
            policy, runs_in = methods.for_episode("random", target, index)
            assert runs_in is env  # exact budget
            plans[target, index] = policy.plan(spec, 4)
        assert methods.for_episode("uniform", 2.0, 0)[0] is methods["uniform"][0]  # deterministic rules: one object
        return plans

    forward, backward = schedules(episodes), schedules(list(reversed(episodes)))
    assert forward == backward
    assert len({tuple(s) for s in forward.values()}) > 1  # yet each episode gets its own draw


def test_a_method_can_be_a_registry_scheduler_with_options_under_its_own_label(tmp_path):
    """`label={"name": ..., options}`: ACID over TeaCache and over DiCache side by side; randomised ones still draw
    per episode; a spec without a scheduler name is refused with what was given."""
    import pytest

    env = gym.make("MorcaTinyRandom-v0", budget=0, num_inference_steps=10, lpips=False,
                   reference_cache_dir=str(tmp_path))
    free = gym.make("MorcaTinyRandom-v0", budget=0, enforce_budget=False, num_inference_steps=10, lpips=False,
                    pipeline=env.unwrapped.pipe, reference_cache_dir=str(tmp_path))
    methods = Methods([("acid-tea", '{"name": "acid-exact", "rule": "teacache"}'), ("acid", None),
                       ("rnd", '{"name": "random"}')], env, free)
    assert methods["acid-tea"][0].rule.inner.name == "teacache" and methods["acid"][0].rule.inner.name == "dicache"
    assert methods["acid-tea"][1] is env
    spec = env.unwrapped.budget_spec
    first, second = (methods.for_episode("rnd", 2.0, i)[0].plan(spec, 4) for i in (0, 1))
    assert first != second and methods.for_episode("rnd", 2.0, 0)[0].plan(spec, 4) == first
    with pytest.raises(SystemExit, match=r"method 'bad': '\{\"rule\": \"teacache\"\}' is not a JSON object with a "):
        Methods([("bad", '{"rule": "teacache"}')], env, free)
