"""The learners move the policy towards the better action (a sign error in a loss would move it away).

A two-state toy problem, one decision per episode: in state A reusing earns more
(30 vs 20 dB), in state B recomputing does. The state is written in the scalars
only, so the networks run with `features=""` (scalar trunk) and stay fast.
"""

from types import SimpleNamespace

import d3rlpy
import gymnasium as gym
import numpy as np
import pytest
import torch
from d3rlpy.torch_utility import soft_sync
from gymnasium import spaces

from agents.iql import DiscreteIQLConfig
from agents.networks import MorcaEncoderFactory
from agents.training import episode_from_trajectory, make_buffer
from morca_env.rollout import Trajectory

C = 1
BEST = {0: 1, 1: 0}  # state A (0): reuse is better; state B (1): recompute is better
GOOD, BAD = 30.0, 20.0


def toy_observation(state: int, terminal: bool = False) -> dict:
    scalars = np.full(7, 0.8 if state == 0 else 0.2, np.float32)
    scalars[2] = 0.0 if terminal else 1.0
    return {"pooled": np.zeros((3 * C, 4, 8, 8), np.float32), "temporal": np.zeros((6 * C, 8, 8), np.float32),
            "scalars": scalars, "action_mask": np.array([1, 0] if terminal else [1, 1], np.int8)}


class TwoStateEnv(gym.Env):
    """One free decision per episode; the state is the generation seed's parity."""

    def __init__(self):
        self.observation_space = spaces.Dict({
            "pooled": spaces.Box(-np.inf, np.inf, (3 * C, 4, 8, 8), np.float32),
            "temporal": spaces.Box(-np.inf, np.inf, (6 * C, 8, 8), np.float32),
            "scalars": spaces.Box(0, 1, (7,), np.float32), "action_mask": spaces.MultiBinary(2)})
        self.action_space = spaces.Discrete(2)
        self.suite = SimpleNamespace(sample=lambda rng: ("toy", int(rng.integers(1000))))
        self.calibration = SimpleNamespace(speedup_range=(1.0, 5.0))

    def reset(self, *, seed=None, options=None):
        self.state = int((options or {}).get("seed", seed or 0)) % 2
        return toy_observation(self.state), {"num_steps": 1}

    def step(self, action):
        reward = GOOD if int(action) == BEST[self.state] else BAD
        return toy_observation(self.state, True), reward, True, False, {"action": int(action), "psnr": reward}


def toy_buffer(episodes_per_pair: int = 8):
    """Every (state, action) pair equally often: the behaviour data alone favour no action."""
    episodes = []
    for state in (0, 1):
        for action in (0, 1):
            reward = GOOD if action == BEST[state] else BAD
            for _ in range(episodes_per_pair):
                episodes.append(toy_episode(state, action, reward))
    return make_buffer(episodes)


def toy_episode(state: int, action: int, reward: float):
    """A one-step episode in `state` as the env's rollout records it (o_0 and the terminal o_1)."""
    first, last = toy_observation(state), toy_observation(state, terminal=True)
    observations = {k: np.stack([first[k], last[k]]) for k in first}
    return episode_from_trajectory(Trajectory(actions=np.array([action]), rewards=np.array([reward], np.float32),
                                              info={}, reset_info={}, observations=observations))


def prob_of_best(policy_logits) -> np.ndarray:
    """P(best action | state) for states A and B, from a function tuple-observation -> logits."""
    out = []
    for state in (0, 1):
        obs = toy_observation(state)
        x = [torch.as_tensor(obs[k], dtype=torch.float32)[None] for k in ("pooled", "temporal", "scalars", "action_mask")]
        with torch.no_grad():
            probs = torch.softmax(policy_logits(x), dim=1)[0]
        out.append(float(probs[BEST[state]]))
    return np.array(out)


def assert_moved_towards_best(before, after):
    """In both states the best action's probability closed at least half of its gap to 1."""
    assert np.all(after > before + 0.5 * (1 - before)), (before, after)


