import dataclasses
import subprocess
import sys

import d3rlpy
import json

import numpy as np
import pytest
import torch
from d3rlpy.constants import ActionSpace
from d3rlpy.dataset import Episode, InfiniteBuffer, ReplayBuffer

import agents
from agents.iql import DiscreteIQLConfig
from agents.networks import MorcaEncoderFactory, MorcaNetwork, parse_features
from agents.policy import MorcaPolicy, observation_batch

C = 2  # latent channels of the synthetic observations


def synthetic_episode(rng, n=8, forced_last=True):
    masks = np.ones((n, 2), np.float32)
    masks[0] = [1, 0]  # forced recompute
    if forced_last:
        masks[-1] = [1, 0]
    actions = np.where(masks[:, 1] > 0, rng.integers(0, 2, n), 0)
    obs = [rng.normal(size=(n, 3 * C, 4, 8, 8)).astype(np.float32), rng.normal(size=(n, 6 * C, 8, 8)).astype(np.float32),
           rng.uniform(size=(n, 7)).astype(np.float32), masks]
    rewards = np.zeros((n, 1), np.float32)
    rewards[-1] = 20 + 10 * actions.mean()
    return Episode(observations=obs, actions=actions.reshape(n, 1), rewards=rewards, terminated=True)


def synthetic_buffer(episodes=6, seed=0):
    rng = np.random.default_rng(seed)
    return ReplayBuffer(InfiniteBuffer(), episodes=[synthetic_episode(rng) for _ in range(episodes)],
                        action_space=ActionSpace.DISCRETE, action_size=2)


def play_feasible_episode(env, policy, seed: int) -> dict:
    """One episode of `policy`; every action it takes must be feasible (none projected). -> the last info."""
    obs, info = env.reset(seed=seed)
    policy.reset(obs, info)
    done = False
    while not done:
        obs, _, done, _, info = env.step(policy(obs))
        assert not info["projected"]
    return info


def quiet():
    return d3rlpy.logging.NoopAdapterFactory()


@pytest.mark.parametrize("features,shape3d", [("p3,mean,var", True), ("p3", True), ("mean", False), ("", False)])
def test_network_variants_and_heads(features, shape3d):
    x = [torch.randn(4, 3 * C, 4, 8, 8), torch.randn(4, 6 * C, 8, 8), torch.randn(4, 7)]
    for head, size in (("policy", 2), ("q", 2), ("v", 1)):
        net = MorcaNetwork(C, head=head, features=features)
        assert net(*x).shape == (4, size)
        assert (net.trunk.branch3d is not None) == shape3d
    mask = torch.tensor([[1, 0], [0, 1], [1, 1], [1, 0]])
    logits = MorcaNetwork(C, "policy")(*x, action_mask=mask)
    assert torch.equal(logits.argmax(1)[:2], torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="unknown latent features"):
        parse_features("p3,colour")


def test_paper_sizes_for_wan_channels():
    net = MorcaNetwork(16)
    x = [torch.randn(1, 48, 4, 8, 8), torch.randn(1, 96, 8, 8), torch.randn(1, 7)]
    assert net.trunk.branch3d(x[0]).shape == (1, 512)
    assert net.trunk.branch2d(x[1]).shape == (1, 256)
    assert net.trunk.project[0].in_features == 768 and net.trunk.mlp[0].in_features == 135


def test_forced_transitions_contribute_nothing_to_the_policy_gradient():
    buffer = synthetic_buffer()
    algo = DiscreteIQLConfig(batch_size=16).create(device="cpu")
    algo.build_with_dataset(buffer)
    impl = algo.impl
    batch = buffer.sample_transition_batch(48)
    from d3rlpy.torch_utility import TorchMiniBatch

    def policy_grad(torch_batch):
        impl.modules.policy.zero_grad()
        loss, _ = impl.actor_loss(torch_batch)
        loss.backward()
        return torch.cat([p.grad.flatten() for p in impl.modules.policy.parameters() if p.grad is not None])

    full = TorchMiniBatch.from_batch(batch, 1.0, False, "cpu")
    forced = (full.observations[3].sum(1) < 1.5)
    assert forced.any() and (~forced).any()
    altered = TorchMiniBatch.from_batch(batch, 1.0, False, "cpu")
    altered.actions[forced] = 1 - altered.actions[forced]  # change what the forced transitions say
    altered.observations[0][forced] += 5.0
    assert torch.allclose(policy_grad(full), policy_grad(altered), atol=1e-6)

    only_forced = TorchMiniBatch.from_batch(batch, 1.0, False, "cpu")
    only_forced.observations[3][:] = torch.tensor([1.0, 0.0])
    loss, extra = impl.actor_loss(only_forced)
    assert float(loss) == 0.0 and extra["free_fraction"] == 0.0


