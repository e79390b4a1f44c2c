"""Schedule search, the fixed-schedule policies it feeds, and the one rollout they play through."""

import json

import gymnasium as gym
import numpy as np
import pytest

import morca_env  # noqa: F401
from morca_env.budget import BudgetSpec, forced_recompute_steps
from morca_env.schedulers.fixed import FixedSchedule, SearchedSchedules, StaticSchedule, UniformInterval
from morca_env.rollout import rollout
from morca_env.schedulers.schedule import propose, schedule_key
from morca_env.evaluation.search import (
    EvaluationLog, SearchConfig, SearchTask, hill_climb, play_schedule, search_many, search_schedule, transfer_matrix)


@pytest.fixture
def env(tmp_path):
    # r_max 200: on the random tiny model PSNRs are 40-60 dB, above the default cap of 50
    return gym.make("MorcaTinyRandom-v0", budget=8, num_inference_steps=20, lpips=False, latent_features=False, r_max=200,
                    reference_cache_dir=str(tmp_path / "refs"))


def target_objective(target):
    """A synthetic landscape whose unique optimum is `target` (minus the Hamming distance to it)."""
    calls = []

    def value(schedule):
        calls.append(list(schedule))
        return -float(np.sum(np.abs(np.asarray(schedule) - np.asarray(target))))

    return value, calls


def test_proposals_keep_k_and_never_touch_forced_steps():
    spec = BudgetSpec(20, forced_recompute_steps(20, 9))
    rng = np.random.default_rng(0)
    start = UniformInterval().plan(spec, 7)
    made = 0
    for _ in range(300):
        cand = propose(start, spec, rng, SearchConfig())
        if cand is None:
            continue
        made += 1
        assert sum(cand) == 7 and cand[0] == cand[9] == cand[19] == 0
        assert sum(a != b for a, b in zip(cand, start)) == 2  # one swap
    assert made > 100
    assert propose([0] * 20, spec, rng, SearchConfig()) is None  # K = 0: no neighbour


def test_hill_climb_finds_a_planted_optimum_and_never_gets_worse():
    spec = BudgetSpec(16, forced_recompute_steps(16))
    target = [0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 0, 1, 0, 0]  # far from uniform spacing
    value, calls = target_objective(target)
    result = hill_climb(value, spec, sum(target), SearchConfig(evaluations=150, seed=1))
    assert result.schedule == target
    assert result.value == 0.0 and result.start_value < 0
    assert all(b >= a for a, b in zip(result.history, result.history[1:]))  # the best only improves
    assert len({schedule_key(c) for c in calls}) == len(calls) == result.evaluations  # no schedule twice


def test_evaluation_budget_is_respected():
    spec = BudgetSpec(30, forced_recompute_steps(30))
    value, calls = target_objective([0] + [1, 0] * 14 + [0])
    result = hill_climb(value, spec, 14, SearchConfig(evaluations=17))
    assert result.evaluations == len(calls) == 17


def test_play_schedule_equals_a_rollout_of_the_same_schedule(env):
    spec = env.unwrapped.budget_spec
    schedule = UniformInterval().plan(spec, 6)
    direct = rollout(env, UniformInterval(), {"prompt": "a red circle", "seed": 3, "budget": 6})
    played = play_schedule(env, schedule, "a red circle", 3)
    assert played.schedule == direct.schedule == schedule
    assert played.reward == pytest.approx(direct.reward, abs=1e-6)
    with pytest.raises(ValueError, match="forced steps"):
        play_schedule(env, [1] + [0] * 19, "a red circle", 3)


def test_search_beats_uniform_resumes_from_its_log_and_logs_every_episode(env, tmp_path):
    log = tmp_path / "search.jsonl"
    pairs = [("a red circle", 3)]
    config = SearchConfig(evaluations=12, seed=0)
    first = search_schedule(env, pairs, 6, config, log)
    assert first.value > first.start_value and sum(first.schedule) == 6  # 12 tries improve on uniform here
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(rows) == 12 and {r["schedule"] for r in rows} >= {schedule_key(first.schedule)}
    best_row = max(rows, key=lambda r: r["reward"])
    assert best_row["reward"] == pytest.approx(first.value)
    # a torn last line (a crash mid-write) is ignored; the rerun replays the log and plays nothing new
    with open(log, "a") as f:
        f.write('{"prompt": "a red')
    calls = []
    original = env.unwrapped.step
    env.unwrapped.step = lambda a: (calls.append(a), original(a))[1]
    again = search_schedule(env, pairs, 6, config, log)
    env.unwrapped.step = original
    assert again.schedule == first.schedule and again.history == first.history
    assert calls == []


