"""The `morca` command: every subcommand listed, each one's --help, and a clear error for a wrong name."""

import subprocess
import sys
from pathlib import Path

import pytest

from morca_env import commands

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = {"collect", "train", "finetune", "evaluate", "calibrate", "search", "quickstart", "reinforce",
            "benchmark-references", "fit-fixed", "fit-rules", "export-searched", "dataset-report", "verify-dataset", "cache",
            "leaderboard", "train-testbed",
            "convert-checkpoint", "anchor"}


def test_morca_help_lists_every_subcommand_with_its_summary():
    out = subprocess.run([sys.executable, "-m", "morca_env.commands", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    listed = {line.split()[0] for line in out.stdout.splitlines() if line.startswith("  ")}
    assert listed == EXPECTED == set(commands.commands())
    assert "Offline discrete IQL" in out.stdout and "(unavailable" not in out.stdout  # read from the modules


def test_listing_the_subcommands_imports_neither_agents_nor_d3rlpy():
    """The agents' summaries are read from their files: importing `agents` for them put d3rlpy into every listing."""
    code = ("import sys; from morca_env import commands; print(commands.usage()); "
            "print('imported:', sorted(m for m in ('agents', 'agents.commands', 'd3rlpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert "imported: []" in out.stdout and "Offline discrete IQL" in out.stdout


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_subcommand_help_names_itself(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        commands.main([name, "--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: morca {name} ")


def test_an_unknown_subcommand_is_refused_naming_the_valid_ones(capsys):
    assert commands.main(["colect"]) == 2
    assert "unknown command 'colect'; valid: anchor, benchmark-references, cache, calibrate, collect" in capsys.readouterr().err


def test_a_renamed_subcommand_answers_under_its_old_name_with_a_notice(capsys):
    assert set(commands.RENAMED.values()) <= set(commands.commands())
    with pytest.raises(SystemExit) as exit_info:
        commands.main(["references", "--help"])
    assert exit_info.value.code == 0
    captured = capsys.readouterr()
    assert "`morca references` is now `morca benchmark-references`" in captured.err
    assert "usage: morca benchmark-references" in captured.out


def test_no_script_duplicates_a_morca_command():
    """`morca <command>` is the one way to run a job: no script outside the package calls a command's module
    (a wrapper that repeats it under another name)."""
    wrappers = [str(s.relative_to(ROOT)) for folder in ("research", "benchmarks", "examples") for s in (ROOT / folder).rglob("*.py")
                if any(f"{package}.commands.{name.replace('-', '_')}" in s.read_text() for package in ("morca_env", "agents")
                       for name in commands.commands())]
    assert not wrappers and set(commands.commands()) == EXPECTED




def test_a_refused_collection_is_one_line_without_a_traceback_unless_debug(tmp_path, monkeypatch, capsys):
    """A concurrent writer (the lock held here) is the package's own error: one line on stderr and exit 1."""
    from morca_env.data import CollectionRecipe, staging_root
    from morca_env.utils.io import exclusive_lock

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    monkeypatch.setenv("MORCA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MORCA_DEBUG", raising=False)
    recipe = "morca/tiny/random-v0"
    dataset_id = CollectionRecipe.from_file(recipe).dataset_id
    with exclusive_lock(staging_root() / f"{dataset_id}.lock", "test"):
        assert commands.main(["collect", str(recipe), "--episodes", "1"]) == 1
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert err.strip().splitlines()[-1].startswith(f"morca collect: dataset {dataset_id!r} is being written by "
                                                       "another process")
        with pytest.raises(RuntimeError, match="is being written by another process"):
            commands.main(["collect", str(recipe), "--episodes", "1", "--debug"])


def test_a_bug_keeps_its_traceback_and_is_called_one(monkeypatch, capsys):
    class Point:
        name = "cache"

        def load(self):
            return lambda argv: {}["missing"]

    monkeypatch.setattr(commands, "commands", lambda: {"cache": Point()})
    assert commands.main(["cache"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "morca cache: unexpected KeyError: 'missing' (a bug in morca" in err


def test_every_subcommand_is_a_module_named_like_it_under_a_commands_package():
    for name, point in commands.commands().items():
        module = point.value.split(":")[0]
        package, _, leaf = module.rpartition(".")
        assert package.endswith(".commands") and leaf == name.replace("-", "_"), f"morca {name} is {module}"