def test_predictions_respect_the_mask_and_fit_runs():
    buffer = synthetic_buffer()
    algo = DiscreteIQLConfig(batch_size=16).create(device="cpu")
    algo.fit(buffer, n_steps=20, n_steps_per_epoch=20, show_progress=False, save_interval=10**6, logger_adapter=quiet())
    ep = buffer.episodes[0]
    for only in ([1, 0], [0, 1]):
        obs = [o[:5].copy() for o in ep.observations]
        obs[3][:] = only
        assert np.all(algo.predict(obs) == only.index(1))
        assert np.all(algo.sample_action(obs) == only.index(1))


def test_save_load_round_trip_in_a_fresh_process(tmp_path):
    """A fresh process rebuilds the algorithm from the safe checkpoint's JSON config alone (import agents
    registers our config and encoder with d3rlpy) and acts as the saved one did."""
    from agents.checkpoint import save_learnable

    buffer = synthetic_buffer()
    algo = DiscreteIQLConfig(batch_size=16, weight_temp=1.25).create(device="cpu")
    algo.fit(buffer, n_steps=5, n_steps_per_epoch=5, show_progress=False, save_interval=10**6, logger_adapter=quiet())
    path = save_learnable(algo, tmp_path / "iql.safetensors")
    obs = [o[:3] for o in buffer.episodes[1].observations]
    np.savez(tmp_path / "obs.npz", *obs)
    expected = algo.predict(obs)
    code = ("import numpy as np, agents; from agents.checkpoint import load_learnable; a = load_learnable(%r); "
            "f = np.load(%r); obs = [f[f'arr_{i}'] for i in range(4)]; print(type(a).__name__, a.config.weight_temp, "
            "''.join(map(str, a.predict(obs))))") % (str(path), str(tmp_path / "obs.npz"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-3:] == ["DiscreteIQL", "1.25", "".join(map(str, expected))]


def test_plain_policy_on_env_observations(tmp_path):
    import gymnasium as gym

    import morca_env  # noqa: F401

    env = gym.make("MorcaTinyRandom-v0", budget=6, num_inference_steps=10, lpips=False,
                   reference_cache_dir=str(tmp_path))
    obs, info = env.reset(seed=0)
    batch = observation_batch(obs)
    assert [b.shape for b in batch] == [(1, 9, 4, 8, 8), (1, 18, 8, 8), (1, 7), (1, 2)]
    buffer = ReplayBuffer(InfiniteBuffer(), episodes=[Episode(
        observations=[np.repeat(b, 2, 0) for b in batch], actions=np.zeros((2, 1)), rewards=np.zeros((2, 1)),
        terminated=True)], action_space=ActionSpace.DISCRETE, action_size=2)
    algo = DiscreteIQLConfig(batch_size=2).create(device="cpu")
    algo.build_with_dataset(buffer)
    direct = MorcaPolicy(algo)
    assert direct._network is not None  # the fast path calls the network, d3rlpy's predict is the reference
    for scale in (0.0, 1.0, 10.0):
        varied = {**obs, "scalars": obs["scalars"] * 0 + scale, "action_mask": np.array([1, 1], np.int8)}
        assert direct(varied) == int(algo.predict(observation_batch(varied))[0])
    for deterministic in (True, False):
        policy = MorcaPolicy(algo, deterministic=deterministic)
        assert play_feasible_episode(env, policy, seed=1)["num_reuse"] == 6


@pytest.mark.filterwarnings("error:Converting a tensor with requires_grad=True to a scalar:UserWarning")
def test_online_round_and_reinforce_update_run_and_resume(tmp_path):
    import gymnasium as gym

    import morca_env  # noqa: F401
    from agents.online import OnlineConfig, OnlineTrainer
    from agents.reinforce import Reinforce, ReinforceConfig, ReinforcePolicy

    env = gym.make("MorcaTinyRandom-v0", num_inference_steps=8, lpips=False, reference_cache_dir=str(tmp_path / "r"))
    config = OnlineConfig(rounds=2, trajectories_per_round=2, warmup_epochs=1, joint_epochs=1, batch_size=8,
                          speedup_range=(1.5, 2.5), max_steps_per_epoch=2)
    trainer = OnlineTrainer(env, config, tmp_path / "online", progress=False)  # online IQL from scratch
    points = []  # a learning curve's points: one per round, at the online episodes so far
    history = trainer.run(on_round=lambda algo, count: points.append((algo is trainer.algo, count)))
    assert [h["round"] for h in history] == [1, 2] and history[-1]["transitions"] == 4 * 8
    assert points == [(True, 2), (True, 4)]
    assert (tmp_path / "online" / "final.safetensors").exists()
    resumed = OnlineTrainer(env, OnlineConfig(**{**config.__dict__, "rounds": 3}), tmp_path / "online", progress=False)
    assert resumed.start_round == 2 and len(resumed.online_episodes) == 4
    assert resumed.run(on_round=lambda algo, count: points.append(count))[-1]["round"] == 3
    assert points[2:] == [6]  # the resumed run's own round only

    def stop(*_):
        raise KeyboardInterrupt  # the board stops while a round's point is measured

    four = OnlineConfig(**{**config.__dict__, "rounds": 4})
    with pytest.raises(KeyboardInterrupt):
        OnlineTrainer(env, four, tmp_path / "online", progress=False).run(on_round=stop)
    assert OnlineTrainer(env, four, tmp_path / "online", progress=False).start_round == 3  # the round is redone

    reinforce = Reinforce(env, ReinforceConfig(episodes_per_update=2, total_episodes=6, speedup_range=(1.5, 2.5)),
                          tmp_path / "reinforce", progress=False)
    before = [p.detach().clone() for p in reinforce.network.parameters()]
    curve = []
    assert len(reinforce.train(checkpoints=(1, 2, 5, 6), on_checkpoint=lambda policy, count: curve.append(
        (isinstance(policy, ReinforcePolicy), count)))) == 3
    assert curve == [(True, 2), (True, 6)]  # 1 and 2 fall in the first update, 5 and 6 in the last
    eight = ReinforceConfig(episodes_per_update=2, total_episodes=8, speedup_range=(1.5, 2.5))
    with pytest.raises(KeyboardInterrupt):
        Reinforce(env, eight, tmp_path / "reinforce", progress=False).train(checkpoints=(8,), on_checkpoint=stop)
    assert Reinforce(env, eight, tmp_path / "reinforce", progress=False).episodes_done == 6  # the update is redone
    assert any(not torch.equal(a, b) for a, b in zip(before, reinforce.network.parameters()))
    policy = ReinforcePolicy.load(tmp_path / "reinforce" / "reinforce.safetensors")
    obs, info = env.reset(seed=0)
    done = False
    while not done:
        obs, _, done, _, info = env.step(policy(obs))
        assert not info["projected"]

    # a damaged checkpoint stops a resume with its name, never trains on from garbage
    from agents.checkpoint import CheckpointError

    for path, resume in ((tmp_path / "online" / "checkpoints" / "0002.safetensors",
                          lambda: OnlineTrainer(env, config, tmp_path / "online", progress=False)),
                         (tmp_path / "reinforce" / "reinforce.safetensors",
                          lambda: Reinforce(env, ReinforceConfig(), tmp_path / "reinforce", progress=False))):
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 1
        path.write_bytes(bytes(data))
        with pytest.raises(CheckpointError, match=f"checkpoint {path} is damaged"):
            resume()


def test_online_from_scratch_takes_the_feature_ablation(tmp_path):
    import gymnasium as gym

    import morca_env  # noqa: F401
    from agents.online import OnlineConfig, OnlineTrainer

    env = gym.make("MorcaTinyRandom-v0", num_inference_steps=8, lpips=False, reference_cache_dir=str(tmp_path / "r"))
    trainer = OnlineTrainer(env, OnlineConfig(rounds=1, trajectories_per_round=1, features=""), tmp_path / "o",
                            progress=False)
    trunk = trainer.algo.impl.policy._encoder.trunk
    assert trunk.branch3d is None and trunk.branch2d is None  # scalars only
    with pytest.raises(ValueError, match=r"unknown latent features \['colour'\]"):
        OnlineConfig(features="p3,colour")


def test_policies_that_read_latents_refuse_an_env_without_them(tmp_path):
    import gymnasium as gym

    import morca_env  # noqa: F401
    from agents.networks import MorcaEncoderFactory

    env = gym.make("MorcaTinyRandom-v0", budget=4, num_inference_steps=10, lpips=False, latent_features=False,
                   reference_cache_dir=str(tmp_path))
    obs, info = env.reset(seed=0)
    for features, reads in (("p3,mean,var", True), ("", False)):
        factory = MorcaEncoderFactory(features=features)
        algo = DiscreteIQLConfig(batch_size=2, actor_encoder_factory=factory, critic_encoder_factory=factory,
                                 value_encoder_factory=factory).create(device="cpu")
        algo.build_with_dataset(synthetic_buffer(1))
        policy = MorcaPolicy(algo)
        assert policy.reads_latents is reads
        if reads:
            with pytest.raises(ValueError, match="latent_features=False"):
                policy.reset(obs, info)
        else:
            policy.reset(obs, info)
            assert policy(obs) in (0, 1)


@pytest.mark.parametrize("features", ["p3,mean,var", ""])
def test_fast_policy_picks_what_d3rlpy_predict_picks(features):
    """MorcaPolicy's fast path (no network for a single feasible action, no latent inputs for a scalar-state
    network, logits compared in Python) decides exactly as d3rlpy's masked predict on many observations."""
    factory = MorcaEncoderFactory(features=features)
    algo = DiscreteIQLConfig(batch_size=2, actor_encoder_factory=factory, critic_encoder_factory=factory,
                             value_encoder_factory=factory).create(device="cpu")
    algo.build_with_dataset(synthetic_buffer(1))
    rng = np.random.default_rng(3)
    observations = []
    for i in range(60):
        mask = np.array([[1, 1], [1, 0], [0, 1]][i % 3], np.int8) if i % 4 == 0 else np.ones(2, np.int8)
        observations.append({"pooled": rng.normal(size=(3 * C, 4, 8, 8)).astype(np.float32),
                             "temporal": rng.normal(size=(6 * C, 8, 8)).astype(np.float32),
                             "scalars": rng.uniform(size=7).astype(np.float32), "action_mask": mask})
    network = algo.impl.policy
    with torch.no_grad():  # centre the logit gap on these observations: a policy that is not one constant action
        gaps = [float(np.diff(network([torch.from_numpy(x) for x in observation_batch({**o, "action_mask": np.ones(2)})])
                              .numpy()[0])[0]) for o in observations]
        network._fc.bias[1] -= float(np.median(gaps))
    policy = MorcaPolicy(algo)
    free_picks = []
    for i, obs in enumerate(observations):
        expected = int(algo.predict(observation_batch(obs))[0])
        assert policy(obs) == expected, (i, obs["action_mask"])
        if obs["action_mask"].all():
            free_picks.append(expected)
    assert 0 < sum(free_picks) < len(free_picks)  # the network chose both actions: the comparison could fail


def test_fast_policy_skips_the_network_when_one_action_is_feasible():
    algo = DiscreteIQLConfig(batch_size=2).create(device="cpu")
    algo.build_with_dataset(synthetic_buffer(1))
    policy = MorcaPolicy(algo)
    calls = []
    policy._network.register_forward_pre_hook(lambda module, args: calls.append(1))
    obs = {"pooled": np.ones((3 * C, 4, 8, 8), np.float32), "temporal": np.ones((6 * C, 8, 8), np.float32),
           "scalars": np.full(7, 0.5, np.float32)}
    assert policy({**obs, "action_mask": np.array([1, 0], np.int8)}) == 0
    assert policy({**obs, "action_mask": np.array([0, 1], np.int8)}) == 1
    assert not calls
    policy({**obs, "action_mask": np.array([1, 1], np.int8)})
    assert calls == [1]


def _scalar_algo(seed: int):
    d3rlpy.seed(seed)
    factory = MorcaEncoderFactory(features="")
    algo = DiscreteIQLConfig(batch_size=2, actor_encoder_factory=factory, critic_encoder_factory=factory,
                             value_encoder_factory=factory).create(device="cpu")
    algo.build_with_dataset(synthetic_buffer(1))
    return algo


def _set_gap(algo, obs, gap: float) -> None:
    """Shift the reuse logit so that (reuse - recompute) is `gap` on `obs`."""
    policy = MorcaPolicy(algo)
    with torch.no_grad():
        recompute, reuse = policy.logits(obs).tolist()
        algo.impl.policy._fc.bias[1] += gap - (reuse - recompute)


def test_ensemble_follows_the_mean_log_probability_not_the_vote():
    from agents import MorcaEnsemble

    obs = {"pooled": np.zeros((3 * C, 4, 8, 8), np.float32), "temporal": np.zeros((6 * C, 8, 8), np.float32),
           "scalars": np.full(7, 0.3, np.float32), "action_mask": np.ones(2, np.int8)}
    algos = [_scalar_algo(seed) for seed in range(3)]
    # (reuse - recompute) logit gaps per member -> the ensemble's action. A majority vote gets the first two wrong,
    # a mean of the probabilities the last two: (0.95 + 2 x 0.27) / 3 < 0.5, (0.05 + 2 x 0.73) / 3 > 0.5
    for gaps, expected in (([5.0, -0.5, -0.5], 1), ([3.0, -1.0, -1.0], 1), ([-3.0, 1.0, 1.0], 0)):
        for algo, gap in zip(algos, gaps):
            _set_gap(algo, obs, gap)
        members = [MorcaPolicy(a) for a in algos]
        assert [m(obs) for m in members] == [int(g > 0) for g in gaps]
        assert MorcaEnsemble(members)(obs) == expected, gaps
    ensemble = MorcaEnsemble([MorcaPolicy(a) for a in algos])
    assert ensemble({**obs, "action_mask": np.array([0, 1], np.int8)}) == 1  # a single feasible action is taken
    assert ensemble({**obs, "action_mask": np.array([1, 0], np.int8)}) == 0
    with pytest.raises(ValueError, match="at least 2 members, got 1"):
        MorcaEnsemble([MorcaPolicy(algos[0])])


def test_ensemble_loads_from_the_registry_and_plays_an_episode(tmp_path):
    import gymnasium as gym

    import morca_env  # noqa: F401
    from agents import MorcaEnsemble
    from agents.checkpoint import save_learnable
    from morca_env import schedulers

    paths = [str(save_learnable(_scalar_algo(seed), tmp_path / f"s{seed}.safetensors")) for seed in range(2)]
    assert isinstance(schedulers.make("morca", path=paths[0]), MorcaPolicy)
    ensemble = schedulers.make("morca", path=",".join(paths))
    assert isinstance(ensemble, MorcaEnsemble) and len(ensemble.members) == 2
    assert len(schedulers.make("morca", path=paths).members) == 2
    assert schedulers.checkpoint_paths(f"{paths[0]}, {paths[1]}") == paths
    with pytest.raises(ValueError, match="separated by commas"):
        schedulers.make("morca", path=paths[0] + ",")
    env = gym.make("MorcaTinyRandom-v0", budget=5, num_inference_steps=10, lpips=False, latent_features=False,
                   reference_cache_dir=str(tmp_path))
    assert play_feasible_episode(env, ensemble, seed=0)["num_reuse"] == 5


def test_pace_pulls_the_policy_toward_an_even_spend_of_the_budget():
    from agents.policy import reuses_ahead
    from morca_env.observation import Scalar

    def obs_at(taken: float, reused: float, budget: float = 0.5):
        scalars = np.zeros(7, np.float32)
        scalars[Scalar.t], scalars[Scalar.u_t], scalars[Scalar.K] = 1.0 - taken, reused, budget
        return {"pooled": np.zeros((3 * C, 4, 8, 8), np.float32), "temporal": np.zeros((6 * C, 8, 8), np.float32),
                "scalars": scalars, "action_mask": np.ones(2, np.int8)}

    assert reuses_ahead(obs_at(0.4, 0.2)) == pytest.approx(0.0, abs=1e-6)  # 40% of the steps, 40% of the budget
    assert reuses_ahead(obs_at(0.4, 0.3)) == pytest.approx(0.2)  # a fifth of the budget ahead
    assert reuses_ahead(obs_at(0.4, 0.1)) == pytest.approx(-0.2)
    algo = _scalar_algo(0)
    ahead, behind = obs_at(0.4, 0.3), obs_at(0.4, 0.1)
    for obs in (ahead, behind):  # the network alone: level between the actions, slightly for reuse
        _set_gap(algo, obs, 0.5)
        assert MorcaPolicy(algo)(obs) == 1
    assert MorcaPolicy(algo, pace=10.0)(ahead) == 0  # 0.5 - 10 x 0.2 < 0: ahead of the budget, recompute
    assert MorcaPolicy(algo, pace=10.0)(behind) == 1
    _set_gap(algo, behind, -1.0)
    assert MorcaPolicy(algo)(behind) == 0 and MorcaPolicy(algo, pace=10.0)(behind) == 1  # behind: catch up
    with pytest.raises(ValueError, match="pace=-1.0 must be >= 0"):
        MorcaPolicy(algo, pace=-1.0)


def test_offline_trainer_checkpoints_every_epoch_and_resumes_where_it_stopped(tmp_path):
    """Stopped after 2 of 3 epochs, a new trainer continues at epoch 3 from the last checkpoint's weights."""
    from agents import OfflineConfig, OfflineTrainer
    from agents.checkpoint import load_learnable

    d3rlpy.seed(0)
    config = OfflineConfig(epochs=2, batch_size=4, features="", max_steps_per_epoch=3)
    OfflineTrainer(synthetic_buffer(4), config, tmp_path).run()
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("*.safetensors")) == ["0000.safetensors",
                                                                                       "0001.safetensors"]
    after_two = load_learnable(tmp_path / "final.safetensors").impl.policy.state_dict()
    from agents.checkpoint import read_header

    training = json.loads(read_header(tmp_path / "final.safetensors")["training"])
    assert training["trainer"] == "offline" and training["num_steps"] == len(synthetic_buffer(4).episodes[0].rewards)
    resumed = OfflineTrainer(synthetic_buffer(4), dataclasses.replace(config, epochs=3), tmp_path)
    assert resumed.resume() == 2
    loaded = resumed.algo.impl.policy.state_dict()
    assert all(torch.equal(loaded[k], after_two[k]) for k in after_two)  # the weights of epoch 2, not fresh ones
    resumed.run()
    assert (tmp_path / "checkpoints" / "0002.safetensors").exists()
    assert not (tmp_path / "checkpoints" / "0003.safetensors").exists()
    with pytest.raises(ValueError, match="epochs=0 must be a positive integer"):
        OfflineConfig(epochs=0)
    assert not config.create().config.shared_critic_encoder  # the paper's four networks by default
    assert OfflineConfig(shared_critic_encoder=True).create().config.shared_critic_encoder