def scalar_iql(**kwargs):
    factory = MorcaEncoderFactory(features="")
    return DiscreteIQLConfig(actor_encoder_factory=factory, critic_encoder_factory=factory,
                             value_encoder_factory=factory, **kwargs).create(device="cpu")


@pytest.mark.parametrize("seed, shared", [(0, False), (1, False), (0, True), (1, True)])
def test_iql_actor_moves_towards_the_action_with_the_higher_return(seed, shared):
    d3rlpy.seed(seed)
    buffer = toy_buffer()
    algo = scalar_iql(batch_size=32, actor_learning_rate=3e-3, critic_learning_rate=1e-2, tau=0.2,
                      shared_critic_encoder=shared)
    algo.build_with_dataset(buffer)
    policy = algo.impl.policy
    before = prob_of_best(policy)
    algo.set_critic_only(True)  # the critic learns first: the actor's weights come from its advantages
    for _ in range(150):
        algo.update(buffer.sample_transition_batch(32))
    algo.set_critic_only(False)
    for _ in range(30):
        algo.update(buffer.sample_transition_batch(32))
    after = prob_of_best(policy)
    assert_moved_towards_best(before, after)


def test_online_trainer_moves_towards_the_action_with_the_higher_return(tmp_path):
    from agents.online import OnlineConfig, OnlineTrainer

    d3rlpy.seed(0)
    config = OnlineConfig(rounds=1, trajectories_per_round=32, warmup_epochs=150, joint_epochs=30, batch_size=32,
                          actor_learning_rate=3e-3, critic_learning_rate=1e-2, features="",
                          speedup_range=(1.5, 2.5))
    trainer = OnlineTrainer(TwoStateEnv(), config, tmp_path / "online", progress=False)
    trainer.algo.impl._config.tau = 0.2  # fast target critics: a few hundred updates suffice
    before = prob_of_best(trainer.algo.impl.policy)
    trainer.run()
    after = prob_of_best(trainer.algo.impl.policy)
    assert_moved_towards_best(before, after)


def test_reinforce_moves_towards_the_action_with_the_higher_return(tmp_path):
    from agents.reinforce import Reinforce, ReinforceConfig

    from agents.networks import masked_logits

    d3rlpy.seed(0)
    config = ReinforceConfig(learning_rate=3e-3, episodes_per_update=16, total_episodes=16 * 15, features="",
                             speedup_range=(1.5, 2.5))
    trainer = Reinforce(TwoStateEnv(), config, tmp_path / "reinforce", progress=False)
    logits = lambda x: masked_logits(trainer.network(*x[:3]), x[3])  # noqa: E731
    before = prob_of_best(logits)
    trainer.train()
    after = prob_of_best(logits)
    assert_moved_towards_best(before, after)


def test_reinforce_loss_is_the_baselined_log_likelihood_over_free_steps(tmp_path):
    """loss = -sum_free log pi(a|s) (R - b) / #free, with the running baseline once there is one."""
    from agents.networks import masked_logits
    from agents.reinforce import Reinforce, ReinforceConfig

    d3rlpy.seed(0)
    trainer = Reinforce(TwoStateEnv(), ReinforceConfig(learning_rate=2e-3), tmp_path / "r", progress=False)
    assert trainer.network.trunk.branch3d is not None  # default features: the latent branches read C channels
    group = trainer.optimizer.param_groups[0]
    assert group["lr"] == 2e-3 and group["weight_decay"] == 0.01
    rng = np.random.default_rng(0)

    def observation(state, forced):
        obs = toy_observation(state)
        obs["pooled"] = rng.normal(size=obs["pooled"].shape).astype(np.float16)  # datasets store float16
        obs["action_mask"] = np.array([1, 0] if forced else [1, 1], np.int8)
        return obs

    episodes = [([observation(0, True), observation(0, False), observation(1, False)], [0, 1, 0], 30.0),
                ([observation(1, True), observation(1, False)], [0, 1], 20.0)]

    def expected(baseline):
        total, count = 0.0, 0
        for observations, actions, ret in episodes:
            for obs, action in zip(observations, actions):
                if obs["action_mask"].sum() < 2:
                    continue
                x = [torch.as_tensor(np.asarray(obs[k], np.float32))[None]
                     for k in ("pooled", "temporal", "scalars", "action_mask")]
                logp = torch.log_softmax(masked_logits(trainer.network(*x[:3]), x[3]), dim=1)[0, action]
                total, count = total + float(logp) * (ret - baseline), count + 1
        return -total / count

    # the trainer takes each episode's observations stacked per key, as morca_env.rollout records them
    stacked = [({k: np.stack([o[k] for o in observations]) for k in observations[0]}, actions, ret)
               for observations, actions, ret in episodes]
    with torch.no_grad():
        assert float(trainer.loss(stacked)) == pytest.approx(expected(25.0), rel=1e-5)  # first batch: mean return
        trainer.baseline = 22.0
        assert float(trainer.loss(stacked)) == pytest.approx(expected(22.0), rel=1e-5)


