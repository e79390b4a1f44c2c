"""The anchored recipe: the baseline from any state, grouped behaviour data, the residual state and return, the
critic-gated switch and its margin chosen on validation episodes."""

import json
import math
import re

import d3rlpy
import gymnasium as gym
import numpy as np
import pytest
import torch
from d3rlpy.dataset import Episode

import agents  # noqa: F401
import morca_env  # noqa: F401
from agents import anchored
from agents.anchored import AnchoredPolicy, anchored_arrays, anchored_episodes, choose_margin, group_relative
from agents.iql import DiscreteIQLConfig
from agents.networks import MorcaEncoderFactory
from morca_env.budget import BudgetSpec
from morca_env.rollout import rollout
from morca_env.schedulers.anchored import BaselineDeviations, BaselinePlan, FollowBaseline, baseline_actions
from morca_env.schedulers.base import feasible
from morca_env.schedulers.fixed import StaticSchedule

N = 8
SPEC = BudgetSpec(N, frozenset({0, N - 1}))
# a baseline for 8-step episodes: K = 2 and K = 4 fitted, the others moved from the nearest
BASELINE = StaticSchedule({2: [0, 0, 1, 0, 0, 1, 0, 0], 4: [0, 1, 0, 1, 1, 0, 1, 0]}, "test")


def tiny_env(tmp_path, **kwargs):
    return gym.make("MorcaTinyRandom-v0", num_inference_steps=N, lpips=False, latent_features=False,
                    reference_cache_dir=str(tmp_path / "refs"), **kwargs)


def scalar_algo(seed=0):
    """An untrained scalar-state IQL built on the anchored state (7 + 1 scalars)."""
    d3rlpy.seed(seed)
    factory = MorcaEncoderFactory(features="")
    algo = DiscreteIQLConfig(batch_size=4, actor_encoder_factory=factory, critic_encoder_factory=factory,
                             value_encoder_factory=factory).create(device="cpu")
    algo.create_impl([(9, 4, 8, 8), (18, 8, 8), (8,), (2,)], 2)
    return algo


# ----------------------------------------------------------------- the baseline from any state
def test_a_plan_without_departures_is_the_baseline_and_a_departure_is_repaid_later_at_the_same_k():
    schedule = BASELINE.plan(SPEC, 4)
    assert list(baseline_actions(schedule, SPEC, schedule)) == schedule  # followed: proposes itself
    played = list(schedule)
    played[1] = 0  # recompute where the baseline reuses: one reuse must come back later
    plan = BaselinePlan(schedule, SPEC, 4)
    plan.record(0, 0)
    plan.record(1, 0)
    assert plan.plan[:2] == [0, 0] and sum(plan.plan) == 4 and plan.departures == 1
    assert sum(a != b for a, b in zip(plan.plan[2:], schedule[2:])) == 1  # moved as little as possible
    assert all(plan.plan[i] == 0 for i in SPEC.forced)
    proposed = baseline_actions(schedule, SPEC, plan.plan)
    assert proposed[1] == 1 and list(proposed[2:]) == plan.plan[2:]


def test_following_the_baseline_plays_the_best_fixed_schedule_and_reads_departures_off_the_state(tmp_path):
    env = tiny_env(tmp_path, budget=3)
    follow, fixed = FollowBaseline(BASELINE), StaticSchedule(BASELINE.schedules)
    assert rollout(env, follow, seed=3).schedule == rollout(env, fixed, seed=3).schedule

    class LeaveAtStep2(FollowBaseline):
        def __call__(self, obs):
            proposed = self.baseline_action(obs)
            return 1 - proposed if self.step == 2 and obs["action_mask"].all() else proposed

    played = rollout(env, LeaveAtStep2(BASELINE), seed=3).schedule
    planned = fixed.plan(SPEC, 3)
    assert played[2] != planned[2] and sum(played) == 3  # the departure was repaid: K holds without projection


