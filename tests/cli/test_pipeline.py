"""The command-line pipeline: `morca evaluate` writes its table, plots and videos and resumes; the quickstart runs."""

import contextlib
import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from morca_env.prompts import get_suite

ROOT = Path(__file__).resolve().parents[2]


def run_script(args, tmp_path):
    """`python -m morca_env.commands <name> ...`, run in this process: a fresh interpreter per call costs ~5 s of
    imports, and these tests call the CLI 20 times (what the process adds, its exit codes and one-line errors, has
    its own tests: test_cli, test_bad_inputs)."""
    assert args[:2] == ["-m", "morca_env.commands"], args
    from morca_env import commands

    env = {"MINARI_DATASETS_PATH": str(tmp_path / "minari"), "MORCA_CACHE_DIR": str(tmp_path / "cache")}
    out, err, threads, cwd = io.StringIO(), io.StringIO(), torch.get_num_threads(), os.getcwd()
    loggers = [logging.getLogger(name) for name in ("morca_env", "agents")]  # a command shows the library's lines
    saved = [(logger, list(logger.handlers), logger.level) for logger in loggers]
    with mock.patch.dict(os.environ, env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            os.chdir(ROOT)
            code = commands.main(args[2:])
        except SystemExit as exit_info:
            code = exit_info.code
        finally:  # what a command sets for its process, the next test gets back as the session had it
            os.chdir(cwd)
            torch.set_num_threads(threads)
            for logger, handlers, level in saved:
                logger.handlers[:] = handlers
                logger.setLevel(level)
    assert code in (0, None), err.getvalue()[-3000:]
    return out.getvalue()


def test_evaluate_writes_results_and_resumes(tmp_path):
    out = tmp_path / "eval"
    args = ["-m", "morca_env.commands", "evaluate", "--env", "MorcaTinyRandom-v0", "--env-kwargs", '{"num_inference_steps": 10}',
            "--prompts", "2", "--targets", "1.5", "2.0", "--methods", "uniform", "random", "behaviour",
            "seacache-global", "--videos", "1", "--threads", "1", "--out", str(out), "--baselines", "seacache-global",
            "uniform"]
    run_script(args, tmp_path)
    rows = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 2 * 4 + 2 * 2  # + uniform at each seacache-global episode's own K
    own = {(r["target"], r["prompt_index"]): r["num_reuse"] for r in rows if r["method"] == "seacache-global"}
    matched = {(r["target"], r["prompt_index"]): r["num_reuse"] for r in rows if r["method"] == "uniform@seacache-global"}
    assert matched == own and len(set(own.values())) > 1  # the K's differ, and each is matched
    for row in rows:
        assert row["stock_latency_s"] > 0 and row["speedup"] == pytest.approx(row["stock_latency_s"] / row["latency_s"])
        if row["method"] != "seacache-global":  # the global threshold does not hold K exactly
            assert sum(row["schedule"]) == row["num_reuse"]
    table = (out / "table.md").read_text()
    assert table.count("| 1.5x |") == 4 and table.count("| 2.0x |") == 4
    for method in ("uniform", "random", "behaviour"):  # every method is paired with the baseline
        assert f"- {method} - seacache-global at 2.0x:" in table
    assert "- seacache-global - uniform at seacache-global's own K (mean" in table
    assert "At equal measured speedup" in table and "| seacache-global |" in table
    assert "At the same K" in table and "(own K)" in table
    for name in ("table.csv", "pareto.png", "schedules.png", "video_000.gif", "video_000.mp4"):
        assert (out / name).stat().st_size > 0
    run_script(args, tmp_path)  # everything is done: nothing is appended
    assert len((out / "episodes.jsonl").read_text().splitlines()) == len(rows)
    lines = (out / "episodes.jsonl").read_text().splitlines()  # killed before its matched episodes: they are run
    (out / "episodes.jsonl").write_text("".join(line + "\n" for line in lines if "uniform@" not in line))
    run_script(args + ["--no-matched"], tmp_path)  # asked not to: nothing runs
    assert len((out / "episodes.jsonl").read_text().splitlines()) == len(rows) - 4
    run_script(args, tmp_path)
    again = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(again) == len(rows) and {(r["target"], r["prompt_index"]): r["num_reuse"] for r in again
                                        if r["method"] == "uniform@seacache-global"} == own


def test_evaluate_rejects_bad_timing_repeats(tmp_path, capsys):
    from morca_env import commands

    with pytest.raises(SystemExit) as exit_info:
        commands.main(["evaluate", "--timing-repeats", "0", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "argument --timing-repeats: '0' is not a positive integer" in capsys.readouterr().err


@pytest.mark.slow  # about 22 s on one core: kept out of the default suite (about 13 min)
def test_evaluate_measures_its_calibration_once_and_reuses_it_on_resume(tmp_path):
    from morca_env.speedup.calibration import SpeedupCalibration

    out = tmp_path / "eval"
    args = ["-m", "morca_env.commands", "evaluate", "--env", "MorcaTinyRandom-v0", "--env-kwargs", '{"num_inference_steps": 10}',
            "--prompts", "1", "--targets", "1.0", "--methods", "uniform", "--videos", "0", "--threads", "1",
            "--calibrate", "1", "--timing-repeats", "2", "--out", str(out)]
    stdout = run_script(args, tmp_path)
    calibration = SpeedupCalibration.from_json(out / "calibration.json")
    assert calibration.source.startswith("measured on") and len(calibration.points) == 9  # K = 0..8
    assert "fastest of 2" in calibration.source
    assert "fit: K =" in stdout
    row = json.loads((out / "episodes.jsonl").read_text().splitlines()[0])
    assert row["timing_repeats"] == 2
    # 1.0x is feasible whatever this machine measures (the env's own overhead can put K* above 0); the K is the
    # calibration's with the scheduler's own measured step time counted
    assert row["scheduler_cost_s"] > 0
    k_star = calibration.with_scheduler_cost(row["scheduler_cost_s"]).fractional_budget(1.0)
    assert row["num_reuse"] in (int(k_star), int(k_star) + 1)
    before = (out / "calibration.json").read_bytes()
    stdout = run_script(args, tmp_path)
    assert "(resume)" in stdout and (out / "calibration.json").read_bytes() == before


@pytest.mark.slow  # about 25 s on one core: kept out of the default suite (about 13 min)
def test_evaluate_feedback_corrects_requests_and_resumes_its_governor(tmp_path):
    out = tmp_path / "eval"
    base = ["-m", "morca_env.commands", "evaluate", "--env", "MorcaTinyRandom-v0", "--env-kwargs", '{"num_inference_steps": 10}',
            "--targets", "1.5", "--methods", "uniform", "--videos", "0", "--threads", "1", "--feedback",
            "--out", str(out)]
    run_script([*base, "--prompts", "1"], tmp_path)
    run_script([*base, "--prompts", "2"], tmp_path)  # resumes: the governor is rebuilt from the first row
    first, second = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert first["requested_speedup"] == 1.5  # no history yet: the target itself
    factor = first["stock_latency_s"] / (first["latency_s"] * first["requested_speedup"])
    import gymnasium as gym

    import morca_env  # noqa: F401

    lo, hi = gym.make("MorcaTinyRandom-v0", budget=0, num_inference_steps=10).unwrapped.calibration.speedup_range
    assert second["requested_speedup"] == pytest.approx(min(hi, max(lo, 1.5 / factor)))
    bad = subprocess.run([sys.executable, *base, "--same-k"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--feedback and --same-k exclude each other" in bad.stderr


def test_feedback_requests_stay_inside_a_learned_schedulers_narrower_range(tmp_path):
    import gymnasium as gym

    import morca_env  # noqa: F401

    from morca_env.evaluation.runner import governor_for

    env = gym.make("MorcaTiny-v0", budget=0, num_inference_steps=10, lpips=False,  # a measured calibration
                   reference_cache_dir=str(tmp_path))
    rule_hi = governor_for(env, 1.5, 0.0).speedup_range[1]
    governor = governor_for(env, 1.5, 0.002)  # 2 ms per step of scheduler inference
    hi = governor.speedup_range[1]
    assert hi < rule_hi
    governor.record(1.5, stock_s=1.0, episode_s=3.0)  # the machine gave 0.33x for a 1.5x request
    assert 1.5 * 1.5 / (1 / 3.0) > hi  # the uncorrected request would leave the range
    assert governor.request() == hi  # clipped where the env would otherwise reject the request
    env.unwrapped.reset(options={"speedup": governor.request(), "scheduler_cost_s": 0.002})


@pytest.mark.slow
def test_quickstart_runs_end_to_end_at_minimal_sizes(tmp_path):
    out = tmp_path / "qs"
    stdout = run_script(["-m", "morca_env.commands", "quickstart", "--out", str(out), "--episodes", "4", "--workers", "1",
                         "--offline-epochs", "1", "--max-steps-per-epoch", "2", "--rounds", "1", "--trajectories", "2",
                         "--warmup-epochs", "1", "--joint-epochs", "1", "--online-steps-per-epoch", "2",
                         "--eval-prompts", "1", "--validation-pairs", "2", "--targets", "2.0"], tmp_path)
    assert "quickstart finished" in stdout
    table = (out / "eval" / "table.md").read_text()
    assert "morca-online" in table and "morca-shipped" in table and "seacache-global" in table
    assert (out / "online" / "anchored.json").exists()  # the margin, chosen on validation pairs


def test_search_fit_and_evaluate_at_the_same_k(tmp_path):
    """The headroom pipeline: per-prompt oracle and best fixed schedule, evaluated next to uniform at one K."""
    kwargs = json.dumps({"num_inference_steps": 10, "r_max": 200})
    search = tmp_path / "search"
    run_script(["-m", "morca_env.commands", "search", "--env", "MorcaTinyRandom-v0", "--env-kwargs", kwargs, "--prompts",
                "tiny-eval", "--count", "2", "--targets", "1.8", "--evaluations", "6", "--out", str(search)], tmp_path)
    fixed = tmp_path / "fixed.json"
    budgets = sorted({json.loads(p.read_text())["budget"] for p in search.glob("*.json")})
    stdout = run_script(["-m", "morca_env.commands", "fit-fixed", "--env", "MorcaTinyRandom-v0", "--env-kwargs", kwargs,
                         "--prompts", "tiny-train:2", "--budgets", *map(str, budgets), "--evaluations", "4",
                         "--out", str(tmp_path / "fit"), "--select-on", "tiny-train[5:6]", "--save", str(fixed)],
                        tmp_path)
    assert "mean training PSNR" in stdout and set(json.loads(fixed.read_text())["schedules"]) == set(map(str, budgets))
    assert "over 1 prompts: kept" in stdout
    fits = json.loads(fixed.read_text())["fits"]
    assert all({"validation_psnr", "uniform_validation_psnr", "kept"} <= set(fit) for fit in fits.values())
    assert all("--prompts tiny-train:2" in fit["source"] for fit in fits.values())  # each K keeps its own command
    new = max(budgets) + 1  # merged into the file: the schedule it served at K before is a candidate too
    stdout = run_script(["-m", "morca_env.commands", "fit-fixed", "--env", "MorcaTinyRandom-v0", "--env-kwargs", kwargs,
                         "--prompts", "tiny-train:2", "--budgets", str(new), "--evaluations", "1",
                         "--out", str(tmp_path / "fit"), "--select-on", "tiny-train[5:6]", "--save", str(fixed)],
                        tmp_path)
    merged = json.loads(fixed.read_text())
    assert f"moved from K={max(budgets)}" in stdout and set(merged["schedules"]) == set(map(str, budgets + [new]))
    assert f"moved from K={max(budgets)}_validation_psnr" in merged["fits"][str(new)]
    assert merged["fits"][str(max(budgets))] == fits[str(max(budgets))]  # the K's already there are kept as they were
    out = tmp_path / "eval"
    run_script(["-m", "morca_env.commands", "evaluate", "--env", "MorcaTinyRandom-v0", "--env-kwargs", kwargs, "--prompts", "2",
                "--targets", "1.8", "--videos", "0", "--threads", "1", "--out", str(out), "--baselines", "uniform",
                "--methods", "uniform", f"best-fixed={fixed}", f"searched={search}"], tmp_path)
    rows = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    by = {(r["method"], r["prompt_index"]): r for r in rows}
    for index in range(2):
        ks = {by[m, index]["num_reuse"] for m in ("uniform", "best-fixed", "searched")}
        assert len(ks) == 1  # the same K for every method
        assert by["searched", index]["psnr"] >= by["uniform", index]["psnr"] - 1e-6  # search starts from uniform
    assert "searched - uniform at 1.8x" in (out / "table.md").read_text()


def test_fit_fixed_weighs_candidates_moved_to_each_k_without_a_search(tmp_path, capsys):
    """`--evaluations 0 --candidates`: the file's schedule, uniform spacing and every candidate (moved to the K)
    are played on the validation prompts and the best is kept, with each one's score in the file."""
    from morca_env.commands import fit_fixed

    kwargs = json.dumps({"num_inference_steps": 10, "r_max": 200})
    fixed = tmp_path / "fixed.json"
    fixed.write_text(json.dumps({"schedules": {"4": [0, 1, 1, 1, 1, 0, 0, 0, 0, 0]}}))  # a poor one to beat
    named = tmp_path / "named.json"
    named.write_text(json.dumps({"late": [0, 0, 0, 0, 0, 1, 0, 1, 1, 0], "early": [0, 1, 1, 0, 1, 0, 0, 0, 0, 0]}))
    stdout = run_script(["-m", "morca_env.commands", "fit-fixed", "--env", "MorcaTinyRandom-v0", "--env-kwargs", kwargs,
                         "--budgets", "4", "--evaluations", "0", "--candidates", str(named), "--out",
                         str(tmp_path / "fit"), "--select-on", "tiny-train[5:7]", "--save", str(fixed)], tmp_path)
    fit = json.loads(fixed.read_text())["fits"]["4"]
    scores = {name: v for name, v in fit.items() if name.endswith("validation_psnr")}
    assert set(scores) == {"validation_psnr", "uniform_validation_psnr", "named:late moved from K=3_validation_psnr",
                           "named:early moved from K=3_validation_psnr"}
    best = max(scores, key=scores.get)
    assert fit["kept"] == {"validation_psnr": "fitted", "uniform_validation_psnr": "uniform"}.get(
        best, best.removesuffix("_validation_psnr"))
    assert "K=4: no search" in stdout and fit["evaluations"] == 0 and "--candidates named.json" in fit["source"]
    assert sum(json.loads(fixed.read_text())["schedules"]["4"]) == 4
    for argv, message in ((["--budgets", "4", "--evaluations", "0"], "pass --select-on"),
                          (["--budgets", "4", "--candidates", str(fixed / "missing.json"), "--select-on", "tiny-train:1"],
                           "--candidates: ")):
        with pytest.raises(SystemExit):
            fit_fixed.main(["--env", "MorcaTinyRandom-v0", *argv])
        assert message in capsys.readouterr().err


def test_schedule_plot_shows_every_method_with_its_own_k_and_table_rows_agree(tmp_path):
    from morca_env.evaluation import plots, tables

    rows = [{"method": m, "target": 2.5, "prompt_index": 0, "schedule": s, "num_reuse": sum(s), "psnr": 30.0,
             "ssim": 0.9, "latency_s": lat, "stock_latency_s": stock, "speedup": stock / lat}
            for m, s, lat, stock in (("uniform", [0, 1, 0, 1, 0], 0.30, 0.60), ("seacache-global", [0, 1, 1, 0, 0], 0.31, 0.60),
                                     ("morca-online", [0, 1, 1, 1, 0], 0.224, 0.566))]
    rows.append({**rows[0], "prompt_index": 1})
    assert plots.schedule_rows(rows, 2.5) == {"uniform (K=2)": [0, 1, 0, 1, 0], "seacache-global (K=2)": [0, 1, 1, 0, 0],
                                                 "morca-online (K=3)": [0, 1, 1, 1, 0]}
    methods = [("uniform", None), ("seacache-global", None), ("morca-online", None)]
    table = tables.summarise(rows, [2.5], methods)
    text = tables.write_tables(tmp_path, table, rows, methods, [2.5], 0.6)
    line = next(x for x in text.splitlines() if "morca-online" in x and x.startswith("| 2.5x"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    latency, stock, speedup = float(cells[3]), float(cells[4]), float(cells[5].rstrip("x"))
    assert (latency, stock) == (0.224, 0.566) and speedup == pytest.approx(stock / latency, abs=0.01)


def test_calibration_table_explains_a_speedup_below_one_at_k0():
    from morca_env.speedup.calibration import SpeedupCalibration
    from morca_env.speedup.measure import CalibrationMeasurement

    calib = SpeedupCalibration(alpha=50.0, beta=50.0, max_budget=48)
    text = CalibrationMeasurement(calib, [0, 24], {0: 0.84, 24: 0.45}, 0.758).table()
    assert "K = 0 runs at 0.902x, not 1x: an episode also computes the scheduler's inputs" in text


@pytest.mark.slow  # about 19 s on one core: kept out of the default suite (about 13 min)
def test_train_offline_refuses_to_resume_a_run_on_other_data(tmp_path):
    """A rerun on new data (the quickstart's recipe changed) must not 'resume' past the old run's last epoch."""
    run_dir = tmp_path / "offline"
    run_dir.mkdir()
    (run_dir / "args.json").write_text(json.dumps({"dataset": "['morca/tiny/quickstart-v0']"}))
    env = {**os.environ, "MINARI_DATASETS_PATH": str(tmp_path / "minari")}
    out = subprocess.run([sys.executable, "-m", "morca_env.commands", "train", "--dataset", "morca/tiny/quickstart-mixture-v0",
                          "--run-dir", str(run_dir), "--resume"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode != 0 and ("was run with other arguments (--dataset ['morca/tiny/quickstart-v0'] -> "
                                    "['morca/tiny/quickstart-mixture-v0'])") in out.stderr, out.stderr[-1000:]
    # the same dataset passes the check and fails later, on the missing data
    out = subprocess.run([sys.executable, "-m", "morca_env.commands", "train", "--dataset", "morca/tiny/quickstart-v0",
                          "--run-dir", str(run_dir), "--resume"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode != 0 and "other arguments" not in out.stderr


def test_a_resume_with_changed_hyperparameters_is_refused_and_args_json_tells_the_truth(tmp_path):
    """--resume with another --lr / --features kept the checkpoint's network and rewrote args.json to
    claim the new values. Now it is refused, naming each change; extending the run (--epochs) is allowed."""
    from agents.commands.train import parse_args
    from morca_env.cli import record_run_arguments

    run_dir = tmp_path / "offline"
    first = parse_args(["--run-dir", str(run_dir), "--lr", "1e-4", "--epochs", "2"])
    record_run_arguments(run_dir, first)
    recorded = (run_dir / "args.json").read_text()
    changed = parse_args(["--run-dir", str(run_dir), "--lr", "1e-3", "--features", "p3", "--epochs", "2", "--resume"])
    with pytest.raises(SystemExit, match=r"--features p3,mean,var -> p3; --lr 0.0001 -> 0.001"):
        record_run_arguments(run_dir, changed)
    assert (run_dir / "args.json").read_text() == recorded  # the record still says what ran
    longer = parse_args(["--run-dir", str(run_dir), "--lr", "1e-4", "--epochs", "5", "--resume", "--threads", "1"])
    record_run_arguments(run_dir, longer)
    assert json.loads((run_dir / "args.json").read_text())["epochs"] == "5"
