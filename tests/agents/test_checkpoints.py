"""Checkpoints cannot run code and carry a sha256 that every load verifies.

The default format is safetensors with a JSON header: it round-trips bitwise, names what reads it and what it
was trained on, and refuses a flipped byte, a truncation, another observation layout or a tampered tensor by
file name. Legacy pickles (d3rlpy `.d3`, torch `.pt`) load only when trusted, so a crafted one runs nothing.
"""

import json
import pickle
import re

import numpy as np
import pytest
import torch

from agents.checkpoint import (CheckpointError, UntrustedCheckpointError, checksum_path, convert, load_learnable,
                               load_state, read_header, save_learnable, save_state, write_checksum)
from agents.commands import convert_checkpoint
from agents.iql import DiscreteIQLConfig
from agents.networks import MorcaNetwork
from agents.policy import MorcaPolicy
from agents.reinforce import ReinforcePolicy
from morca_env import schedulers
from test_agents import quiet, synthetic_buffer


def flip(path, position):
    data = bytearray(path.read_bytes())
    data[position] ^= 0x01
    path.write_bytes(bytes(data))


def copy_with_checksum(source, path):
    path.write_bytes(source.read_bytes())
    checksum_path(path).write_text(checksum_path(source).read_text())
    return path


@pytest.fixture(scope="module")
def fitted():
    algo = DiscreteIQLConfig(batch_size=16).create(device="cpu")
    algo.fit(synthetic_buffer(), n_steps=3, n_steps_per_epoch=3, show_progress=False, save_interval=10**6,
             logger_adapter=quiet())
    return algo


@pytest.fixture(scope="module")
def iql_checkpoint(fitted, tmp_path_factory):
    return save_learnable(fitted, tmp_path_factory.mktemp("ckpt") / "iql.safetensors", training={"epochs": 3})


def observations(count=40, seed=1):
    """Observations in the tuple form with both actions feasible, so the policy decides each one."""
    episode = synthetic_buffer(seed=seed).episodes[0]
    obs = [np.asarray(o[:count]).copy() for o in episode.observations]
    rng = np.random.default_rng(seed)
    obs[2] = rng.uniform(0, 1, obs[2].shape).astype(np.float32)
    obs[3][:] = 1
    return obs


def test_the_default_checkpoint_round_trips_bitwise(fitted, iql_checkpoint):
    loaded = load_learnable(iql_checkpoint)
    assert type(loaded).__name__ == "DiscreteIQL" and loaded.config.batch_size == 16
    obs = observations()
    assert np.array_equal(loaded.predict(obs), fitted.predict(obs))
    rows = [{"pooled": obs[0][i], "temporal": obs[1][i], "scalars": obs[2][i], "action_mask": obs[3][i]}
            for i in range(len(obs[0]))]
    before, after = (torch.stack([MorcaPolicy(a).logits(row) for row in rows]) for a in (fitted, loaded))
    assert torch.equal(before, after) and len(set(before[:, 1].tolist())) == len(rows)  # bitwise, and not constant
    for name, module in fitted.impl.modules.create_checkpointer("cpu:0").modules.items():
        saved = module.state_dict()
        again = loaded.impl.modules.create_checkpointer("cpu:0").modules[name].state_dict()
        if isinstance(module, torch.nn.Module):
            assert all(torch.equal(saved[k], again[k]) for k in saved), name
        else:  # an optimizer: its moments and step counts too, so a resumed run continues exactly
            assert json.dumps(saved["optim"]["param_groups"]) == json.dumps(again["optim"]["param_groups"])
            for index, state in saved["optim"]["state"].items():
                assert all(torch.equal(v, again["optim"]["state"][index][k]) for k, v in state.items()), name
    assert checksum_path(iql_checkpoint).read_text().split()[1] == "iql.safetensors"
    header = read_header(iql_checkpoint)
    assert header["scheduler"] == "morca" and json.loads(header["training"]) == {"epochs": 3}
    assert json.loads(header["config"])["config"]["type"] == "morca_discrete_iql"
    policy = MorcaPolicy.load(iql_checkpoint)
    assert [policy(row) for row in rows] == fitted.predict(obs).tolist()