def test_the_registry_names_play_the_baseline_and_the_grouped_behaviour(tmp_path):
    import json

    from morca_env import schedulers

    path = tmp_path / "fixed.json"
    path.write_text(json.dumps({"schedules": {str(k): v for k, v in BASELINE.schedules.items()}}))
    env = tiny_env(tmp_path, prompts="tiny-train[5::22]", speedup=[1.5, 2.5])
    follow = schedulers.make("follow-best-fixed", env, path=str(path))
    assert rollout(env, follow, {"budget": 3}, seed=1).schedule == StaticSchedule(BASELINE.schedules).plan(SPEC, 3)
    behaviour = schedulers.make("best-fixed-deviations", env, seed=4, path=str(path), group_size=2, rate=1.0)
    options = behaviour.episode_options(4)  # group 2, its leader
    assert rollout(env, behaviour, options, seed=4).schedule == StaticSchedule(BASELINE.schedules).plan(
        SPEC, rollout(env, follow, options, seed=4).num_reuse)
    with pytest.raises(ValueError, match="draws its groups' prompts from the env: pass env="):
        schedulers.make("best-fixed-deviations", None, path=str(path))


def test_grouped_behaviour_shares_options_and_its_leader_plays_the_baseline(tmp_path):
    env = tiny_env(tmp_path, prompts="tiny-train[5::22]", speedup=[1.5, 2.5])
    members = [BaselineDeviations(BASELINE, env, group_size=3, rate=0.5, speedups=[(1.5, 2.5)], seed=10 + i)
               for i in range(6)]
    options = [m.episode_options(i) for i, m in enumerate(members)]
    assert options[0] == options[1] == options[2] != options[3] == options[4] == options[5]
    assert members[0].rate == 0 and members[3].rate == 0 and members[1].rate == 0.5
    leader = rollout(env, members[0], options[0], seed=10)
    follower = rollout(env, members[1], options[1], seed=11)
    assert leader.schedule == StaticSchedule(BASELINE.schedules).plan(SPEC, sum(leader.schedule))
    assert follower.schedule != leader.schedule and sum(follower.schedule) == sum(leader.schedule)
    with pytest.raises(ValueError, match="group_size=1 must be an integer >= 2"):
        BaselineDeviations(BASELINE, env, group_size=1)
    with pytest.raises(ValueError, match=r"rate=\(0.5, 0.1\) must be a probability or a range"):
        BaselineDeviations(BASELINE, env, rate=(0.5, 0.1))


def test_grouped_behaviour_keeps_its_groups_k_where_collection_runs_budget_free(tmp_path):
    """Collection's env masks only forced steps: a departure that the re-planned baseline cannot repay would put
    the member on another K than its leader (114 of anchored-v1's 200 groups were split so)."""
    env = tiny_env(tmp_path, prompts="tiny-train[5::22]", enforce_budget=False)
    realised = {}
    for keep_k in (True, False):
        realised[keep_k] = set()
        for seed in range(6):
            member = BaselineDeviations(BASELINE, env, group_size=2, rate=1.0, seed=seed, keep_k=keep_k)
            member.rate = 1.0  # leave at every step it may
            for budget in (2, 3, 4):
                played = rollout(env, member, {"prompt": "a cat", "seed": 1, "budget": budget}, seed=seed).schedule
                realised[keep_k].add((budget, sum(played)))
    assert all(k == done for k, done in realised[True])  # every member ends on the group's K
    assert any(k != done for k, done in realised[False])  # as it did before

    class Before(BaselineDeviations):  # the behaviour anchored-v1 was collected with (keep_k did not exist)
        def __call__(self, obs):
            action, mask = self.baseline_action(obs), obs["action_mask"]
            if mask[0] and mask[1] and self.rate and self.rng.random() < self.rate:
                action = 1 - action
            return feasible(action, obs)

    for seed in range(4):  # keep_k=False draws as it did: v1's recipe rebuilds the same episodes
        now, then = (cls(BASELINE, env, group_size=2, rate=0.3, seed=seed, keep_k=False)
                     for cls in (BaselineDeviations, Before))
        for member in (now, then):
            member.rate = 0.3
        options = {"prompt": "a dog", "seed": 2, "budget": 3}
        assert [rollout(env, now, options, seed=seed).schedule for _ in range(3)] == \
            [rollout(env, then, options, seed=seed).schedule for _ in range(3)]


