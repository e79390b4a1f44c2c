"""The study's probes and scripts run on the packaged model: prompt sensitivity, the direction's commit step,
the evaluation report's partial update, and a pilot variant trained in its own process."""

import numpy as np
import pytest

from morca_env.diffusion.denoiser import DenoiserConfig, StepwiseDenoiser
from morca_env.models import tiny
from morca_env.models.tiny_data import prompt_following
from morca_env.prompts import get_suite


def test_prompt_probe_sees_that_the_model_reads_colour_and_direction():
    from tiny_probe import prompt_sensitivity

    report = prompt_sensitivity(tiny.load_morca_tiny(), sigmas=(0.9,), videos=16)
    entry = report[0.9]
    assert set(entry) == {"loss", "colour", "shape", "direction", "background"}
    # the wrong colour or direction word costs the denoiser clearly (64 videos: +0.047 and +0.035 on a
    # loss of 0.063; the first, 32x32 v0 ignored the direction word: +0.0001 on 0.092)
    assert entry["colour"] > 0.3 * entry["loss"] > 0
    assert entry["direction"] > 0.2 * entry["loss"]
    with pytest.raises(ValueError, match=r"sigmas \(0.0,\) must lie in \(0, 1\]"):
        prompt_sensitivity(None, sigmas=(0.0,))


def test_eval_tiny_following_only_updates_just_its_entry(tmp_path):
    import json

    import eval_tiny

    metrics = tmp_path / "metrics.json"
    metrics.write_text(json.dumps({"schedules": {"budget": 25}, "prompt_following": {"colour": -1.0}}))
    assert eval_tiny.main(["--following-only", "--prompts", "2", "--out", str(tmp_path)]) == 0
    report = json.loads(metrics.read_text())
    assert report["schedules"] == {"budget": 25}  # untouched
    # the report holds the share of the first two eval prompts whose video follows them, recomputed here
    den = StepwiseDenoiser(tiny.load_morca_tiny(), DenoiserConfig(**tiny.GENERATION))
    hits = [prompt_following(den.generate(prompt=p, seed=s), p) for p, s in get_suite("tiny-eval").pairs()[:2]]
    den.close()
    assert report["prompt_following"] == {k: float(np.mean([h[k] for h in hits])) for k in ("colour", "direction")} | {
        "prompts": 2}
    with pytest.raises(SystemExit):
        eval_tiny.main(["--following-only", "--sensitivity-only", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        eval_tiny.main(["--following-only", "--prompts", "0", "--out", str(tmp_path)])
    assert json.loads(metrics.read_text()) == report  # a bad call leaves the report alone


def test_direction_commit_probe_reports_a_sigma_per_prompt():
    from tiny_probe import direction_commit_sigmas

    den = StepwiseDenoiser(tiny.load_morca_tiny(), DenoiserConfig(**{**tiny.GENERATION, "num_inference_steps": 8}))
    pairs = get_suite("tiny-eval").pairs()[:2]
    commits = direction_commit_sigmas(den, pairs)
    sigmas = [den.sigma(i) for i in range(den.num_steps)]
    assert len(commits) == 2 and all(c == 0.0 or c in sigmas for c in commits)


def test_pilot_trains_a_variant_in_its_own_process_and_reports(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    # the script imports this checkout's package, as the test does (not another install's): otherwise the refusal
    # below compares another checkout's weights directory, and the script trains into this one's
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here.parents[1]), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "variant"
    run = subprocess.run([sys.executable, str(here / "pilot_tiny.py"), "--out", str(out), "--world", "direction",
                          "--hw", "8", "--patch", "1", "2", "2", "--steps", "2", "--samples", "4",
                          "--", "--batch-size", "2", "--warmup", "1"], check=False, capture_output=True, text=True,
                         cwd=here, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads((tmp_path / "variant_run" / "pilot.json").read_text())
    assert report["samples"]["count"] == 4 and sum(report["samples"]["direction_confusion"].values()) == 4
    assert {k.split("->")[0] for k in report["samples"]["direction_confusion"]} == {"left", "right", "up", "down"}
    variant = tiny.load_morca_tiny(directory=out)
    assert tuple(variant.transformer.config.patch_size) == (1, 2, 2) != tuple(tiny.TRANSFORMER_CONFIG["patch_size"])
    bad = subprocess.run([sys.executable, str(here / "pilot_tiny.py"), "--out", str(tiny.weights_dir())],
                         check=False, capture_output=True, text=True, cwd=here, env=env, timeout=120)
    assert bad.returncode != 0 and "packaged weights directory" in bad.stderr