def test_reinforce_evaluation_policy_is_greedy_and_training_is_seeded(tmp_path):
    from agents.reinforce import Reinforce, ReinforceConfig

    config = ReinforceConfig(learning_rate=3e-3, episodes_per_update=4, total_episodes=10, features="",
                             speedup_range=(1.5, 2.5))
    runs = []
    for name in ("a", "b"):
        trainer = Reinforce(TwoStateEnv(), config, tmp_path / name, progress=False)
        trainer.train()
        assert trainer.episodes_done == 10 and len(trainer.history) == 3  # batches of 4, 4 and 2
        assert [record["episodes"] for record in trainer.history] == [4, 8, 10]  # from episode 0
        runs.append(torch.cat([p.detach().flatten() for p in trainer.network.parameters()]))
    assert torch.equal(runs[0], runs[1])
    with torch.no_grad():
        trainer.network.head.weight.zero_()
        trainer.network.head.bias.zero_()  # equal logits: a greedy policy takes action 0, a sampling one does not
    policy = trainer.policy()
    obs = toy_observation(0)
    assert [policy(obs) for _ in range(20)] == [0] * 20
    sampled = trainer.policy(deterministic=False)
    assert 0 < sum(sampled(obs) for _ in range(40)) < 40
    from agents.reinforce import ReinforcePolicy

    assert [ReinforcePolicy(trainer.network)(obs) for _ in range(5)] == [0] * 5  # greedy unless asked

    def stream(seed=None, **kw):
        policy = ReinforcePolicy(trainer.network, deterministic=False, **({} if seed is None else {"seed": seed}))
        return [policy(obs) for _ in range(40)]

    # sampling is seeded per policy (not the global stream), seed 0 unless given
    assert stream(3) == stream(3) and stream(3) != stream(4) and stream() == stream(0) != stream(1)


def test_reinforce_baseline_is_an_ema_of_batch_returns_and_updates_are_clipped_to_norm_one(tmp_path):
    """b <- mean R of the first batch, then b <- d b + (1 - d) mean R; the gradient norm at each step is <= 1."""
    from agents.reinforce import Reinforce, ReinforceConfig

    config = ReinforceConfig(learning_rate=3e-3, episodes_per_update=4, total_episodes=12, baseline_decay=0.7,
                             features="", speedup_range=(1.5, 2.5))
    trainer = Reinforce(TwoStateEnv(), config, tmp_path / "r", progress=False)
    norms, baselines, step = [], [], trainer.optimizer.step

    def recording_step(*args, **kwargs):
        grads = [p.grad.flatten() for p in trainer.network.parameters() if p.grad is not None]
        norms.append(float(torch.cat(grads).norm()))
        baselines.append(trainer.baseline)  # the baseline this batch's loss used (None: its own mean)
        return step(*args, **kwargs)

    trainer.optimizer.step = recording_step
    trainer.train()
    means = [h["rollout_psnr"] for h in trainer.history]  # the toy's PSNR is its return
    assert len(means) == 3 and len(set(means)) > 1
    expected = means[0]
    assert baselines[0] is None and baselines[1] == pytest.approx(expected)
    expected = 0.7 * expected + 0.3 * means[1]
    assert baselines[2] == pytest.approx(expected)
    assert trainer.baseline == pytest.approx(0.7 * expected + 0.3 * means[2])
    # R - b = +-5 dB on a fresh network: the raw gradient is larger than 1, so the clip is what sets its norm
    assert max(norms) == pytest.approx(1.0, rel=1e-4) and all(n <= 1.0 + 1e-4 for n in norms)


