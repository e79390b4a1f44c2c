"""morca_env.evaluation: what the evaluation script and its Ray actors share."""

import dataclasses

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
    with pytest.raises(ValueError, match=r"method 'bad': '\{\"rule\": \"teacache\"\}' is not a JSON object with a "):
        Methods([("bad", '{"rule": "teacache"}')], env, free)


def _config(tmp_path, **changes):
    from morca_env.evaluation import EvaluationConfig

    kwargs = {"num_inference_steps": 8, "latent_features": False, "reference_cache_dir": str(tmp_path / "refs")}
    return EvaluationConfig(**{"env_id": "MorcaTinyRandom-v0", "env_kwargs": kwargs, "methods": ("uniform",),
                               "targets": (2.0,), "prompts": 1, "videos": 0, "out": tmp_path / "eval",
                               "baselines": ("uniform",), **changes})


def test_a_rerun_with_other_settings_is_refused_not_reported_as_new_rows(tmp_path):
    """Rows are keyed by (method, target, prompt) only, so a rerun into the same out with another env
    or another method under the same label must refuse (naming what changed) or start afresh."""
    import pytest

    from morca_env.evaluation import run_evaluation

    first = run_evaluation(_config(tmp_path, methods=("u={\"name\": \"uniform\"}",)))
    assert [r["method"] for r in first.rows] == ["u"]
    with pytest.raises(ValueError, match=r"method 'u'.*uniform.*random"):
        run_evaluation(_config(tmp_path, methods=("u={\"name\": \"random\"}",)))
    changed = {**_config(tmp_path).env_kwargs, "num_inference_steps": 10}
    with pytest.raises(ValueError, match=r"env_kwargs.*'num_inference_steps': 8.*'num_inference_steps': 10"):
        run_evaluation(_config(tmp_path, methods=("u={\"name\": \"uniform\"}",), env_kwargs=changed))
    again = run_evaluation(_config(tmp_path, methods=("u={\"name\": \"random\"}",)), overwrite=True)
    assert len(again.rows) == 1 and again.rows[0]["psnr"] != first.rows[0]["psnr"]  # recomputed, not the old row
    # adding a method to an identical run continues it
    more = run_evaluation(_config(tmp_path, methods=("u={\"name\": \"random\"}", "uniform")))
    assert sorted(r["method"] for r in more.rows) == ["u", "uniform"]


def test_a_checkpoint_changed_under_its_label_changes_the_fingerprint(tmp_path):
    from morca_env.evaluation.runner import method_fingerprint

    path = tmp_path / "fixed.json"
    path.write_text('{"a": 1}')
    before = method_fingerprint("best-fixed", str(path))
    path.write_text('{"a": 2}')
    assert method_fingerprint("best-fixed", str(path))["files"] != before["files"]
    assert before["spec"] == {"name": "best-fixed", "path": str(path)}


def test_duplicate_labels_and_bad_sizes_are_refused(tmp_path):
    import pytest

    from morca_env.evaluation import EvaluationConfig

    with pytest.raises(ValueError, match=r"label\(s\) \['m'\] given more than once"):
        EvaluationConfig(methods=("m=a.d3", "m=b.d3"))
    with pytest.raises(ValueError, match=r"prompts=0: give an integer >= 1"):
        EvaluationConfig(prompts=0)