# ----------------------------------------------------------------- the residual state, action and return
def test_group_relative_returns_remove_each_groups_mean():
    out = group_relative([30.0, 31.0, 20.0, 22.0, 50.0], ["a", "a", "b", "b", "c"])
    assert np.allclose(out, [-0.5, 0.5, -1.0, 1.0, 0.0])


def recorded(actions, psnr: float, rng) -> Episode:
    """A recorded 8-step episode (tuple observations, terminal PSNR) that played `actions`."""
    budget = int(sum(actions))
    masks = np.array([SPEC.action_mask(t, int(sum(actions[:t])), budget) for t in range(N)], np.float32)
    rewards = np.zeros((N, 1), np.float32)
    rewards[-1] = psnr
    return Episode(observations=[rng.normal(size=(N, 6, 4, 8, 8)).astype(np.float32),
                                 rng.normal(size=(N, 12, 8, 8)).astype(np.float32),
                                 rng.uniform(size=(N, 7)).astype(np.float32), masks],
                   actions=np.array(actions).reshape(N, 1), rewards=rewards, terminated=True)


def test_anchored_episodes_mark_departures_append_the_baseline_and_swap_the_mask():
    rng = np.random.default_rng(0)
    schedule = BASELINE.plan(SPEC, 4)
    played = [0, 0, 1, 1, 1, 0, 1, 0]  # left the baseline at step 1 (and the re-plan follows)
    episodes = [recorded(schedule, 30.0, rng), recorded(played, 31.0, rng)]
    out = anchored_episodes(episodes, [("p", 1, 4)] * 2, BASELINE, SPEC)
    assert np.asarray(out[0].actions).sum() == 0  # the baseline never leaves itself
    proposed = baseline_actions(schedule, SPEC, played)
    assert list(np.asarray(out[1].actions).reshape(-1)) == [int(a != b) for a, b in zip(played, proposed)]
    assert np.asarray(out[1].actions)[1, 0] == 1
    assert np.array_equal(out[1].observations[2][:, 7], proposed.astype(np.float32))
    masks = np.asarray(episodes[1].observations[3])
    assert np.array_equal(out[1].observations[3][:, 0], masks[np.arange(N), proposed])  # follow ok
    assert np.array_equal(out[1].observations[3][:, 1], masks[np.arange(N), 1 - proposed])  # leave ok
    assert [float(e.rewards[-1, 0]) for e in out] == [-0.5, 0.5] and not np.asarray(out[1].rewards)[:-1].any()


def test_data_collected_around_another_schedule_is_refused_by_its_group_leaders():
    rng = np.random.default_rng(1)
    # two groups of 2; the second group's members landed on different K (seed rounding): only leaders are checked
    keys = [("p", 1, 4)] * 2 + [("q", 2, 2), ("q", 2, 3)]
    leaders = [True, False, True, False]
    played = [BASELINE.plan(SPEC, 4), [0, 0, 1, 1, 1, 0, 1, 0], BASELINE.plan(SPEC, 2), [0, 1, 0, 1, 0, 1, 0, 0]]
    episodes = [recorded(actions, 30.0 + i, rng) for i, actions in enumerate(played)]
    anchored.check_led_by(anchored_episodes(episodes, keys, BASELINE, SPEC), leaders, BASELINE)  # led by it: fine
    refit = StaticSchedule({2: [0, 1, 0, 0, 1, 0, 0, 0], 4: [0, 1, 0, 1, 1, 0, 1, 0]}, "a refit")
    with pytest.raises(ValueError, match=r"1 of 2 group leaders in d/v1 do not play the baseline \(a refit\), "
                                         r"e\.g\. episode 2.*--baseline PATH"):
        anchored.check_led_by(anchored_episodes(episodes, keys, refit, SPEC), leaders, refit, ["d/v1"])


