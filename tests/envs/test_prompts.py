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


def test_sliced_suites_spread_over_the_grammar_with_the_prefix_seeds():
    whole, prefix = get_suite("tiny-train"), get_suite("tiny-train:300")
    spread, val = get_suite("tiny-train[::22]"), get_suite("tiny-train[11::132]")
    assert len(spread) == 253 and spread.prompts == whole.prompts[::22]
    assert spread.seeds[:14] == prefix.seeds[:300:22]  # index i keeps the seed `tiny-train:n` gives it
    assert not set(zip(spread.prompts, spread.seeds)) & set(zip(val.prompts, val.seeds)) and len(val) == 43
    assert {w for p in spread.prompts for w in p.split()} >= {"red", "green", "blue", "circle", "square", "triangle"}
    assert not {"green", "blue"} & {w for p in prefix.prompts[:250] for w in p.split()}  # why slices exist
    assert get_suite("tiny-eval[2:4]").pairs() == get_suite("tiny-eval").pairs()[2:4]
    assert get_suite("tiny-train[5:6]").pairs() == [(whole.prompts[5], prefix.seeds[5])]


@pytest.mark.parametrize("bad", ["tiny-train[::0]", "tiny-train[x:]", "tiny-train[9000:]", "nope[1:2]", "tiny-train[3]"])
def test_bad_slices_are_rejected(bad):
    with pytest.raises(ValueError, match="prompts="):
        get_suite(bad)


@pytest.mark.parametrize("bad", ["tiny-train:0", "nope:5", "tiny-train:x", "", [], [""], 3])
def test_bad_suites_are_rejected(bad):
    with pytest.raises(ValueError, match="prompts|suite"):
        get_suite(bad)
