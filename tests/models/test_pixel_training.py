"""Training the packaged pixel models: settings checked, runs resumable to the bit, interruptions lose nothing."""

import json
import os
import signal

import pytest
import torch

from morca_env.models import pixel_model, scenes, scenes_data
from morca_env.models.training import TrainConfig, lr_at, train

CONFIG = TrainConfig(steps=4, batch_size=2, warmup=1, checkpoint_every=2)


class InterruptingWorld:
    """scenes_data, but the `at`-th batch sends this process SIGTERM while it renders (mid-step)."""

    def __init__(self, at: int):
        self.calls, self.at = 0, at
        self.training_scenes = scenes_data.training_scenes

    def render(self, batch, generator):
        self.calls += 1
        if self.calls == self.at:
            os.kill(os.getpid(), signal.SIGTERM)
        return scenes_data.render(batch, generator)


def _weights(directory):
    pipe = pixel_model.load(scenes.MODEL, directory=directory)
    return {**pipe.transformer.state_dict(), **{f"text.{k}": v for k, v in pipe.text_encoder.state_dict().items()}}


def test_an_interrupted_run_resumes_to_the_same_weights(tmp_path):
    torch.set_num_threads(1)
    straight = train(scenes.MODEL, scenes_data, CONFIG, tmp_path / "a", tmp_path / "wa", progress=False)
    with pytest.raises(KeyboardInterrupt):
        # SIGTERM arrives inside step 3's rendering: that step completes, and the checkpoint is written after it
        train(scenes.MODEL, InterruptingWorld(at=3), CONFIG, tmp_path / "b", tmp_path / "wb", progress=False)
    state = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)
    assert int(state["step"]) == 3 and not (tmp_path / "wb").exists()
    resumed = train(scenes.MODEL, scenes_data, CONFIG, tmp_path / "b", tmp_path / "wb", resume=True, progress=False)
    a, b = _weights(tmp_path / "wa"), _weights(tmp_path / "wb")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert straight["final_loss_mean_last_100"] is not None and resumed["steps"] == 4
    steps = [json.loads(line)["step"] for line in (tmp_path / "b" / "loss.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps))  # the redone steps are not logged twice
    manifest = json.loads((tmp_path / "wb" / pixel_model.MANIFEST).read_text())
    assert manifest["model"] == "morca-scenes-v0" and manifest["training"]["steps"] == 4


def test_a_run_dir_is_never_overwritten_and_a_resume_keeps_its_settings(tmp_path):
    torch.set_num_threads(1)
    config = TrainConfig(steps=2, batch_size=2, warmup=1, checkpoint_every=1)
    train(scenes.MODEL, scenes_data, config, tmp_path / "run", tmp_path / "w", progress=False)
    with pytest.raises(FileExistsError, match="--resume"):
        train(scenes.MODEL, scenes_data, config, tmp_path / "run", tmp_path / "w", progress=False)
    other = TrainConfig(steps=2, batch_size=2, warmup=1, checkpoint_every=1, lr=5e-4)
    with pytest.raises(ValueError, match=r"lr: 0.001 -> 0.0005"):
        train(scenes.MODEL, scenes_data, other, tmp_path / "run", tmp_path / "w", resume=True, progress=False)


@pytest.mark.parametrize("field, value, valid", [("steps", 0, ">= 1"), ("prompt_dropout", 1.0, r"in \[0, 1\)"),
                                                 ("high_noise_fraction", 1.5, r"in \[0, 1\]"), ("lr", -1.0, "> 0")])
def test_bad_settings_are_named_with_their_range(field, value, valid):
    with pytest.raises(ValueError, match=rf"{field}={value} must be {valid}"):
        TrainConfig(**{field: value})


def test_the_learning_rate_warms_up_then_decays_to_five_percent():
    config = TrainConfig(steps=100, warmup=10, lr=1.0)
    assert lr_at(0, config) == pytest.approx(0.1) and lr_at(9, config) == pytest.approx(1.0)
    assert lr_at(10, config) == pytest.approx(1.0) and lr_at(100, config) == pytest.approx(0.05)