def test_a_collected_grouped_dataset_trains_around_its_baseline_and_is_refused_around_another(tmp_path, monkeypatch):
    from agents.anchored import anchored_buffer
    from morca_env import collect_dataset, to_replay_buffer

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    path = tmp_path / "fixed.json"
    path.write_text(json.dumps({"schedules": {str(k): v for k, v in BASELINE.schedules.items()}}))
    behavior = {"name": "best-fixed-deviations", "path": str(path), "group_size": 3, "rate": 0.5,
                "speedups": [[1.5, 2.5]]}  # 3 members, 2 possible K (seed rounding): two share one
    dataset = collect_dataset("test/tiny/grouped-v0", "MorcaTinyRandom-v0", num_episodes=6, behavior=behavior,
                              env_kwargs={"speedup": [1.5, 2.5], "num_inference_steps": N, "lpips": False,
                                          "prompts": "tiny-train[5::22]"}, progress=False)
    _, anchor = anchored_buffer([dataset], to_replay_buffer(dataset, "tuple"), baseline=StaticSchedule.from_file(path))
    assert 0 < anchor["data_departures"] < 1  # the leaders follow (else refused), the others leave at times
    refit = StaticSchedule({2: [0, 1, 0, 0, 1, 0, 0, 0], 3: [0, 1, 0, 1, 0, 1, 0, 0], 4: [0, 1, 1, 0, 1, 1, 0, 0]},
                           "another fit")
    assert all(refit.plan(SPEC, k) != BASELINE.plan(SPEC, k) for k in range(1, 6))
    with pytest.raises(ValueError, match=r"of 2 group leaders in test/tiny/grouped-v0 do not play the baseline"):
        anchored_buffer([dataset], to_replay_buffer(dataset, "tuple"), baseline=refit)


def test_group_leaders_come_from_the_recipes_group_size():
    class Storage:
        metadata = {"morca_recipe": json.dumps({"behavior": {"name": "best-fixed-deviations", "group_size": 3}})}

    class Dataset:
        storage = Storage()

    assert anchored.group_leaders(Dataset(), [0, 1, 2, 3, 5, 6]) == [True, False, False, True, False, True]
    Storage.metadata = {"morca_recipe": json.dumps({"behavior": "random"})}
    assert anchored.group_leaders(Dataset(), [0, 1]) == [False, False]  # not grouped data: nothing to check


def test_a_scheduler_reanchored_to_a_refit_plays_the_refit_and_remembers_what_it_was_trained_around(tmp_path):
    from agents.anchored import anchor_of, baseline_record, load_anchored, with_margin
    from agents.checkpoint import save_learnable

    source = save_learnable(scalar_algo(), tmp_path / "trained.safetensors",
                            {anchored.ANCHOR: {"baseline": baseline_record(BASELINE), "margin": None}})
    refit = StaticSchedule({**BASELINE.schedules, 3: [0, 1, 0, 0, 1, 1, 0, 0]}, "a refit")
    out = with_margin(source, tmp_path / "rebased.safetensors", anchored.NEVER, {"chosen": None}, refit)
    anchor = anchor_of(out)
    assert anchor["baseline"] == baseline_record(refit) and anchor["trained_around"] == baseline_record(BASELINE)
    policy = load_anchored(out)
    assert policy.baseline.plan(SPEC, 3) == [0, 1, 0, 0, 1, 1, 0, 0] != BASELINE.plan(SPEC, 3)
    again = with_margin(out, tmp_path / "again.safetensors", anchored.NEVER, {"chosen": None})  # no baseline: kept
    assert anchor_of(again)["baseline"] == baseline_record(refit)
    assert anchor_of(again)["trained_around"] == baseline_record(BASELINE)
    third = StaticSchedule({**BASELINE.schedules, 3: [0, 1, 1, 0, 1, 0, 0, 0]}, "a second refit")
    twice = anchor_of(with_margin(out, tmp_path / "twice.safetensors", anchored.NEVER, {"chosen": None}, third))
    assert twice["baseline"] == baseline_record(third) and twice["trained_around"] == baseline_record(BASELINE)