@pytest.mark.parametrize("config", ["DiscreteCQLConfig", "DiscreteBCConfig"])
def test_any_fitted_discrete_d3rlpy_algorithm_schedules_through_morca_policy(config, tmp_path, monkeypatch):
    """D3rlpy's own algorithms raise NotImplementedError for `impl.policy`, which made MorcaPolicy's
    foreign-algorithm path dead code. Trained on the default (flat) buffer, each now plays feasible, exact-K
    episodes through its public predict()."""
    import gymnasium as gym

    from morca_env.data import collect_dataset, to_replay_buffer

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    monkeypatch.setenv("MORCA_CACHE_DIR", str(tmp_path / "cache"))
    kwargs = {"num_inference_steps": 8, "lpips": False, "speedup": 2.0}
    dataset = collect_dataset("test/tiny/foreign-v0", "MorcaTinyRandom-v0", 2, env_kwargs=kwargs, behavior="random",
                              progress=False)
    algo = getattr(d3rlpy.algos, config)(batch_size=4).create(device="cpu")
    algo.fit(to_replay_buffer(dataset), n_steps=2, n_steps_per_epoch=2, show_progress=False, logger_adapter=quiet())
    policy = MorcaPolicy(algo)
    assert policy._network is None and policy.flat  # the predict() path, on flat observations
    env = gym.make("MorcaTinyRandom-v0", budget=3, **{k: v for k, v in kwargs.items() if k != "speedup"},
                   reference_cache_dir=str(tmp_path / "refs"))
    for seed in (0, 1):
        info = play_feasible_episode(env, policy, seed)
        assert sum(info["schedule"]) == 3
    with pytest.raises(ValueError, match="has no networks yet"):
        MorcaPolicy(getattr(d3rlpy.algos, config)().create(device="cpu"))