# ------------------------------------------------------------------ IQL losses against their formulas
def chain_episode(rng, n=5):
    """An n-step episode with forced first and last steps and the terminal PSNR as the only reward."""
    observations = {"pooled": np.zeros((n + 1, 3 * C, 4, 8, 8), np.float32),
                    "temporal": np.zeros((n + 1, 6 * C, 8, 8), np.float32),
                    "scalars": rng.uniform(size=(n + 1, 7)).astype(np.float32),
                    "action_mask": np.ones((n + 1, 2), np.int8)}
    observations["action_mask"][[0, n - 1, n]] = [1, 0]
    actions = np.where(observations["action_mask"][:n, 1] > 0, rng.integers(0, 2, n), 0)
    rewards = np.zeros(n, np.float32)
    rewards[-1] = 20 + 10 * actions.mean()
    return episode_from_trajectory(Trajectory(actions=actions, rewards=rewards, info={}, reset_info={},
                                              observations=observations))


def iql_and_batch(n_step=1, size=48, **kwargs):
    from d3rlpy.torch_utility import TorchMiniBatch

    d3rlpy.seed(0)
    rng = np.random.default_rng(0)
    buffer = make_buffer([chain_episode(rng) for _ in range(8)], n_step)
    algo = scalar_iql(batch_size=size, **kwargs)
    algo.build_with_dataset(buffer)
    batch = TorchMiniBatch.from_batch(buffer.sample_transition_batch(size), 1.0, False, "cpu")
    return algo.impl, batch


def min_target_q(impl, batch):
    q = torch.stack([f(batch.observations).q_value for f in impl.modules.targ_q_funcs]).min(dim=0).values
    return q.gather(1, batch.actions.long().reshape(-1, 1))


def test_iql_value_loss_is_the_expectile_regression_on_the_min_target_q():
    impl, batch = iql_and_batch(expectile=0.8)
    with torch.no_grad():
        q = min_target_q(impl, batch)
        impl.modules.value_func._fc.bias.add_(float(q.median() - impl.modules.value_func(batch.observations).median()))
        diff = q - impl.modules.value_func(batch.observations)
        assert ((diff > 0) & (diff < 1)).any() and (diff < 0).any()  # both sides of the expectile
        expected = (torch.where(diff < 0, 0.2, 0.8) * diff**2).mean()
        assert float(impl.value_loss(batch)) == pytest.approx(float(expected), rel=1e-5)
        # the targets, not the online critics: move the online ones and the loss stays
        for p in impl.modules.q_funcs.parameters():
            p.add_(1.0)
        assert float(impl.value_loss(batch)) == pytest.approx(float(expected), rel=1e-5)


def test_iql_q_loss_is_the_huber_td_error_to_r_plus_discounted_v_summed_over_critics():
    impl, batch = iql_and_batch(n_step=3, gamma=0.5)
    assert set(batch.intervals.reshape(-1).tolist()) > {1.0}  # n-step targets: gamma^k, k > 1 somewhere
    assert (batch.terminals == 0).any() and (batch.terminals == 1).any()
    with torch.no_grad():
        y = batch.rewards + 0.5 ** batch.intervals * impl.modules.value_func(batch.next_observations) * (
            1 - batch.terminals)
        expected = 0.0
        for f in impl.modules.q_funcs:
            q = f(batch.observations).q_value.gather(1, batch.actions.long().reshape(-1, 1))
            d = (y - q).abs()
            expected += float(torch.where(d < 1, 0.5 * d**2, d - 0.5).mean())
        assert len(impl.modules.q_funcs) == 2
        assert float(impl.q_loss(batch)) == pytest.approx(expected, rel=1e-5)