def test_multi_prompt_objective_is_the_mean(env, tmp_path):
    pairs = [("a red circle", 1), ("a blue square", 2)]
    result = search_schedule(env, pairs, 5, SearchConfig(evaluations=3), tmp_path / "m.jsonl")
    log = EvaluationLog(tmp_path / "m.jsonl")
    key = schedule_key(result.schedule)
    assert result.value == pytest.approx(np.mean([log.get(p, s, key) for p, s in pairs]))


def test_search_many_writes_results_and_skips_finished_tasks(tmp_path):
    kwargs = {"budget": 8, "num_inference_steps": 20, "r_max": 200, "reference_cache_dir": str(tmp_path / "refs")}
    tasks = [SearchTask("a", (("a red circle", 1),), 5), SearchTask("b", (("a blue square", 2),), 7)]
    out = tmp_path / "out"
    results = search_many(tasks, "MorcaTinyRandom-v0", kwargs, out, SearchConfig(evaluations=3), progress=False)
    assert [r["budget"] for r in results] == [5, 7] and all(len(r["schedule"]) == 20 for r in results)
    (out / "a.jsonl").unlink()  # finished tasks are read back, not searched again
    assert search_many(tasks, "MorcaTinyRandom-v0", kwargs, out, SearchConfig(evaluations=3),
                       progress=False) == results
    with pytest.raises(ValueError, match="unique"):
        search_many(tasks + tasks[:1], "MorcaTinyRandom-v0", kwargs, out, progress=False)
    policy = SearchedSchedules(out)
    env = gym.make("MorcaTinyRandom-v0", lpips=False, **kwargs)
    played = rollout(env, policy, {"prompt": "a blue square", "seed": 2, "budget": 7})
    assert played.schedule == results[1]["schedule"]
    with pytest.raises(KeyError, match="no searched schedule"):
        rollout(env, policy, {"prompt": "a blue square", "seed": 2, "budget": 6})


def test_fixed_schedule_refuses_a_schedule_of_another_budget(env):
    schedule = UniformInterval().plan(env.unwrapped.budget_spec, 4)
    with pytest.raises(ValueError, match="K=5"):
        rollout(env, FixedSchedule(schedule), {"prompt": "x", "seed": 0, "budget": 5})
    with pytest.raises(ValueError, match="only 0"):
        FixedSchedule([0, 2, 0])


def test_static_schedule_serves_every_k_from_its_fitted_ones():
    spec = BudgetSpec(20, forced_recompute_steps(20))
    fitted = {6: [0, 1, 1, 1, 1, 1, 1] + [0] * 13}  # all reuses early: not what uniform would do
    policy = StaticSchedule(fitted, source="test")
    assert policy.plan(spec, 6) == fitted[6]
    for k in (0, 3, 7, 12, 18):
        schedule = policy.plan(spec, k)
        assert sum(schedule) == k and schedule[0] == schedule[19] == 0
    # near the fitted K the fitted shape survives: one reuse added after the early run, none moved
    seven = policy.plan(spec, 7)
    assert seven[:7] == fitted[6][:7]
    with pytest.raises(ValueError, match="reuses"):
        StaticSchedule({5: [0, 1, 0]})


def test_packaged_best_fixed_schedule_loads_for_morca_tiny():
    policy = morca_env.schedulers.make("best-fixed", gym.make("MorcaTiny-v0", lpips=False, latent_features=False))
    assert policy.schedules and all(sum(v) == k for k, v in policy.schedules.items())


def test_schedule_player_gives_the_env_reward_whatever_prefix_it_resumes_from(env):
    """The fast player resumes from the best schedule's snapshots; every reward must still be the episode's."""
    from morca_env.evaluation.search import SchedulePlayer

    spec = env.unwrapped.budget_spec
    player = SchedulePlayer(env, "a red circle", 3)
    rng = np.random.default_rng(0)
    schedule = UniformInterval().plan(spec, 7)
    seen = set()
    for _ in range(8):
        reward, _ = player.play(schedule)
        assert reward == pytest.approx(play_schedule(env, schedule, "a red circle", 3).reward, abs=1e-4)
        seen.add(reward)
        schedule = propose(schedule, spec, rng, SearchConfig()) or schedule
    assert len(seen) > 3  # the schedules differed, and so did their rewards
    # resuming right before a reuse needs the residuals of the shared prefix restored too
    anchor = UniformInterval().plan(spec, 7)
    first = anchor.index(1)
    earlier = list(anchor)
    earlier[first], earlier[first - 1] = 0, 1
    player = SchedulePlayer(env, "a blue square", 4)
    player.play(anchor)
    assert player.play(earlier)[0] == pytest.approx(play_schedule(env, earlier, "a blue square", 4).reward, abs=1e-4)
    player.close()


