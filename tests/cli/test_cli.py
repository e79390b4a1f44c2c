"""The `morca` command: every subcommand listed, each one's --help, and a clear error for a wrong name."""

import subprocess
import sys
from pathlib import Path

import pytest

from morca_env import commands

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = {"collect", "train", "finetune", "evaluate", "calibrate", "search", "quickstart", "reinforce",
            "references", "fit-fixed", "fit-rules", "export-searched", "dataset-report", "verify-dataset", "cache",
            "leaderboard", "train-testbed",
            "convert-checkpoint", "anchor"}


def test_morca_help_lists_every_subcommand_with_its_summary():
    out = subprocess.run([sys.executable, "-m", "morca_env.commands", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    listed = {line.split()[0] for line in out.stdout.splitlines() if line.startswith("  ")}
    assert listed == EXPECTED == set(commands.commands())
    assert "Offline discrete IQL" in out.stdout and "(unavailable" not in out.stdout  # read from the modules


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_subcommand_help_names_itself(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        commands.main([name, "--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: morca {name} ")


def test_an_unknown_subcommand_is_refused_naming_the_valid_ones(capsys):
    assert commands.main(["colect"]) == 2
    assert "unknown command 'colect'; valid: anchor, cache, calibrate, collect" in capsys.readouterr().err


def test_no_script_duplicates_a_morca_command():
    """`morca <command>` is the one way to run a job: no `scripts/<name>.py` wrapper repeats it under another name."""
    wrappers = [s.name for s in (ROOT / "scripts").glob("*.py") if "morca_env.commands" in s.read_text()
                or "agents.commands" in s.read_text()]
    assert not wrappers and set(commands.commands()) == EXPECTED