def test_a_shared_critic_encoder_round_trips_and_stays_shared(tmp_path):
    """The loaded algorithm shares its critic encoder again (its config says so), with the same Q values, V
    values and actions."""
    algo = DiscreteIQLConfig(batch_size=16, shared_critic_encoder=True).create(device="cpu")
    algo.fit(synthetic_buffer(), n_steps=3, n_steps_per_epoch=3, show_progress=False, save_interval=10**6,
             logger_adapter=quiet())
    loaded = load_learnable(save_learnable(algo, tmp_path / "shared.safetensors"))
    assert loaded.config.shared_critic_encoder
    modules = loaded.impl.modules
    assert modules.q_funcs[0].encoder is modules.q_funcs[1].encoder is modules.value_func._encoder
    obs = observations()
    assert np.array_equal(loaded.predict(obs), algo.predict(obs))
    with torch.no_grad():
        tensors = [torch.as_tensor(o) for o in obs]
        assert torch.equal(loaded.impl.q_values(tensors), algo.impl.q_values(tensors))
        assert torch.equal(modules.value_func(tensors), algo.impl.modules.value_func(tensors))


def test_a_shared_encoder_is_stored_once_and_read_back_as_separate_tensors(tmp_path):
    """IQL's critics and value list one shared encoder in each state dict: the file holds it once, and each
    entry reads back as its own tensor (an in-place update of one, an optimizer's step counter, leaves the
    others alone)."""
    algo = DiscreteIQLConfig(batch_size=16, shared_critic_encoder=True).create(device="cpu")
    algo.fit(synthetic_buffer(), n_steps=3, n_steps_per_epoch=3, show_progress=False, save_interval=10**6,
             logger_adapter=quiet())
    path = save_learnable(algo, tmp_path / "shared.safetensors", optimizers=False)
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        stored = list(f.keys())
    encoder = [k for k in stored if "_encoder." in k and k.endswith("weight")]
    assert encoder and not any(k.startswith(("state/q_funcs/1", "state/value_func")) for k in encoder)
    state = load_state(path).state
    first, second = (state["q_funcs"][f"{i}._encoder.encoder.trunk.mlp.0.weight"] for i in (0, 1))
    assert torch.equal(first, second) and first.data_ptr() != second.data_ptr()
    steps = load_state(save_state({"a": {"step": torch.tensor(3.0)}, "b": {"step": torch.tensor(3.0)}},
                                  tmp_path / "steps.safetensors", "reinforce")).state
    steps["a"]["step"] += 1
    assert steps["b"]["step"].item() == 3.0
    loaded = load_learnable(path)
    obs = observations()
    assert np.array_equal(loaded.predict(obs), algo.predict(obs))


def test_nested_state_keeps_its_types(tmp_path):
    state = {"w": torch.arange(6, dtype=torch.float16).reshape(2, 3), "opt": {0: {"step": torch.tensor(3.0)}},
             "betas": (0.9, 0.999), "history": [{"psnr": 21.5}], "baseline": None, "arr": np.arange(3),
             "count": np.int64(7)}
    loaded = load_state(save_state(state, tmp_path / "s.safetensors", "reinforce", {"lr": 1e-4})).state
    assert loaded["w"].dtype == torch.float16 and torch.equal(loaded["w"], state["w"])
    assert list(loaded["opt"]) == [0] and torch.equal(loaded["opt"][0]["step"], torch.tensor(3.0))
    assert loaded["betas"] == (0.9, 0.999) and loaded["history"] == [{"psnr": 21.5}] and loaded["baseline"] is None
    assert isinstance(loaded["arr"], np.ndarray) and loaded["arr"].tolist() == [0, 1, 2] and loaded["count"] == 7
    with pytest.raises(CheckpointError, match="state entry 'state/f' is a builtin_function_or_method"):
        save_state({"f": len}, tmp_path / "bad.safetensors", "reinforce")
    assert not (tmp_path / "bad.safetensors").exists()


