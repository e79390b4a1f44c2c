"""`morca fit-rules`: the rule constants fitted on a registered model, written where the rules read them."""

import importlib.util
import json
from pathlib import Path

import pytest

from morca_env.schedulers.rules import magcache, teacache

ROOT = Path(__file__).resolve().parents[2]


def script():
    from morca_env.commands import fit_rules

    return fit_rules


def test_fits_both_rules_on_the_tiny_random_model(tmp_path):
    assert script().main(["--env", "MorcaTinyRandom-v0", "--env-kwargs", '{"num_inference_steps": 8}',
                          "--prompts", "tiny-train:1", "--save", str(tmp_path)]) == 0
    mag = json.loads((tmp_path / "tiny-random_magcache.json").read_text())
    tea = json.loads((tmp_path / "tiny-random_teacache.json").read_text())
    assert mag["num_steps"] == 8 and len(mag["ratios"]) == 16 and mag["ratios"][:2] == [1.0, 1.0]
    assert all(r > 0 for r in mag["ratios"]) and len(mag["pairs"]) == 1
    assert len(tea["coefficients"]) == len(tea["coefficients_ret"]) == 5
    assert "morca fit-rules --env MorcaTinyRandom-v0" in tea["command"]
    magcache.MagCache(mag["ratios"])  # loadable as the rules' constants
    teacache.TeaCache(tea["coefficients"]), teacache.TeaCache(tea["coefficients_ret"], use_ret_steps=True)


@pytest.mark.parametrize("args, message", [
    (["--prompts", "tiny-eval:2"], "is an evaluation suite"),
    (["--threads", "0"], "argument --threads: '0' is not a positive integer"),
    (["--rules", "easycache"], "invalid choice: 'easycache'"),
])
def test_bad_arguments_are_usage_errors(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        script().main(args)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