def test_a_torn_last_row_is_redone_on_resume(tmp_path):
    """A crash mid-write leaves half a line; the resume drops it with a warning and redoes the row."""
    import pytest

    from morca_env.evaluation import run_evaluation

    config = _config(tmp_path)
    run_evaluation(config)
    log = config.out / "episodes.jsonl"
    text = log.read_text()
    log.write_text(text + text[: len(text) // 2])  # a second row torn in the middle
    with pytest.warns(UserWarning, match="torn last line"):
        result = run_evaluation(_config(tmp_path, targets=(2.0, 2.5)))
    assert [r["target"] for r in result.rows] == [2.0, 2.5]
    assert all(line.startswith("{") and line.endswith("}") for line in log.read_text().splitlines())


def test_feedback_gives_exact_k_methods_one_machine_governor_and_resumes_it(tmp_path):
    """Two exact-K methods that play the same schedule must run the same K at every prompt (one request per prompt
    from the machine's governor, fed by both); a threshold rule keeps its own governor. The request after a resume
    is the one the finished rows imply."""
    import pytest

    from morca_env.evaluation import run_evaluation
    from morca_env.speedup.governor import SpeedupGovernor

    methods = ("uniform", 'twin={"name": "uniform"}', "seacache-global")
    env_kwargs = {"num_inference_steps": 10, "latent_features": False, "reference_cache_dir": str(tmp_path / "refs")}
    config = dict(methods=methods, feedback=True, matched=False, targets=(1.5,), env_kwargs=env_kwargs)
    run_evaluation(_config(tmp_path, prompts=2, **config))
    rows = run_evaluation(_config(tmp_path, prompts=3, **config)).rows  # resumes at the third prompt
    by = {(r["method"], r["prompt_index"]): r for r in rows}
    for index in range(3):
        uniform, twin = by["uniform", index], by["twin", index]
        assert uniform["requested_speedup"] == twin["requested_speedup"]
        assert uniform["schedule"] == twin["schedule"]
    assert by["uniform", 0]["requested_speedup"] == by["seacache-global", 0]["requested_speedup"] == 1.5
    lo, hi = gym.make("MorcaTinyRandom-v0", budget=0, num_inference_steps=10).unwrapped.calibration.speedup_range
    machine, rule = SpeedupGovernor(1.5, (lo, hi)), SpeedupGovernor(1.5, (lo, hi))
    for r in rows:
        if r["prompt_index"] < 2:
            (rule if r["method"] == "seacache-global" else machine).record(r["requested_speedup"],
                                                                           r["stock_latency_s"], r["latency_s"])
    assert by["uniform", 2]["requested_speedup"] == pytest.approx(machine.request())
    assert by["seacache-global", 2]["requested_speedup"] == pytest.approx(rule.request())


def test_on_a_measured_calibration_every_exact_k_method_pays_its_own_step_time(tmp_path):
    """A static schedule's per-step time counts in its K as a learned scheduler's does (else a learned scheduler
    that plays it runs a higher K at the same target); a rule on its own K pays it through its realised speedup."""
    import pytest

    from morca_env.evaluation import run_evaluation
    from morca_env.speedup.measure import measure_calibration

    config = _config(tmp_path, methods=("uniform", "seacache-global"), calibrate=1, matched=False)
    # The reachable range is this machine's now (a busy CI runner reached only 1.42x): measure it as the run would,
    # aim inside it, and let the run reload it.
    env = gym.make(config.env_id, **config.env_kwargs)
    calibration = measure_calibration(env.unwrapped, repeats=1, threads=1, progress=False).calibration
    config.out.mkdir(parents=True)
    calibration.to_json(config.out / "calibration.json")
    lo, hi = calibration.speedup_range
    if hi < 1.1:  # the step cost (~4% of a stock run) would leave no target between the two
        pytest.skip(f"this machine reaches only [{lo:.2f}, {hi:.2f}] now: too busy to place a target")
    rows = run_evaluation(dataclasses.replace(config, targets=(round(lo + 0.4 * (hi - lo), 3),))).rows
    cost = {r["method"]: r["scheduler_cost_s"] for r in rows}
    assert cost["uniform"] > 0 and cost["seacache-global"] == 0
    ideal = run_evaluation(_config(tmp_path / "ideal", methods=("uniform",), matched=False)).rows  # nothing maps s to K
    assert ideal[0]["scheduler_cost_s"] == 0


def test_a_schedulers_step_cost_is_its_fastest_timed_episode_after_a_warm_up(monkeypatch):
    """One episode's reading of a ~15 us step varies by ~2 us, enough to move a prompt's K at equal measured
    speedup: the charge is the fastest of `repeats` timed episodes (a warm-up episode is never timed)."""
    from types import SimpleNamespace

    import pytest

    from morca_env.evaluation import episodes

    env = SimpleNamespace(unwrapped=SimpleNamespace(num_steps=10))

    def policy_seconds(readings):  # the policy seconds of successive episodes: the warm-up's first
        readings = iter(readings)
        monkeypatch.setattr(episodes, "run_episode", lambda env, policy, options: ({}, next(readings), 0.0))

    policy_seconds([0.004, 0.001, 0.003, 0.002])
    assert episodes.scheduler_step_cost(None, env, "a cat", 0, repeats=2) == pytest.approx(0.0001)
    policy_seconds([0.001, 0.003, 0.002])
    assert episodes.scheduler_step_cost(None, env, "a cat", 0, repeats=1) == pytest.approx(0.0003)  # not the warm-up
    policy_seconds([0.004, 0.003, 0.002, 0.005])
    assert episodes.scheduler_step_cost(None, env, "a cat", 0, repeats=3) == pytest.approx(0.0002)
    with pytest.raises(ValueError, match="repeats=0"):
        episodes.scheduler_step_cost(None, env, "a cat", 0, repeats=0)