def test_iql_actor_loss_is_the_clipped_advantage_weighted_likelihood_over_free_steps():
    impl, batch = iql_and_batch(weight_temp=1.5, max_weight=2.0)
    obs, actions = batch.observations, batch.actions.long().reshape(-1)
    with torch.no_grad():
        impl.modules.value_func._fc.bias.add_(0.3)
        free = (obs[3].sum(dim=1) > 1.5).float()
        assert 0 < free.sum() < len(free)

        def expected(free):
            adv = (min_target_q(impl, batch) - impl.modules.value_func(obs)).reshape(-1)
            count = max(float(free.sum()), 1.0)
            mean = (adv * free).sum() / count
            std = (((adv - mean) ** 2 * free).sum() / count).sqrt()
            weight = torch.exp(1.5 * (adv - mean) / (std + 1e-6)).clamp(max=2.0)
            logp = torch.log_softmax(impl.modules.policy(obs), dim=1).gather(1, actions.reshape(-1, 1)).reshape(-1)
            return -float((weight * logp * free).sum() / count), weight, count

        loss, extra = impl.actor_loss(batch)
        value, weight, count = expected(free)
        assert (weight[free > 0] == 2.0).any() and (weight[free > 0] < 1).any()  # the cap binds, weights differ
        assert float(loss) == pytest.approx(value, rel=1e-5)
        assert extra["free_fraction"] == pytest.approx(float(free.mean()))
        assert extra["mean_weight"] == pytest.approx(float((weight * free).sum() / count), rel=1e-5)
        # one free transition: its advantage is the mean, weight exp(0) = 1, loss = -log pi(a|s)
        only = torch.zeros_like(free)
        only[int(free.nonzero()[0])] = 1
        obs[3][only == 0] = torch.tensor([1.0, 0.0])
        loss, extra = impl.actor_loss(batch)
        assert float(loss) == pytest.approx(expected(only)[0], rel=1e-5)
        assert extra["mean_weight"] == pytest.approx(1.0, rel=1e-4)


def test_iql_actor_loss_counts_forced_steps_when_asked():
    impl, batch = iql_and_batch(exclude_forced=False, weight_temp=1.0, max_weight=100.0)
    obs, actions = batch.observations, batch.actions.long().reshape(-1)
    with torch.no_grad():
        adv = (min_target_q(impl, batch) - impl.modules.value_func(obs)).reshape(-1)
        weight = torch.exp((adv - adv.mean()) / (adv.std(unbiased=False) + 1e-6))
        logp = torch.log_softmax(impl.modules.policy(obs), dim=1).gather(1, actions.reshape(-1, 1)).reshape(-1)
        loss, extra = impl.actor_loss(batch)
        assert float(loss) == pytest.approx(-float((weight * logp).mean()), rel=1e-5)
        assert extra["free_fraction"] == 1.0