# ----------------------------------------------------------------- the scheduler
def test_margin_never_is_the_baseline_bit_for_bit_without_a_network_call(tmp_path, monkeypatch):
    env = tiny_env(tmp_path, budget=3)
    algo = scalar_algo()
    monkeypatch.setattr(algo.impl, "q_values", lambda *a, **k: (_ for _ in ()).throw(AssertionError("network called")))
    policy = AnchoredPolicy(algo, BASELINE)
    played = rollout(env, policy, seed=5).schedule
    assert played == rollout(env, FollowBaseline(BASELINE), seed=5).schedule == rollout(env, BASELINE, seed=5).schedule
    assert policy.record.departures == []
    replanning = AnchoredPolicy(scalar_algo(), BASELINE, margin=1e9)  # asks its critic at each free step, stays
    assert rollout(env, replanning, seed=5).schedule == played
    assert policy.record.free_steps == replanning.record.free_steps > 0  # the share of steps leaving reads it


def test_the_switch_leaves_exactly_where_the_critics_gain_exceeds_the_margin(tmp_path, monkeypatch):
    env = tiny_env(tmp_path, budget=3)
    algo = scalar_algo()

    def q_values(x):  # leaving gains 2 dB at step 3 only (t = remaining / N in the scalars)
        step = int(round(N * (1 - float(x[2][0, 2]))))
        return torch.tensor([[0.0, 2.0 if step == 3 else -1.0]])

    monkeypatch.setattr(algo.impl, "q_values", q_values)
    baseline = rollout(env, FollowBaseline(BASELINE), seed=5).schedule
    for margin, leaves in ((1.0, [3]), (2.5, [])):
        policy = AnchoredPolicy(algo, BASELINE, margin)
        played = rollout(env, policy, seed=5).schedule
        assert policy.record.departures == leaves
        assert (played[3] != baseline[3]) == bool(leaves) and played[:3] == baseline[:3]
        assert sum(played) == 3
    with pytest.raises(ValueError, match="margin=-1 must be >= 0 dB"):
        AnchoredPolicy(algo, BASELINE, -1)


def test_a_network_of_the_plain_state_is_refused():
    from tests.agents.test_agents import _scalar_algo

    with pytest.raises(ValueError, match="needs a network trained on the anchored state"):
        AnchoredPolicy(_scalar_algo(0), BASELINE)


def test_the_margin_is_kept_only_where_validation_shows_a_gain_with_confidence(tmp_path, monkeypatch):
    env = tiny_env(tmp_path)
    options = [{"prompt": f"p{i}", "seed": i, "budget": 3} for i in range(6)]
    gains = [np.array([0.1, 0.5 + i / 10]) for i in range(6)]  # the critic's gains on each baseline run

    def fake_play(env, policies, options, progress=None):
        if policies[0].gains_only:
            for policy, g in zip(policies, gains):
                policy.record.gains = list(g)
            return [30.0] * len(policies)
        for policy in policies:
            policy.record.departures = [4]
        return [30.0 + outcome(i) for i in range(len(policies))]

    monkeypatch.setattr(anchored, "play", fake_play)
    algo = scalar_algo()
    for outcome, expect_never in ((lambda i: 0.4 + 0.01 * i, False), (lambda i: -0.4, True),
                                  (lambda i: 2.0 if i % 2 else -1.5, True)):  # a mean gain, but not a sure one
        margin, record = choose_margin(env, algo, BASELINE, options, rates=(0.5, 0.1))
        assert math.isinf(margin) == expect_never
        assert (record["chosen"] is None) == expect_never
        assert all(r["runs_leaving"] > 0 for r in record["candidates"])
    # a candidate above every gain never leaves: gain 0 without playing, never chosen
    margin, record = choose_margin(env, algo, BASELINE, options, rates=(0.0,))
    assert record["candidates"][0]["episodes_played"] == 0 and math.isinf(margin)


def test_anchored_arrays_keep_shapes_and_dtypes():
    obs = [np.zeros((3, 6, 4, 8, 8), np.float32), np.zeros((3, 12, 8, 8), np.float32), np.zeros((3, 7), np.float32),
           np.array([[1, 0], [1, 1], [0, 1]], np.float32)]
    out = anchored_arrays(obs, np.array([0, 1, 1]))
    assert out[2].shape == (3, 8) and out[2].dtype == np.float32 and list(out[2][:, 7]) == [0, 1, 1]
    assert out[3].tolist() == [[1, 0], [1, 1], [1, 0]]


