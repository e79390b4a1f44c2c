"""MorcaScenes' grammar, splits, renderer and per-factor prompt check."""

import dataclasses

import numpy as np
import pytest
import torch

from morca_env.models import scenes_data as sd
from morca_env.models.text import build_word_tokenizer


def test_every_prompt_parses_back_and_fits_the_text_encoder():
    scenes = sd.all_scenes()
    assert len(scenes) == len(set(s.prompt for s in scenes)) == 12600
    tokenizer = build_word_tokenizer(sd.vocabulary())
    unk = tokenizer.convert_tokens_to_ids("<unk>")
    for scene in scenes[::7]:
        assert sd.parse_prompt(scene.prompt) == scene
        ids = tokenizer(scene.prompt).input_ids
        assert unk not in ids and len(ids) <= 16  # the model's max_sequence_length


def test_a_prompt_outside_the_grammar_names_what_it_lacks():
    with pytest.raises(ValueError, match=r"no background, colour"):
        sd.parse_prompt("one circle still")
    with pytest.raises(ValueError, match="only 'still' has none"):
        sd.parse_prompt("one red circle racing on a flat background")


def test_the_splits_are_disjoint_fixed_and_stratified_by_content_class():
    eval_prompts, seeds = sd.scenes_split("scenes-eval")
    train_prompts, none = sd.scenes_split("scenes-train")
    assert none is None and len(seeds) == len(eval_prompts) == 8 * sd.SCENES_EVAL_PER_CLASS
    assert not set(eval_prompts) & set(train_prompts)
    assert len(eval_prompts) + len(train_prompts) == len(sd.all_scenes())
    classes = [sd.parse_prompt(p).content_class for p in eval_prompts]
    assert {c: classes.count(c) for c in set(classes)} == {c: sd.SCENES_EVAL_PER_CLASS for c in set(classes)}
    assert len(set(classes)) == 8
    every_sixth = classes[::6]  # the benchmark's subset: 5 pairs of each class
    assert {c: every_sixth.count(c) for c in set(classes)} == {c: 5 for c in set(classes)}
    assert [sd.parse_prompt(p) for p in train_prompts[:3]] == sd.training_scenes()[:3]  # the model trains on these
    assert sd.scenes_split("scenes-eval") == (eval_prompts, seeds)  # the same on every call and machine
    with pytest.raises(KeyError):
        sd.scenes_split("scenes-valid")


def test_renders_are_videos_in_range_and_follow_the_seed():
    scene = sd.parse_prompt("three red squares camera panning left growing with a flash on a noisy background")
    a = sd.render([scene], torch.Generator().manual_seed(1))
    b = sd.render([scene], torch.Generator().manual_seed(1))
    assert a.shape == (1, 3, sd.FRAMES, sd.HEIGHT, sd.WIDTH) and torch.equal(a, b)
    assert a.min() >= -1 and a.max() <= 1


def _as_sample(video: torch.Tensor) -> torch.Tensor:
    return ((video + 1) / 2).permute(1, 2, 3, 0)  # (F, H, W, 3) in [0, 1], as the denoiser decodes


@pytest.mark.parametrize("noise", [0.0, 0.05])
def test_the_check_reads_every_factor_of_a_rendered_video(noise):
    scenes = sd.all_scenes()
    picked = [scenes[i] for i in np.random.default_rng(3).choice(len(scenes), 120, replace=False)]
    g = torch.Generator().manual_seed(0)
    hits = {}
    for scene in picked:
        video = _as_sample(sd.render_one(scene, g))
        video = (video + noise * torch.randn(video.shape, generator=g)).clamp(0, 1)
        for factor, ok in sd.prompt_following(video, scene.prompt).items():
            hits.setdefault(factor, []).append(ok)
    rates = {k: float(np.mean(v)) for k, v in hits.items()}
    assert set(rates) == {"motion", "count", "background", "event", "scale", "colour"}
    assert min(rates.values()) >= 0.97, rates


# one other value per factor, chosen to differ in what the check reads
_WRONG = {
    "motion": lambda s: dict(motion="racing", direction="left") if s.motion == "still" else dict(motion="still", direction=""),
    "count": lambda s: dict(count="three" if s.count == "one" else "one"),
    "background": lambda s: dict(background="striped" if s.background != "striped" else "flat"),
    "event": lambda s: dict(event="flash" if s.event != "flash" else ""),
    "scale": lambda s: dict(scale="growing" if s.scale != "growing" else "shrinking"),
    "colour": lambda s: dict(colour="green" if s.colour != "green" else "red"),
}


@pytest.mark.parametrize("factor", sorted(_WRONG))
def test_the_check_rejects_a_video_of_another_value_of_the_factor(factor):
    scenes = sd.all_scenes()
    picked = [scenes[i] for i in np.random.default_rng(4).choice(len(scenes), 40, replace=False)]
    g = torch.Generator().manual_seed(0)
    rejected = []
    for scene in picked:
        video = _as_sample(sd.render_one(scene, g))
        claimed = dataclasses.replace(scene, **_WRONG[factor](scene))
        rejected.append(not sd.prompt_following(video, claimed.prompt)[factor])
    assert np.mean(rejected) >= 0.95


def test_a_morca_scenes_pipeline_reads_its_own_calibration_not_morca_tinys():
    from morca_env.speedup.files import calibration_for_pipeline
    from morca_env.models import scenes, tiny

    assert calibration_for_pipeline(scenes.load_morca_scenes()) == "scenes"
    assert calibration_for_pipeline(tiny.load_morca_tiny()) == "tiny"
