import pytest

from morca_env.prompts import get_suite


def test_vbench_split_is_fixed_and_disjoint():
    evals, train, everything = get_suite("vbench-eval"), get_suite("vbench-train"), get_suite("vbench-all")
    assert len(evals) == 200 and len(train) == 744 and len(everything) == 944
    assert not set(evals.prompts) & set(train.prompts)
    assert evals.seeds is not None and get_suite("vbench-eval").pairs() == evals.pairs()


def test_subset_suites_have_fixed_seeds():
    subset = get_suite("tiny-train:250")
    assert len(subset) == 250 and subset.prompts == get_suite("tiny-train").prompts[:250]
    assert subset.seeds == get_suite("tiny-train:250").seeds
    assert get_suite("vbench-eval:10").pairs() == get_suite("vbench-eval").pairs()[:10]


@pytest.mark.parametrize("bad", ["tiny-train:0", "nope:5", "tiny-train:x", "", [], [""], 3])
def test_bad_suites_are_rejected(bad):
    with pytest.raises(ValueError, match="prompts|suite"):
        get_suite(bad)