def test_a_learned_scheduler_drives_a_batched_accelerate_call_as_separate_calls():
    """`accelerate` with 4 prompts (and with num_videos_per_prompt=2) equals the separate calls for a
    learned scheduler too: each video gets its own copy of the policy, its own K and its own decisions."""
    import morca_env
    from tests.conftest import make_pipe, prompt_embeds
    from tests.envs.test_accelerate import assert_videos_equal_separate_calls, batched_call, separate_call

    algo = _scalar_algo(0)
    pipe = make_pipe("wan21", channels=C, with_text_encoder=False, with_vae=True)
    embeds, seeds, budgets = [prompt_embeds(seed) for seed in range(4)], [20, 21, 22, 23], [2, 4, 6, 8]
    batch = morca_env.accelerate(pipe, MorcaPolicy(algo), budget=budgets, **batched_call(pipe, embeds, seeds))
    separate = [morca_env.accelerate(pipe, MorcaPolicy(algo), budget=k, **separate_call(pipe, e, s))
                for e, s, k in zip(embeds, seeds, budgets)]
    assert_videos_equal_separate_calls(batch, separate, budgets)
    per_prompt = morca_env.accelerate(pipe, MorcaPolicy(algo), budget=[3, 7], num_videos_per_prompt=2,
                                      **batched_call(pipe, embeds[:1], seeds[:2]))
    separate = [morca_env.accelerate(pipe, MorcaPolicy(algo), budget=k, **separate_call(pipe, embeds[0], s))
                for s, k in zip(seeds[:2], (3, 7))]
    assert_videos_equal_separate_calls(per_prompt, separate, [3, 7])


