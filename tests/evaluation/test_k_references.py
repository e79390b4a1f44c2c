"""Per-K references: each episode of a multi-target dataset is scored against the references of its own K."""

import numpy as np
import pytest

from morca_env.data import collect_dataset
from morca_env.evaluation import k_references
from morca_env.evaluation.benchmark import make_env

TEST_ENV = "MorcaTinyRandom-v0"


@pytest.fixture(scope="module")
def refs(tmp_path_factory):
    env = make_env(TEST_ENV, reference_cache_dir=str(tmp_path_factory.mktemp("refs")), latent_features=False)
    yield k_references.measure_k_references(TEST_ENV, [2, 4, 6], env=env, pair_step=2, progress=False,
                                                  best_fixed="uniform")  # the random model has no fitted one
    env.close()


def test_every_k_holds_both_references_on_the_same_pairs(refs):
    assert sorted(refs["ks"]) == ["2", "4", "6"] and refs["num_pairs"] == 2
    for entry in refs["ks"].values():
        assert len(entry["random"]["psnr"]) == len(entry["best-fixed"]["psnr"]) == 2
    # more reuse, lower quality: the best fixed schedule's mean PSNR falls with K
    means = [np.mean(refs["ks"][k]["best-fixed"]["psnr"]) for k in ("2", "4", "6")]
    assert means[0] > means[2]


def test_a_return_is_0_at_the_random_reference_and_100_at_the_best_fixed_one_of_its_own_k(refs):
    low, high = k_references.reference_returns_at(TEST_ENV, 4, 50.0, refs)
    assert k_references.normalized_return(TEST_ENV, 4, low, 50.0, refs) == pytest.approx(0.0)
    assert k_references.normalized_return(TEST_ENV, 4, high, 50.0, refs) == pytest.approx(100.0)
    other = k_references.reference_returns_at(TEST_ENV, 6, 50.0, refs)
    assert other != (low, high)
    with pytest.raises(ValueError, match="K=5 has no reference on MorcaTinyRandom-v0; measured: 2 to 6"):
        k_references.normalized_return(TEST_ENV, 5, 30.0, 50.0, refs)
    with pytest.raises(ValueError, match="no per-K references for 'MorcaTiny-v0'"):
        k_references.load_k_references("MorcaTiny-v0", refs)


def test_a_datasets_episodes_are_each_scored_at_their_relabelled_k(refs, tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    monkeypatch.setenv("MORCA_CACHE_DIR", str(tmp_path / "cache"))
    dataset = collect_dataset("test/tiny/perk-v0", TEST_ENV, 3, env_kwargs={
        "speedup": [1.5, 3.0], "lpips": False, "num_inference_steps": 10}, behavior={"name": "threshold-curve"},
        progress=False)
    ks = [int(m["options"]["budget"]) for m in dataset.storage.get_episode_metadata(range(3))]
    returns = [float(np.sum(ep.rewards)) for ep in dataset.iterate_episodes()]
    wide = {**refs, "ks": {str(k): refs["ks"][str(min((2, 4, 6), key=lambda r: abs(r - k)))] for k in range(1, 8)}}
    for k in ("2", "4", "6"):  # distinct references per K, so a wrong K shows
        wide["ks"][k] = refs["ks"][k]
    scores = k_references.normalized_returns(dataset, wide)
    expected = [k_references.normalized_return(TEST_ENV, k, r, 50.0, wide) for k, r in zip(ks, returns)]
    np.testing.assert_allclose(scores, expected)


def test_a_k_where_the_best_fixed_schedule_does_not_beat_random_has_no_scale(refs):
    same = refs["ks"]["4"]["random"]  # the best fixed schedule no better than random at K = 4
    broken = {**refs, "ks": {**refs["ks"], "4": {"random": same, "best-fixed": same}}}
    with pytest.raises(ValueError, match="K=4 on MorcaTinyRandom-v0: the best fixed schedule"):
        k_references.normalized_return(TEST_ENV, 4, 30.0, 50.0, broken)


def test_the_shipped_per_k_references_cover_the_datasets_ranges():
    for env_id, (low, high) in {"MorcaTiny-v0": (20, 43), "MorcaScenes-v0": (18, 41)}.items():
        refs = k_references.load_k_references(env_id)
        assert sorted(int(k) for k in refs["ks"]) == list(range(low, high + 1))
        assert refs["num_pairs"] == 10
    low, high = k_references.reference_returns_at("MorcaTiny-v0", 30, 50.0)
    assert 15 < low < high < 50
