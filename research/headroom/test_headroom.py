"""The headroom script refuses bad arguments before it runs anything, naming the value."""

import pytest

import headroom


@pytest.mark.parametrize("argv, fragment", [
    (["--targets", "0"], "argument --targets: '0' is not a speedup"),
    (["--oracle-prompts", "0"], "argument --oracle-prompts: '0' is not a positive integer"),
])
def test_a_bad_argument_is_a_usage_error(argv, fragment, capsys):
    with pytest.raises(SystemExit) as exit_info:
        headroom.main(argv)
    assert exit_info.value.code == 2
    assert fragment in capsys.readouterr().err
