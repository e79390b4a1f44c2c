"""Checkpoints carry a sha256 that every load verifies: a flipped byte or a truncation is refused by file name."""

import numpy as np
import pytest
import torch

from agents.checkpoint import CheckpointError, checksum_path, load_learnable, save_learnable, save_torch
from agents.iql import DiscreteIQLConfig
from agents.networks import MorcaNetwork
from agents.policy import MorcaPolicy
from agents.reinforce import ReinforcePolicy
from test_agents import quiet, synthetic_buffer


def flip(path, position):
    data = bytearray(path.read_bytes())
    data[position] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def iql_checkpoint(tmp_path_factory):
    algo = DiscreteIQLConfig(batch_size=16).create(device="cpu")
    algo.fit(synthetic_buffer(), n_steps=2, n_steps_per_epoch=2, show_progress=False, save_interval=10**6,
             logger_adapter=quiet())
    path = tmp_path_factory.mktemp("ckpt") / "iql.d3"
    save_learnable(algo, path)
    return path


def test_checkpoint_round_trips_with_its_checksum(iql_checkpoint):
    assert checksum_path(iql_checkpoint).read_text().split()[1] == "iql.d3"
    assert type(load_learnable(iql_checkpoint)).__name__ == "DiscreteIQL"
    assert MorcaPolicy.load(iql_checkpoint).algo is not None


@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.5, 0.75, 0.999])
def test_a_flipped_byte_anywhere_in_a_d3_checkpoint_is_refused(iql_checkpoint, tmp_path, fraction):
    path = tmp_path / "iql.d3"
    path.write_bytes(iql_checkpoint.read_bytes())
    checksum_path(path).write_text(checksum_path(iql_checkpoint).read_text())
    flip(path, int(fraction * (path.stat().st_size - 1)))
    for load in (load_learnable, MorcaPolicy.load):
        with pytest.raises(CheckpointError, match=f"checkpoint {path} is damaged"):
            load(path)


def test_a_truncated_or_unsigned_checkpoint_is_refused_by_name(iql_checkpoint, tmp_path):
    path = tmp_path / "iql.d3"
    path.write_bytes(iql_checkpoint.read_bytes()[:1000])
    checksum_path(path).write_text(checksum_path(iql_checkpoint).read_text())
    with pytest.raises(CheckpointError, match=f"checkpoint {path} is damaged"):
        MorcaPolicy.load(path)
    checksum_path(path).unlink()
    with pytest.raises(CheckpointError, match=f"checkpoint {path} has no checksum file iql.d3.sha256"):
        MorcaPolicy.load(path)
    with pytest.raises(FileNotFoundError, match="missing.d3 does not exist"):
        MorcaPolicy.load(tmp_path / "missing.d3")


def test_a_flipped_byte_in_a_reinforce_checkpoint_is_refused(tmp_path):
    network = MorcaNetwork(3, "policy", "p3,mean,var")
    path = save_torch({"network": network.state_dict(), "channels": 3, "config": {"features": "p3,mean,var"}},
                      tmp_path / "reinforce.pt")
    ReinforcePolicy.load(path)
    size = path.stat().st_size
    flip(path, size // 2)
    with pytest.raises(CheckpointError, match=f"checkpoint {path} is damaged"):
        ReinforcePolicy.load(path)
    flip(path, size // 2)
    assert isinstance(ReinforcePolicy.load(path).network, torch.nn.Module)