def test_iql_update_moves_targets_by_tau_and_critic_only_freezes_the_policy():
    impl, batch = iql_and_batch(tau=0.25, critic_learning_rate=1e-5)
    params = lambda module: [p.detach().clone() for p in module.parameters()]  # noqa: E731
    assert impl.critic_only is False  # a fresh algorithm trains its actor
    policy0, target0 = params(impl.modules.policy), params(impl.modules.targ_q_funcs)
    assert all(torch.equal(a, b) for a, b in zip(target0, params(impl.modules.q_funcs)))  # targets start synced
    with torch.no_grad():
        losses0 = float(impl.q_loss(batch)), float(impl.value_loss(batch))
    metrics = impl.update_critic(batch)
    assert (metrics["q_loss"], metrics["v_loss"]) == pytest.approx(losses0)
    with torch.no_grad():  # V descends its loss (the target critics, its regression targets, did not move)
        assert float(impl.value_loss(batch)) < losses0[1]
    target0 = params(impl.modules.targ_q_funcs)
    impl.critic_only = True
    metrics = impl.inner_update(batch, 0)
    assert set(metrics) == {"q_loss", "v_loss"}
    assert all(torch.equal(a, b) for a, b in zip(policy0, params(impl.modules.policy)))
    online = params(impl.modules.q_funcs)
    assert not all(torch.equal(a, b) for a, b in zip(target0, online))  # the critics moved
    for old, new, target in zip(target0, online, params(impl.modules.targ_q_funcs)):
        assert torch.allclose(target, 0.75 * old + 0.25 * new, atol=1e-6)
    impl.critic_only = False
    metrics = impl.inner_update(batch, 1)
    assert set(metrics) == {"q_loss", "v_loss", "actor_loss", "free_fraction", "mean_weight"}
    assert not all(torch.equal(a, b) for a, b in zip(policy0, params(impl.modules.policy)))
    assert metrics["q_loss"] > 0 and metrics["v_loss"] > 0


# ------------------------------------------------------------------ the online round's wiring
def test_one_target_forward_serves_both_losses_and_changes_no_number():
    """`inner_update` computes the target critics' Q once for the value and the actor losses (the targets move only
    after both steps): the same parameters as the two losses computing it each, and one target forward."""
    import copy

    impl, batch = iql_and_batch(tau=0.25)
    impl.inner_update(batch, 0)  # the target critics now differ from the online ones
    twin = copy.deepcopy(impl)
    twin.update_critic(batch)  # each loss computes its own target Q
    twin.update_actor(batch)
    soft_sync(twin.modules.targ_q_funcs, twin.modules.q_funcs, 0.25)
    calls = []
    real = impl.target_q
    impl.target_q = lambda *a: calls.append(1) or real(*a)
    impl.inner_update(batch, 0)
    assert len(calls) == 1
    def parameters(impl):
        return [p for m in ("policy", "q_funcs", "targ_q_funcs", "value_func")
                for p in getattr(impl.modules, m).parameters()]

    assert all(torch.equal(mine, theirs) for mine, theirs in zip(parameters(impl), parameters(twin)))


def test_a_shared_critic_encoder_runs_once_per_batch_and_never_serves_stale_features():
    """With `shared_critic_encoder`, Q1, Q2 and V read one encoder (the targets another): a critic step encodes s
    and s' once each, and after the update V's features are recomputed with the new weights."""
    from agents.networks import SharedEncoder

    impl, batch = iql_and_batch(tau=0.25, shared_critic_encoder=True)
    online, target = impl.modules.q_funcs[0].encoder, impl.modules.targ_q_funcs[0].encoder
    assert isinstance(online, SharedEncoder) and online is impl.modules.q_funcs[1].encoder
    assert online is impl.modules.value_func._encoder and target is not online  # d3rlpy keeps it private
    assert not set(map(id, online.parameters())) & set(map(id, target.parameters()))
    calls = []
    for shared in (online, target):
        real = shared.encoder.forward
        shared.encoder.forward = lambda x, real=real, shared=shared: calls.append(shared) or real(x)
    impl.update_critic(batch)
    assert calls.count(online) == 2 and calls.count(target) == 1  # s and s'; the targets' min over both heads
    with torch.no_grad():
        before = impl.modules.value_func(batch.observations)
    impl.update_critic(batch)
    with torch.no_grad():
        after = impl.modules.value_func(batch.observations)
        fresh = impl.modules.value_func._fc(online.encoder(batch.observations))
    assert torch.equal(after, fresh) and not torch.equal(after, before)
    with torch.no_grad():  # the same batch and grad mode, new weights (an optimizer step works in place too)
        next(online.parameters()).add_(0.5)
        moved = impl.modules.value_func(batch.observations)
    assert not torch.equal(moved, after)