def test_searched_episodes_keep_the_best_and_refuse_held_out_prompts(tmp_path):
    from morca_env.evaluation.search import searched_episodes

    log = EvaluationLog(tmp_path / "a.jsonl")
    for i in range(10):
        log.add("a red circle", 1, f"{i:020b}", reward=float(i), psnr=float(i))
    log.add("a blue square", 2, "0" * 20, reward=3.0, psnr=3.0)
    everything = searched_episodes([tmp_path])
    assert len(everything) == 11 and all(len(e["schedule"]) == 20 for e in everything)
    kept = searched_episodes([tmp_path], per_search=4, seed=0)
    red = sorted(e["reward"] for e in kept if e["prompt"] == "a red circle")
    assert len(red) == 4 and red[-2:] == [8.0, 9.0]  # the best half, then two of the rest
    with pytest.raises(ValueError, match="held-out prompt 'a blue square'"):
        searched_episodes([tmp_path], exclude=["a blue square"])


def test_validation_keeps_the_fitted_schedule_only_where_it_beats_uniform(env, tmp_path):
    """A schedule that loses to uniform spacing on the validation pairs is replaced by uniform spacing at its K;
    one that wins is kept; both scores are reported and the episodes logged (a rerun replays none)."""
    from morca_env.evaluation.search import validated_schedule

    spec = env.unwrapped.budget_spec
    pairs = [("a red circle", 3)]
    uniform = UniformInterval().plan(spec, 8)
    crowded = [0] + [1] * 8 + [0] * 11  # every reuse at the start, where the latent changes fastest
    kept, scores = validated_schedule(env, crowded, pairs, tmp_path / "log.jsonl")
    assert kept == uniform and scores["kept"] == "uniform"
    assert scores["validation_psnr"] < scores["uniform_validation_psnr"]
    better = search_schedule(env, pairs, 8, SearchConfig(evaluations=12, seed=0)).schedule
    kept, scores = validated_schedule(env, better, pairs, tmp_path / "log.jsonl")
    assert kept == better != uniform and scores["kept"] == "fitted"
    assert scores["validation_psnr"] > scores["uniform_validation_psnr"]
    logged = len((tmp_path / "log.jsonl").read_text().splitlines())
    validated_schedule(env, better, pairs, tmp_path / "log.jsonl")
    assert len((tmp_path / "log.jsonl").read_text().splitlines()) == logged == 3
    # a schedule the file served before is kept where it scores higher, under its name, with every score
    kept, scores = validated_schedule(env, crowded, pairs, tmp_path / "log.jsonl", {"moved from K=9": better})
    assert kept == better and scores["kept"] == "moved from K=9"
    assert scores["moved from K=9_validation_psnr"] > scores["uniform_validation_psnr"] > scores["validation_psnr"]
    with pytest.raises(ValueError, match="alternative 'short' must be a new name and a schedule of 20 steps with K=8"):
        validated_schedule(env, better, pairs, alternatives={"short": better[:-1]})


def test_transfer_matrix_plays_every_schedule_on_every_pair_and_refuses_mixed_k(env, tmp_path):
    spec = env.unwrapped.budget_spec
    uniform = UniformInterval().plan(spec, 6)
    other = list(uniform)
    first, last = uniform.index(1), max(i for i in range(1, 19) if uniform[i] == 0)
    other[first], other[last] = 0, 1  # the same K, another schedule
    pairs = [("a red circle", 3), ("a blue square", 5)]
    rewards = transfer_matrix(env, {"uniform": uniform, "other": other}, pairs, tmp_path / "log.jsonl", progress=False)
    for name, schedule in (("uniform", uniform), ("other", other)):
        assert rewards[name] == pytest.approx([play_schedule(env, schedule, *pair).reward for pair in pairs], abs=1e-4)
    assert rewards["uniform"] != rewards["other"]
    with pytest.raises(ValueError, match="one K"):
        transfer_matrix(env, {"uniform": uniform, "fewer": UniformInterval().plan(spec, 5)}, pairs, progress=False)
