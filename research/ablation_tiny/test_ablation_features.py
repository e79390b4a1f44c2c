"""The Table 3 script runs end to end at minimal sizes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from morca_env.prompts import get_suite

HERE = Path(__file__).resolve().parent


def run(args, tmp_path, timeout=900):
    env = {**os.environ, "MINARI_DATASETS_PATH": str(tmp_path / "minari"), "MORCA_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.mark.slow
def test_feature_ablation_trains_each_variant_and_pairs_them_at_the_same_k(tmp_path):
    """Table 3's script: one offline IQL per feature subset (the n-step targets passed through), evaluated at the
    same K next to the best fixed schedule and uniform spacing, paired against the first variant and the best
    fixed schedule."""
    run(["-m", "morca_env.commands", "collect", "morca/tiny/mixture-v0", "--dataset-id", "test/ablation-v0",
                "--episodes", "4", "--workers", "1"], tmp_path)
    out = tmp_path / "ablation"
    run([str(HERE / "ablation_features.py"), "--dataset", "test/ablation-v0", "--variants", "A0", "A1",
                "--epochs", "1", "--max-steps-per-epoch", "2", "--n-step", "7", "--prompts", "1", "--targets", "2.0",
                "--seed", "3", "--same-k", "--suite", "tiny-train[11::132]", "--out", str(out)], tmp_path)
    trained = json.loads((out / "A1" / "args.json").read_text())
    assert trained["n_step"] == "7" and trained["seed"] == "3"
    rows = [json.loads(line) for line in (out / "eval" / "episodes.jsonl").read_text().splitlines()]
    # evaluated on the validation slice asked for, not on the held-out suite
    assert {r["prompt"] for r in rows} == {get_suite("tiny-train[11::132]").prompts[0]}
    assert {r["method"] for r in rows} == {"morca-A0", "morca-A1", "best-fixed", "uniform"}
    assert len({r["num_reuse"] for r in rows}) == 1
    # scored in the env the dataset was collected in (a MorcaScenes dataset on MorcaScenes)
    assert json.loads((out / "eval" / "run.json").read_text())["env_id"] == "MorcaTiny-v0"
    table = (out / "eval" / "table.md").read_text()
    assert "morca-A1 - morca-A0 at 2.0x" in table and "morca-A1 - best-fixed at 2.0x" in table


def test_variants_are_scored_in_the_env_their_dataset_was_collected_in(monkeypatch):
    import importlib.util
    from types import SimpleNamespace

    import morca_env.data.integrity as integrity

    spec = importlib.util.spec_from_file_location("ablation_features", HERE / "ablation_features.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    recorded = {"morca/scenes/anchored-v2": SimpleNamespace(id="MorcaScenes-v0"), "old/none-v0": None}
    monkeypatch.setattr(integrity, "load_dataset",
                        lambda dataset_id: SimpleNamespace(spec=SimpleNamespace(env_spec=recorded[dataset_id])))
    assert script.collected_in("morca/scenes/anchored-v2") == "MorcaScenes-v0"
    with pytest.raises(SystemExit, match="records no env; pass --env"):
        script.collected_in("old/none-v0")