def test_online_trainer_wires_its_config_into_iql_and_runs_warmup_then_joint_updates(tmp_path, monkeypatch):
    """Learning rates, beta, w_max and batch size reach IQL; each round collects, then trains the critics alone for
    warmup_epochs and everything for joint_epochs (epochs of |buffer| / batch updates, capped) on offline + online
    data; a resumed run goes on from the next round."""
    import json

    import agents.online as online
    from agents.online import OnlineConfig, OnlineTrainer

    class LosslessEnv(TwoStateEnv):  # identical videos: PSNR = inf, logged as 100 dB
        def step(self, action):
            obs, reward, terminated, truncated, info = super().step(action)
            return obs, reward, terminated, truncated, {**info, "psnr": float("inf")}

    d3rlpy.seed(0)
    config = OnlineConfig(rounds=2, trajectories_per_round=6, warmup_epochs=3, joint_epochs=2, batch_size=4,
                          actor_learning_rate=2e-3, critic_learning_rate=5e-3, weight_temp=0.7, max_weight=9.0,
                          features="", n_step=2, max_steps_per_epoch=2, speedup_range=(1.5, 2.5))
    offline = [toy_episode(0, 1, GOOD), toy_episode(1, 1, BAD)]
    calls = []

    def fake_buffer(episodes, n_step):
        calls.append(("buffer", len(episodes), n_step))
        return make_buffer(episodes, n_step)

    def fake_updates(algo, buffer, steps, writer, tag, desc, progress):
        calls.append((tag, steps, algo.impl.critic_only, buffer.transition_count, desc, progress, writer is not None))
        return {"q_loss": 1.0}

    monkeypatch.setattr(online, "make_buffer", fake_buffer)
    monkeypatch.setattr(online, "run_updates", fake_updates)
    trainer = OnlineTrainer(LosslessEnv(), config, tmp_path / "o", offline_buffer=make_buffer(offline),
                            progress=False)
    iql = trainer.algo.config
    assert (iql.actor_learning_rate, iql.critic_learning_rate, iql.weight_temp, iql.max_weight, iql.batch_size) == (
        2e-3, 5e-3, 0.7, 9.0, 4)
    assert iql.actor_encoder_factory.features == iql.critic_encoder_factory.features == ""
    assert iql.value_encoder_factory.features == ""
    assert trainer.algo.impl.policy_optim.param_groups[0]["lr"] == 2e-3
    assert len(trainer.offline_episodes) == 2 and trainer.online_episodes == [] and trainer.start_round == 0
    history = trainer.run()
    # round 1: 2 + 6 episodes, 8 transitions, 2 updates an epoch; round 2: 14 transitions, 3 an epoch capped to 2
    assert calls == [("buffer", 8, 2), ("warmup", 6, True, 8, "round 1 warm-up", False, True),
                     ("joint", 4, False, 8, "round 1 joint", False, True),
                     ("buffer", 14, 2), ("warmup", 6, True, 14, "round 2 warm-up", False, True),
                     ("joint", 4, False, 14, "round 2 joint", False, True)]
    assert [h["round"] for h in history] == [1, 2] and len(trainer.online_episodes) == 12
    assert [h["rollout_psnr"] for h in history] == [100.0, 100.0]
    assert trainer.algo.impl.critic_only is False
    assert (tmp_path / "o" / "final.safetensors").exists()
    assert (tmp_path / "o" / "checkpoints" / "0001.safetensors").exists()
    latest = json.loads((tmp_path / "o" / "latest.json").read_text())
    assert latest["index"] == 1 and [h["round"] for h in latest["history"]] == [1, 2]
    calls.clear()
    more = OnlineConfig(**{**config.__dict__, "rounds": 3})
    resumed = OnlineTrainer(LosslessEnv(), more, tmp_path / "o", offline_buffer=make_buffer(offline), progress=False)
    assert resumed.start_round == 2 and len(resumed.online_episodes) == 12
    assert [h["round"] for h in resumed.run()] == [1, 2, 3]
    assert [c[0] for c in calls] == ["buffer", "warmup", "joint"] and calls[1][4] == "round 3 warm-up"