# ----------------------------------------------------------------- the shipped scheduler
def test_the_shipped_scheduler_loads_without_a_path_and_drives_accelerate():
    from morca_env import schedulers
    from morca_env.models.tiny import load_morca_tiny

    from agents.checkpoint import verify
    from agents.policy import shipped_checkpoint

    verify(shipped_checkpoint())  # its sha256 sidecar ships with it
    policy = schedulers.make("morca")
    assert isinstance(policy, AnchoredPolicy) and policy.baseline.source
    other = gym.make("MorcaTinyRandom-v0", lpips=False)  # another model: its best fixed schedule is not the baseline's
    with pytest.raises(FileNotFoundError, match="no scheduler ships for model 'tiny-random' .*pass its checkpoint"):
        schedulers.make("morca", other)
    other.close()
    pipe = load_morca_tiny()
    result = morca_env.accelerate(pipe, policy, budget=30, prompt="a red circle moving left on a black background",
                                  height=16, width=16, num_frames=7, max_sequence_length=16, output_type="latent",
                                  generator=torch.Generator().manual_seed(0))
    assert sum(result.schedule) == 30
    if policy.margin == math.inf:  # the chosen margin says "never leave": it is the best fixed schedule, exactly
        spec = BudgetSpec(len(result.schedule), frozenset({0, len(result.schedule) - 1}))
        assert result.schedule == policy.baseline.plan(spec, 30)


def test_morca_scenes_gets_its_own_shipped_scheduler_around_its_own_best_fixed_schedule():
    from morca_env import schedulers

    from agents.checkpoint import verify
    from agents.policy import shipped_checkpoint

    verify(shipped_checkpoint("scenes"))
    env = gym.make("MorcaScenes-v0", lpips=False)
    policy = schedulers.make("morca", env)
    assert isinstance(policy, AnchoredPolicy) and "MorcaScenes-v0" in policy.baseline.source
    assert policy.reads_latents  # the state that can see the content
    trajectory = morca_env.rollout(env, policy, {"prompt": "one red circle racing left on a striped background",
                                                 "seed": 0, "budget": 30})
    assert trajectory.num_reuse == 30
    if policy.margin == math.inf:  # "never leave": MorcaScenes' best fixed schedule, action for action
        best = schedulers.make("best-fixed", env)
        again = morca_env.rollout(env, best, {"prompt": "one red circle racing left on a striped background",
                                              "seed": 0, "budget": 30})
        assert trajectory.info["schedule"] == again.info["schedule"]
        lean = gym.make("MorcaScenes-v0", lpips=False, latent_features=False)  # as the quickstart evaluates it
        assert morca_env.rollout(lean, schedulers.make("morca", lean), {
            "prompt": "one red circle racing left on a striped background", "seed": 0, "budget": 30}
        ).info["schedule"] == again.info["schedule"]
        with pytest.raises(ValueError, match="reads latent features .* but the observation has none"):
            morca_env.rollout(lean, schedulers.make("morca", lean, margin=0.0), {"seed": 0, "budget": 30})
        lean.close()
    env.close()


def test_a_margin_for_a_plain_checkpoint_is_refused_and_a_shipped_one_holds_no_optimizer_state(tmp_path):
    from morca_env import schedulers

    from agents.checkpoint import load_state, save_learnable
    from agents.policy import shipped_checkpoint
    from tests.agents.test_agents import _scalar_algo

    path = save_learnable(_scalar_algo(0), tmp_path / "plain.safetensors")
    with pytest.raises(ValueError, match="margin= is an anchored scheduler's option"):
        schedulers.make("morca", path=str(path), margin=0.1)
    assert not any(name.endswith("optim") for name in load_state(shipped_checkpoint()).state)
    from agents.policy import MorcaPolicy

    with pytest.raises(ValueError, match="is an anchored scheduler: load it with"):
        MorcaPolicy.load(shipped_checkpoint())