@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.5, 0.75, 0.999])
def test_a_flipped_byte_anywhere_in_a_checkpoint_is_refused(iql_checkpoint, tmp_path, fraction):
    path = copy_with_checksum(iql_checkpoint, tmp_path / "iql.safetensors")
    flip(path, int(fraction * (path.stat().st_size - 1)))
    for load in (load_learnable, MorcaPolicy.load):
        with pytest.raises(CheckpointError, match=f"checkpoint {path} is damaged"):
            load(path)


def test_a_re_signed_tampered_tensor_or_another_layout_is_refused(iql_checkpoint, tmp_path, monkeypatch):
    path = copy_with_checksum(iql_checkpoint, tmp_path / "iql.safetensors")
    flip(path, path.stat().st_size - 3)  # a weight's byte, then a matching sidecar: only the header's digest knows
    write_checksum(path)
    with pytest.raises(CheckpointError, match="do not match the digest in its own header"):
        load_learnable(path)
    monkeypatch.setattr("agents.checkpoint.LAYOUT", "tuple=pooled,scalars;flat=scalars;scalars=u_t,K")
    with pytest.raises(CheckpointError, match="trained on the observation layout 'tuple=pooled,temporal"):
        load_learnable(iql_checkpoint)


def test_a_truncated_or_unsigned_checkpoint_is_refused_by_name(iql_checkpoint, tmp_path):
    path = tmp_path / "iql.safetensors"
    path.write_bytes(iql_checkpoint.read_bytes()[:1000])
    checksum_path(path).write_text(checksum_path(iql_checkpoint).read_text())
    with pytest.raises(CheckpointError, match=f"checkpoint {path} is damaged"):
        MorcaPolicy.load(path)
    checksum_path(path).unlink()
    with pytest.raises(CheckpointError, match=f"checkpoint {path} has no checksum file iql.safetensors.sha256"):
        MorcaPolicy.load(path)
    with pytest.raises(FileNotFoundError, match="missing.safetensors does not exist"):
        MorcaPolicy.load(tmp_path / "missing.safetensors")