@pytest.mark.parametrize("shared", [False, True])
def test_online_trainer_starts_from_the_offline_networks_and_their_encoders(tmp_path, shared):
    from agents.online import OnlineConfig, OnlineTrainer

    d3rlpy.seed(0)
    buffer = toy_buffer(1)
    offline = scalar_iql(batch_size=4, shared_critic_encoder=shared)
    offline.build_with_dataset(buffer)
    config = OnlineConfig(rounds=1, features="p3,mean,var", speedup_range=(1.5, 2.5))  # ignored: offline's
    trainer = OnlineTrainer(TwoStateEnv(), config, tmp_path / "o", offline_algo=offline, progress=False)
    for name in ("actor_encoder_factory", "critic_encoder_factory", "value_encoder_factory"):
        assert getattr(trainer.algo.config, name).features == ""
    assert trainer.algo.config.shared_critic_encoder == shared
    assert np.allclose(prob_of_best(trainer.algo.impl.policy), prob_of_best(offline.impl.policy))
    assert trainer.rng.integers(10**9) == np.random.default_rng(config.seed).integers(10**9)  # seeded sampling
    x = [torch.as_tensor(toy_observation(0)[k], dtype=torch.float32)[None]
         for k in ("pooled", "temporal", "scalars", "action_mask")]
    with torch.no_grad():
        assert torch.equal(trainer.algo.impl.modules.value_func(x), offline.impl.modules.value_func(x))


def test_iql_acts_row_by_row_within_each_rows_mask():
    impl, _ = iql_and_batch()
    rows = [toy_observation(s) for s in (0, 1, 0, 1, 0)]
    obs = [np.stack([r[k] for r in rows]).astype(np.float32) for k in ("pooled", "temporal", "scalars", "action_mask")]
    obs[3][:] = [[1, 0], [0, 1], [0, 1], [1, 0], [1, 0]]
    x = [torch.as_tensor(o) for o in obs]
    with torch.no_grad():
        assert impl.inner_predict_best_action(x).tolist() == [0, 1, 1, 0, 0]
        assert impl.inner_sample_action(x).tolist() == [0, 1, 1, 0, 0]
        obs[3][:] = 1
        free = [torch.as_tensor(o) for o in obs]
        assert impl.inner_predict_best_action(free).tolist() == impl.policy(free).argmax(dim=1).tolist()


def test_iql_needs_morca_observations_and_a_built_algorithm():
    from d3rlpy.constants import ActionSpace

    from agents.iql import action_mask_of

    x = [torch.zeros(2, 1), torch.zeros(2, 1), torch.zeros(2, 7), torch.ones(2, 2)]
    assert action_mask_of(x) is x[3] and action_mask_of(tuple(x)) is x[3]
    flat = torch.arange(10.0).reshape(2, 5)
    assert torch.equal(action_mask_of(flat), flat[:, :2])  # flat (gymnasium's order): the mask leads
    for bad in (x[:3], torch.zeros(2, 4, 1)):
        with pytest.raises(ValueError, match=r"DiscreteIQL needs MORCA observations: flat"):
            action_mask_of(bad)
    algo = scalar_iql()
    assert algo.get_action_type() == ActionSpace.DISCRETE
    with pytest.raises(RuntimeError, match="build the algorithm first"):
        algo.set_critic_only(True)
    algo.build_with_dataset(toy_buffer(1))
    algo.set_critic_only(1)
    assert algo.impl.critic_only is True
    algo.set_critic_only(0)
    assert algo.impl.critic_only is False
    impl, _ = iql_and_batch()
    modules = impl.modules
    assert impl.q_function is modules.q_funcs and impl.q_function_optim is modules.critic_optim.optim
    assert impl.policy is modules.policy and impl.policy_optim is modules.actor_optim.optim