def test_online_and_reinforce_rollouts_play_in_batches_of_the_same_episodes(tmp_path):
    """On a MorcaVectorEnv the trainers draw the same (prompt, seed, target) per episode as on the single env and
    play them num_envs at a time (a short last batch padded and dropped); every episode keeps its exact K."""
    import gymnasium as gym

    import morca_env  # noqa: F401
    from agents.online import OnlineConfig, OnlineTrainer
    from agents.reinforce import Reinforce, ReinforceConfig

    kwargs = dict(num_inference_steps=8, lpips=False, reference_cache_dir=str(tmp_path / "r"))
    single = gym.make("MorcaTinyRandom-v0", **kwargs)
    batched = gym.make_vec("MorcaTinyRandom-v0", num_envs=3, **kwargs)
    config = OnlineConfig(rounds=1, trajectories_per_round=4, batch_size=8, speedup_range=(1.5, 2.5))
    plans = []
    for env, name in ((single, "single"), (batched, "batched")):
        episodes, infos = OnlineTrainer(env, config, tmp_path / name, progress=False).collect(4)
        assert len(episodes) == 4 and all(sum(i["schedule"]) == i["budget"] for i in infos)
        assert all(len(e.actions) == 8 for e in episodes)
        plans.append([(i["prompt"], i["seed"], i["budget"]) for i in infos])
    assert plans[0] == plans[1]
    sampled = []
    for env, name in ((single, "single-r"), (batched, "batched-r")):
        trainer = Reinforce(env, ReinforceConfig(speedup_range=(1.5, 2.5)), tmp_path / name, progress=False)
        episodes = trainer.sample_episodes(5)
        assert all(sum(actions) == info["budget"] for _, actions, _, info in episodes)
        sampled.append([(info["prompt"], info["seed"], info["budget"]) for *_, info in episodes])
    assert sampled[0] == sampled[1]