class WritesAFile:
    """Unpickling this opens (creates) a file: a stand-in for any code a shared pickle could run."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def test_a_crafted_pickle_checkpoint_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    for name in ("evil.d3", "evil.pt", "evil.safetensors"):  # the suffix does not decide: the bytes do
        path = tmp_path / name
        path.write_bytes(pickle.dumps({"version": "2.8.1", "config": "{}", "torch": WritesAFile(marker)}))
        write_checksum(path)  # whoever shares a checkpoint shares its sidecar
        for load in (load_learnable, MorcaPolicy.load, lambda p: schedulers.make("morca", path=str(p))):
            with pytest.raises(UntrustedCheckpointError, match="is a pickle .* convert-checkpoint"):
                load(path)
        with pytest.raises(CheckpointError):  # torch's weights_only unpickler refuses the global `open`
            ReinforcePolicy.load(path)
        assert not marker.exists(), name
    with pytest.raises(CheckpointError):
        load_learnable(tmp_path / "evil.d3", trusted=True)  # trusting it runs it: the test's payload is live
    assert marker.exists()


def test_legacy_checkpoints_load_when_trusted_and_convert_to_the_safe_format(fitted, tmp_path, capsys):
    legacy = tmp_path / "final.d3"
    fitted.save(str(legacy))
    write_checksum(legacy)
    obs = observations()
    assert np.array_equal(load_learnable(legacy, trusted=True).predict(obs), fitted.predict(obs))
    assert np.array_equal(MorcaPolicy.load(legacy, trusted=True).algo.predict(obs), fitted.predict(obs))
    assert convert_checkpoint.main([str(legacy)]) == 0
    converted = tmp_path / "final.safetensors"
    assert f"-> {converted}" in capsys.readouterr().out
    assert np.array_equal(load_learnable(converted).predict(obs), fitted.predict(obs))
    assert legacy.exists()  # the original is kept
    with pytest.raises(CheckpointError, match="already in the safe format"):
        convert(converted)
    assert convert_checkpoint.main([str(converted)]) == 1

    network = MorcaNetwork(3, "policy", "p3,mean,var")
    pt = tmp_path / "reinforce.pt"
    torch.save({"network": network.state_dict(), "channels": 3, "config": {"features": "p3,mean,var"}}, pt)
    write_checksum(pt)
    safe = convert(pt)
    assert read_header(safe)["scheduler"] == "reinforce"
    for loaded in (ReinforcePolicy.load(pt), ReinforcePolicy.load(safe)):  # a plain .pt: weights only, no trust
        assert all(torch.equal(a, b) for a, b in zip(network.state_dict().values(),
                                                     loaded.network.state_dict().values()))


def test_the_registry_tells_a_morca_from_a_reinforce_checkpoint_by_its_header(iql_checkpoint, tmp_path):
    network = MorcaNetwork(3, "policy", "p3,mean,var")
    reinforce = save_state({"network": network.state_dict(), "channels": 3, "config": {"features": "p3,mean,var"}},
                           tmp_path / "r.safetensors", "reinforce")
    assert schedulers.parse_method("a", str(iql_checkpoint)) == {"name": "morca", "path": str(iql_checkpoint)}
    assert schedulers.parse_method("b", str(reinforce)) == {"name": "reinforce", "path": str(reinforce)}
    assert isinstance(schedulers.make("reinforce", path=str(reinforce)), ReinforcePolicy)
    with pytest.raises(CheckpointError, match="holds a 'reinforce' scheduler, not a d3rlpy algorithm"):
        MorcaPolicy.load(reinforce)


def test_a_flipped_byte_in_a_reinforce_checkpoint_is_refused(tmp_path):
    network = MorcaNetwork(3, "policy", "p3,mean,var")
    path = save_state({"network": network.state_dict(), "channels": 3, "config": {"features": "p3,mean,var"}},
                      tmp_path / "reinforce.safetensors", "reinforce")
    ReinforcePolicy.load(path)
    size = path.stat().st_size
    flip(path, size // 2)
    with pytest.raises(CheckpointError, match=f"checkpoint {path} is damaged"):
        ReinforcePolicy.load(path)
    flip(path, size // 2)
    assert isinstance(ReinforcePolicy.load(path).network, torch.nn.Module)


def test_a_policy_played_at_another_step_count_than_its_training_warns(fitted, tmp_path):
    import warnings

    path = save_learnable(fitted, tmp_path / "p.safetensors", training={"num_steps": 20})
    policy = MorcaPolicy.load(path)
    obs = observations()
    row = {"pooled": obs[0][0], "temporal": obs[1][0], "scalars": obs[2][0], "action_mask": obs[3][0]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        policy.reset(row, {"num_steps": 20})  # its own step count: silent
    with pytest.warns(UserWarning, match="trained on 20-step episodes and plays a 50-step one"):
        policy.reset(row, {"num_steps": 50})


@pytest.mark.parametrize("behavior", ["plain", "mixture"])
def test_a_recipe_cannot_grant_trust_so_its_pickle_runs_nothing(tmp_path, monkeypatch, capsys, behavior):
    """Trust comes from the caller: a shared collection recipe asking for `trusted` is refused before any load."""
    from morca_env.commands import collect

    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.d3"
    evil.write_bytes(pickle.dumps({"version": "2.8.1", "config": "{}", "torch": WritesAFile(marker)}))
    write_checksum(evil)
    spec = {"name": "morca", "path": str(evil), "trusted": True}
    if behavior == "mixture":
        spec = {"name": "mixture", "components": [{**spec, "weight": 1.0}]}
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({"dataset_id": "morca/test/evil-v0", "env_id": "MorcaTinyRandom-v0",
                                  "num_episodes": 1, "env_kwargs": {"num_inference_steps": 6, "lpips": False},
                                  "behavior": spec, "seed": 0}))
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    monkeypatch.setenv("MORCA_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(SystemExit):
        collect.main([str(recipe), "--workers", "1", "--num-envs", "1"])
    assert "trust comes from the person running the command" in capsys.readouterr().err
    assert not marker.exists()
    with pytest.raises(ValueError, match="trust comes from the person"):  # the Python path too
        schedulers.from_spec(spec, env=None)
    assert not marker.exists()


class Killed(BaseException):
    """A kill -9 at one rename of a save: nothing after it runs (BaseException, so no handler swallows it)."""


def test_a_save_interrupted_at_any_rename_leaves_a_pair_that_verifies(tmp_path, monkeypatch):
    """Overwriting a checkpoint in place: at every point of the save, the file matches a digest in its sidecar."""
    import morca_env.utils.io

    path = tmp_path / "reinforce.safetensors"
    save_state({"w": torch.zeros(4)}, path, "reinforce")
    real_replace = morca_env.utils.io.os.replace
    renames = []
    monkeypatch.setattr(morca_env.utils.io.os, "replace", lambda a, b: (renames.append(b), real_replace(a, b)))
    save_state({"w": torch.ones(4)}, path, "reinforce")
    assert len(renames) >= 2  # the tensors file and its sidecar at least
    for stop in range(len(renames)):
        save_state({"w": torch.zeros(4)}, path, "reinforce")
        calls = []

        def dies_at_the_stop_th_rename(a, b):
            calls.append(b)
            if len(calls) > stop:
                raise Killed
            real_replace(a, b)

        monkeypatch.setattr(morca_env.utils.io.os, "replace", dies_at_the_stop_th_rename)
        with pytest.raises(Killed):
            save_state({"w": torch.ones(4)}, path, "reinforce")
        monkeypatch.setattr(morca_env.utils.io.os, "replace", real_replace)
        weights = load_state(path).state["w"]  # the old checkpoint or the new one, never "damaged"
        assert torch.equal(weights, torch.zeros(4)) or torch.equal(weights, torch.ones(4)), stop


OVERWRITER = """
import sys, torch
from agents.checkpoint import save_state
path, i = sys.argv[1], 0
print("ready", flush=True)
while True:
    i += 1
    save_state({"w": torch.full((2048,), float(i % 2))}, path, "reinforce")
