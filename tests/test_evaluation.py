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