# ----------------------------------------------------------------- training on it
def test_online_rounds_play_groups_led_by_the_baseline_with_group_relative_returns(tmp_path):
    from agents.anchored import baseline_record
    from agents.online import OnlineConfig, OnlineTrainer

    env = tiny_env(tmp_path, prompts="tiny-train[5::22]")
    anchor = {"baseline": baseline_record(BASELINE), "margin": None}
    config = OnlineConfig(rounds=1, trajectories_per_round=8, warmup_epochs=1, joint_epochs=1, batch_size=8,
                          speedup_range=(1.5, 2.5), max_steps_per_epoch=2, n_step=N, features="")
    trainer = OnlineTrainer(env, config, tmp_path / "online", offline_algo=scalar_algo(), progress=False,
                            anchor=anchor)
    episodes, infos = trainer.collect(8)
    keys = [(i["prompt"], i["seed"], i["budget"]) for i in infos]
    assert keys[:4] == [keys[0]] * 4 and keys[4:] == [keys[4]] * 4 and keys[0] != keys[4]
    assert all(np.asarray(episodes[i].actions).sum() == 0 for i in (0, 4))  # each group's leader follows
    assert all(e.observations[2].shape == (N, 8) for e in episodes)
    returns = [float(np.asarray(e.rewards).sum()) for e in episodes]
    assert abs(sum(returns[:4])) < 1e-4 and abs(sum(returns[4:])) < 1e-4
    psnr = [min(i["psnr"], 100.0) for i in infos]
    assert np.allclose(returns[1], psnr[1] - np.mean(psnr[:4]), atol=1e-4)
    trainer.run()
    from agents.anchored import anchor_of

    assert anchor_of(tmp_path / "online" / "final.safetensors")["baseline"] == anchor["baseline"]


def test_anchored_training_refuses_data_without_groups(tmp_path, monkeypatch):
    from agents.anchored import anchored_buffer
    from morca_env import collect_dataset, to_replay_buffer

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    dataset = collect_dataset("morca/tiny/ungrouped-v0", "MorcaTinyRandom-v0", num_episodes=2,
                              env_kwargs={"speedup": [1.5, 2.5], "num_inference_steps": N, "lpips": False})
    buffer = to_replay_buffer(dataset, "tuple")
    with pytest.raises(ValueError, match="have none: collect such data or train with --recipe paper"):
        anchored_buffer([dataset], buffer, baseline=BASELINE)


def test_the_gain_is_the_twin_critics_minimum_of_leaving_minus_that_of_following(tmp_path):
    env = tiny_env(tmp_path, budget=3)
    algo = scalar_algo(1)
    policy = AnchoredPolicy(algo, BASELINE, margin=0.0)
    obs, info = env.reset(seed=2)
    policy.reset(obs, info)
    obs, *_ = env.step(0)
    proposed = policy.follow.baseline_action(obs)
    x = policy._inputs(obs, proposed)
    with torch.no_grad():
        q = torch.stack([f(x).q_value[0] for f in algo.impl.q_function])  # (critics, actions)
    expected = float(q[:, 1].min() - q[:, 0].min())
    assert policy.gain(obs, proposed) == pytest.approx(expected, abs=1e-6)
    # the case discriminates: one critic alone (or their mean) would give another gain
    assert not np.isclose(float((q[:, 1] - q[:, 0]).mean()), expected)


@pytest.mark.parametrize("record, fragment", [
    ([1, 2], "its anchored record is a list, expected an object"),
    ({"margin": None}, "has no baseline schedules"),
    ({"baseline": {"schedules": {"3": [0, 1]}}, "margin": float("nan")}, "has margin=nan; valid: a finite number"),
    ({"baseline": {"schedules": {"3": [0, 1]}}, "margin": -1}, "has margin=-1; valid"),
    ({"baseline": {"schedules": {"x": [0, 1]}}, "margin": 0.1}, "has a malformed baseline"),
])
def test_a_crafted_anchored_record_is_refused_by_name(tmp_path, record, fragment):
    from agents.anchored import load_anchored
    from agents.checkpoint import CheckpointError, save_learnable

    path = save_learnable(scalar_algo(), tmp_path / "crafted.safetensors", {anchored.ANCHOR: record})
    with pytest.raises(CheckpointError, match=re.escape(f"checkpoint {path}: its anchored record")) as caught:
        load_anchored(path)
    assert fragment in str(caught.value)