"""


@pytest.mark.slow
def test_twenty_kill_9s_during_overwrites_leave_a_loadable_checkpoint(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    path = tmp_path / "final.safetensors"
    save_state({"w": torch.zeros(2048)}, path, "reinforce")
    rng = np.random.default_rng(0)
    for kill in range(20):
        child = subprocess.Popen([sys.executable, "-c", OVERWRITER, str(path)], stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "ready"
        time.sleep(float(rng.uniform(0.05, 0.4)))  # somewhere inside one of many overwrites
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert load_state(path).state["w"].unique().numel() == 1, kill  # the old one or the new one, whole


def test_a_fifo_given_as_a_checkpoint_is_refused_without_blocking(tmp_path):
    """Reading a FIFO's header blocked forever (`morca evaluate --methods m=f.safetensors`)."""
    import os
    import subprocess
    import sys

    fifo = tmp_path / "f.safetensors"
    os.mkfifo(fifo)
    code = ("from morca_env import schedulers\n"
            f"spec = schedulers.parse_method('m', {str(fifo)!r})\n"
            "schedulers.from_spec(spec)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "is not a regular file" in out.stderr, out.stderr[-800:]


@pytest.mark.parametrize("damage", ["nan", "inf", "float16", "int8"])
def test_non_finite_or_recast_weights_with_a_valid_digest_are_refused_by_name(iql_checkpoint, tmp_path, damage):
    """A diverged run's NaN weights loaded and played "always recompute"; other dtypes were cast silently."""
    saved = load_state(iql_checkpoint)
    module = next(n for n in saved.state if not n.endswith("optim"))
    key = next(k for k, v in saved.state[module].items() if v.is_floating_point() and v.numel() > 1)
    value = saved.state[module][key].clone()
    if damage in ("nan", "inf"):
        value.view(-1)[1] = float(damage)
    else:
        value = value.to(getattr(torch, damage))
    saved.state[module][key] = value
    path = save_state(saved.state, tmp_path / "bad.safetensors", "morca", saved.config, saved.training)
    expected = "NaN or Inf" if damage in ("nan", "inf") else f"is torch.{damage}"
    with pytest.raises(CheckpointError, match=f"{module}.{key}.*{expected}"):
        load_learnable(path)
    network = MorcaNetwork(3, "policy", "p3,mean,var")
    state = network.state_dict()
    name = next(k for k, v in state.items() if v.is_floating_point() and v.numel() > 1)
    state[name] = value.new_zeros(state[name].shape) + (float(damage) if damage in ("nan", "inf") else 0)
    path = save_state({"network": state, "channels": 3, "config": {"features": "p3,mean,var"}},
                      tmp_path / "reinforce.safetensors", "reinforce")
    with pytest.raises(CheckpointError, match=f"network.{name}.*{expected}"):
        ReinforcePolicy.load(path)


def test_a_morca_checkpoint_loaded_as_reinforce_is_named(iql_checkpoint):
    """It raised KeyError: 'channels'."""
    with pytest.raises(CheckpointError, match=r"is not a REINFORCE checkpoint .* make_scheduler\('morca'"):
        ReinforcePolicy.load(iql_checkpoint)


@pytest.mark.parametrize("damage, fragment", [
    (lambda data: b"", "is empty (0 bytes)"),
    (lambda data: (10**9).to_bytes(8, "little") + data[8:], "is a damaged safetensors file: its header claims "
                                                             "1000000000 bytes"),
    (lambda data: b"hello world, not a checkpoint", "is neither a safetensors checkpoint nor a pickle"),
])
def test_a_damaged_or_foreign_file_is_not_called_a_pickle(tmp_path, damage, fragment):
    path = save_state({"w": torch.ones(3)}, tmp_path / "c.safetensors", "reinforce")
    path.write_bytes(damage(path.read_bytes()))
    write_checksum(path)  # intact as far as its sidecar knows: what is refused is the content
    with pytest.raises(CheckpointError, match=re.escape(fragment)) as caught:
        load_state(path)
    assert not isinstance(caught.value, UntrustedCheckpointError) and "trusted=True" not in str(caught.value)


def test_a_header_nested_past_the_stack_is_a_malformed_header_by_name(tmp_path):
    from safetensors.torch import load_file, save_file

    path = save_state({"w": torch.ones(3)}, tmp_path / "c.safetensors", "reinforce")
    header = read_header(path)
    header["state"] = "[" * 100_000 + "]" * 100_000
    save_file(load_file(str(path)), str(path), metadata=header)
    write_checksum(path)
    with pytest.raises(CheckpointError, match=f"checkpoint {path} has a malformed header: RecursionError"):
        load_state(path)


def test_a_checkpoint_for_other_observation_shapes_is_refused_before_the_first_step(iql_checkpoint):
    policy = MorcaPolicy.load(iql_checkpoint)
    shapes = [tuple(s) for s in policy.algo.impl.observation_shape]
    obs = {"pooled": np.ones((shapes[0][0], shapes[0][1], 4, 4), np.float32),  # another resolution
           "temporal": np.ones(shapes[1], np.float32), "scalars": np.zeros(shapes[2], np.float32),
           "action_mask": np.ones(2, np.int8)}
    with pytest.raises(ValueError, match=re.escape(f"checkpoint {iql_checkpoint} was trained on observations of "
                                                   "shapes")):
        policy.reset(obs, {"budget": 3, "num_steps": 10})
    obs["pooled"] = np.ones(shapes[0], np.float32)
    policy.reset(obs, {"budget": 3, "num_steps": 10})  # its own shapes: accepted
