"""The leaderboard: complete methods only, ranked by rliable's IQM, resumable runs, the command on the page."""

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rliable")  # the [benchmark] extra
from agents import leaderboard_report  # noqa: E402
from agents.commands import leaderboard  # noqa: E402
from tests.conftest import child_pids, process_running  # noqa: E402
from morca_env.observation import SCALAR_NAMES  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BOARD = ROOT / "leaderboard" / "tiny"  # the project's own board: its run records are committed


def run(method, seed, scores, family="offline", dataset="mixture", rule=None):
    return {"family": family, "method": method, "dataset": dataset, "seed": seed, "rule": rule, "train_s": 1.0,
            "scores": {t: {"normalized": v, "psnr": 20.0 + v / 10, "projected": 0.0} for t, v in zip(("2", "3"), scores)}}


def test_the_page_ranks_complete_methods_by_iqm(tmp_path):
    results = [run("A", s, (10.0 * s, 10.0 * s + 5)) for s in range(5)]  # IQM of 0, 5, 10, ... 45
    results += [run("B", s, (100.0, 120.0)) for s in range(5)]
    results += [run("best fixed", 0, (100.0, 100.0), family="rule", dataset="-", rule="best-fixed")]
    results += [run("C", s, (500.0, 500.0)) for s in range(3)]  # 3 of 5 seeds: not ranked yet
    results += [run("coin flip", s, (-100.0, -100.0), family="rule", dataset="-", rule="coin-flip") for s in range(2)]
    for r in results[:4]:
        r["machine"] = "NVIDIA H100, 16 cores"  # a board resumed on another machine says so
    args = argparse.Namespace(seeds=5, pair_step=2, updates=10, episodes=4, online_episodes=2, run_command=None,
                              command="morca leaderboard --seeds 5", n_step=50)
    page = tmp_path / "board.md"
    leaderboard_report.write_page(results, args, page, expected=results + [run("D", 0, (0, 0), dataset="random")],
                                  settings=leaderboard.hyperparameters(50, 2, 10))
    text = page.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [r.split(" | ")[1] for r in rows] == ["B on mixture", "best fixed", "A on mixture"]
    a = np.array([[10.0 * s, 10.0 * s + 5] for s in range(5)])
    middle = np.sort(a.ravel())[2:8]  # the interquartile mean of 10 values: the middle 5 (scipy trims 25% each side)
    iqm = float(rows[2].split(" | ")[3].split(" ")[0])
    assert middle.min() <= iqm <= middle.max()
    assert "Not ranked (seeds still running): C on mixture, coin flip" in text and "Top: **B on mixture**." in text
    assert "Not run yet (rerun the command to continue): D on random" in text
    assert "Made on (runs per machine; train s / run depend on it): NVIDIA H100, 16 cores: 4; not recorded: 12." in text
    assert "`morca leaderboard --seeds 5`" in text and (tmp_path / "board.png").stat().st_size > 1000
    settings = dict(line.split(" | ")[:2] for line in text.splitlines() if line.startswith("| D"))
    assert "gamma 1" in settings["| DiscreteCQL"] and "target sync every 8000" in settings["| DiscreteCQL"]
    assert "n-step" not in settings["| DiscreteBC"]  # no value target
    iql = next(line for line in text.splitlines() if line.startswith("| IQL (MORCA) |"))
    assert "critic and value share an encoder" in iql  # the board's IQL, not the paper's four networks


def test_a_methods_interval_depends_on_its_own_runs_alone(tmp_path):
    """The page remade from the same runs is the same page; a method completed later leaves the others' digits."""
    rng = np.random.default_rng(1)
    results = [run(m, s, tuple(rng.normal(50, 30, 2))) for m in ("A", "B") for s in range(5)]
    args = argparse.Namespace(seeds=5, pair_step=2, updates=10, episodes=4, online_episodes=2, run_command=None,
                              command="morca leaderboard", n_step=50)

    def rows(runs, name):
        np.random.seed(len(name))  # another process starts elsewhere in numpy's global stream
        page = tmp_path / name
        leaderboard_report.write_page(runs, args, page)
        return {line.split(" | ")[1]: line.split(" | ")[3:6] for line in page.read_text().splitlines()
                if line.startswith("| ") and line[2].isdigit()}

    first = rows(results, "one.md")
    assert first == rows(results, "second.md")
    more = rows(results + [run("C", s, tuple(rng.normal(0, 30, 2))) for s in range(5)], "three.md")
    assert more["A on mixture"] == first["A on mixture"] and more["B on mixture"] == first["B on mixture"]
    assert "C on mixture" in more


@pytest.mark.slow  # about 60 s on one core: kept out of the default suite (about 13 min)
def test_rule_runs_are_written_once_and_a_rerun_resumes(tmp_path, monkeypatch):
    # three of the rules (the exact-K threshold rules replay each run and took most of this test's 86 s): the
    # bar, a plain rule and the shipped scheduler, loaded in the job's own process
    monkeypatch.setattr(leaderboard, "RULES", {k: v for k, v in leaderboard.RULES.items()
                                               if v in ("uniform", "best-fixed", "morca")})
    out, page = tmp_path / "lb", tmp_path / "page.md"
    argv = ["--only", "rules", "--seeds", "1", "--pair-step", "40", "--workers", "1", "--out", str(out),
            "--page", str(page)]
    stale = out / "train" / "best_fixed_____s0"  # what an interrupted run of the job left
    stale.mkdir(parents=True)
    assert leaderboard.main(argv) == 0
    assert not stale.exists()  # a written run's resume state is spent
    files = sorted((out / "runs").glob("*.json"))
    assert len(files) == len(leaderboard.RULES) == 3
    best = json.loads((out / "runs" / "best_fixed_____s0.json").read_text())
    assert best["machine"].endswith(f", {os.cpu_count()} cores")
    # 100 up to float rounding: batched kernels round differently across machines (the shipped references' PSNR
    # and this run's agree to ~1e-4 dB, a few 1e-6 of the normalized scale)
    assert all(s["normalized"] == pytest.approx(100.0, abs=0.01) for s in best["scores"].values())
    stamps = [f.stat().st_mtime_ns for f in files]
    assert leaderboard.main(argv) == 0  # nothing left to run: the same files, the page rewritten
    assert [f.stat().st_mtime_ns for f in files] == stamps
    assert "morca leaderboard --only rules" in page.read_text()
    whole = (out / "command.txt").read_text()
    assert leaderboard.main(argv + ["--methods", "uniform"]) == 0  # a subset continues the board
    assert (out / "command.txt").read_text() == whole  # the page still names the command that makes all of it


def test_the_pages_command_leaves_out_the_machines_worker_count():
    assert leaderboard.board_command(["--out", "b", "--workers", "2", "--updates", "8"]) == \
        "morca leaderboard --out b --updates 8"
    assert leaderboard.board_command(["--workers=1", "--seeds", "5", "--device", "cuda"]) == \
        "morca leaderboard --seeds 5"


def test_a_report_states_the_runs_settings_and_counts_no_file_being_written(tmp_path, monkeypatch):
    """`--report` alone writes the page with the settings the runs were made with (not the command's defaults), and a
    run file caught mid-write (or left by a writer killed before its rename) is not a run."""
    out = tmp_path / "board"
    (out / "runs").mkdir(parents=True)
    (out / "settings.json").write_text(json.dumps({"episodes": 40, "updates": 8, "online_episodes": 6,
                                                   "pair_step": 2, "curve_points": 4, "n_step": 50}))
    record = (ROOT / "leaderboard" / "tiny" / "runs" / "uniform_____s0.json").read_text()
    (out / "runs" / "uniform_____s0.json").write_text(record)
    (out / "runs" / ".uniform_____s0.json.k2j4.tmp.json").write_text(record)
    page = tmp_path / "page.md"
    assert leaderboard.main(["--out", str(out), "--report", "--page", str(page)]) == 0
    text = page.read_text()
    assert "offline 8 gradient updates" in text and "first 40 episodes" in text and "online 6 environment" in text
    assert "| uniform | 1 |" in text and f"one JSON record each in `{out / 'runs'}`" in text
    monkeypatch.setattr(leaderboard, "find_spec", lambda name: None if name == "rliable" else object())
    with pytest.raises(SystemExit, match="the page needs rliable .*1 finished runs are in"):
        leaderboard.main(["--out", str(out), "--report", "--page", str(page)])


def test_methods_picks_those_entries_only():
    from types import SimpleNamespace

    args = SimpleNamespace(only=["rules", "offline", "online"], seeds=2, datasets=["random", "anchored"],
                           tracks=["full", "scalars"], methods=["IQL (MORCA)", "IQL offline-to-online"])
    runs = leaderboard.jobs(args)
    assert {j["method"] for j in runs} == {"IQL (MORCA)", "IQL offline-to-online"}
    assert len(runs) == 2 * 2 * 2 + 2 * 2  # offline: datasets x tracks x seeds; the recipe: tracks x seeds
    with pytest.raises(SystemExit):
        leaderboard.main(["--methods", "IQL", "--report"])  # not a method: argparse names the valid ones


def test_the_floor_rules_are_on_the_board_and_the_seeded_ones_run_per_seed():
    from types import SimpleNamespace

    runs = leaderboard.jobs(SimpleNamespace(only=["rules"], seeds=3, datasets=["mixture"]))
    seeds = {rule: sorted(j["seed"] for j in runs if j["rule"] == rule) for rule in leaderboard.RULES.values()}
    assert seeds["coin-flip"] == seeds["random"] == [0, 1, 2]
    assert seeds["always-recompute"] == seeds["always-reuse"] == seeds["uniform"] == [0]


def test_a_rerun_with_other_settings_is_refused_before_any_run(tmp_path):
    out = tmp_path / "lb"
    out.mkdir()
    (out / "settings.json").write_text(json.dumps({"episodes": 400, "updates": 1000, "online_episodes": 48,
                                                   "pair_step": 40}))  # a board from before learning curves
    with pytest.raises(SystemExit, match=r"other settings \(--pair-step 40 -> 20\)"):
        leaderboard.main(["--only", "rules", "--pair-step", "20", "--curve-points", "0", "--n-step", "1",
                          "--out", str(out),
                          "--page", str(tmp_path / "p.md")])
    with pytest.raises(SystemExit, match=r"other settings \(--curve-points 0 -> 4\)"):  # it had no curves
        leaderboard.main(["--only", "rules", "--pair-step", "40", "--n-step", "1", "--out", str(out),
                          "--page", str(tmp_path / "p.md")])
    assert not list((out / "runs").glob("*.json"))


def test_a_second_writer_of_one_out_is_refused(tmp_path):
    from morca_env.utils.io import exclusive_lock

    out = tmp_path / "lb"
    with exclusive_lock(out / ".lock", "the first leaderboard"):
        with pytest.raises(RuntimeError, match="being written by another process"):
            leaderboard.main(["--only", "rules", "--out", str(out), "--page", str(tmp_path / "p.md")])


@pytest.mark.parametrize("content", ["{not json", json.dumps({"scores": {"2": {"normalized": float("nan"), "psnr": 30}}}),
                                     json.dumps({"scores": []}), json.dumps([1, 2])])
def test_a_damaged_or_non_finite_run_file_is_named_and_not_counted_as_done(tmp_path, capsys, content):
    path = tmp_path / "run.json"
    path.write_text(content)
    assert leaderboard.finished_run(path) is None
    assert str(path) in capsys.readouterr().err


def test_a_run_not_made_yet_is_to_do_without_a_word(tmp_path, capsys):
    assert leaderboard.finished_run(tmp_path / "run.json") is None
    assert capsys.readouterr().err == ""


def test_failed_runs_give_a_non_zero_exit(tmp_path, monkeypatch):
    monkeypatch.setattr(leaderboard, "RULES", {"a rule that does not exist": "no-such-rule"})
    code = leaderboard.main(["--only", "rules", "--seeds", "1", "--workers", "1", "--out", str(tmp_path / "lb"),
                             "--page", str(tmp_path / "p.md")])
    assert code == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_leaderboard_killed_9_takes_its_workers_with_it(tmp_path):
    import os
    import signal
    import subprocess
    import time

    code = ("import sys; from agents.commands import leaderboard; leaderboard.RULES = {'uniform': 'uniform'}; "
            f"sys.exit(leaderboard.main(['--only', 'rules', '--seeds', '1', '--pair-step', '1', '--workers', '1', "
            f"'--out', {str(tmp_path / 'lb')!r}, '--page', {str(tmp_path / 'p.md')!r}]))")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, "MORCA_CACHE_DIR": str(tmp_path / "cache")})
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not any(
                b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes() for c in child_pids(parent.pid)
                if Path(f"/proc/{c}/cmdline").exists()):
            time.sleep(0.5)
        time.sleep(3)  # the worker is in its run (importing, then playing the suite)
        children = child_pids(parent.pid)
        assert children, "the leaderboard started no worker"
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.time() + 60  # an orphaned spawn child arms its death signal after its imports (~7 s idle)
        while time.time() < deadline and any(process_running(c) for c in children):
            time.sleep(0.5)
        alive = [c for c in children if process_running(c)]
        assert not alive, f"workers {alive} outlived their killed leaderboard"
    finally:
        if parent.poll() is None:
            parent.kill()


def test_the_papers_recipe_trains_on_the_quickstarts_data_when_the_board_has_it():
    def recipe_runs(datasets):
        args = argparse.Namespace(only=["offline", "online"], seeds=1, datasets=datasets, tracks=["scalars"])
        return {j["dataset"] for j in leaderboard.jobs(args) if j["method"] == "IQL offline-to-online"}

    assert recipe_runs(["random", "anchored"]) == {"anchored"}
    assert recipe_runs(["random", "mixture"]) == {"random"}  # else the first dataset, the one completed first


def test_learned_methods_run_on_each_track_and_full_track_runs_keep_their_names():
    args = argparse.Namespace(only=["rules", "offline", "online"], seeds=1, datasets=["random"],
                              tracks=["full", "scalars"])
    runs = leaderboard.jobs(args)
    learned = [j for j in runs if j["family"] != "rule"]
    assert {j["track"] for j in runs if j["family"] == "rule"} == {"-"}  # one rule run serves both tracks
    assert len(learned) == 2 * (len(leaderboard.OFFLINE) + len(leaderboard.ONLINE))
    full = next(j for j in learned if j["method"] == "DiscreteCQL" and j["track"] == "full")
    assert leaderboard.run_name(full) == "DiscreteCQL__random__s0"  # a board made before tracks resumes
    assert leaderboard.run_name({**full, "track": "scalars"}) == "DiscreteCQL__random__s0__scalars"
    assert leaderboard_report.label_of({**full, "track": "scalars"}) == "DiscreteCQL on random [scalars]"


@pytest.fixture
def two_episodes(tmp_path, monkeypatch):
    """Two MorcaTinyRandom episodes collected into a temp Minari root (the offline runs' data, small)."""
    from morca_env.data import collect_dataset

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    monkeypatch.setenv("MORCA_CACHE_DIR", str(tmp_path / "cache"))
    return collect_dataset("test/tiny/board-v0", "MorcaTinyRandom-v0", 2, env_kwargs={
        "speedup": [1.5, 3.0], "lpips": False, "num_inference_steps": 10}, behavior={"name": "threshold-curve"},
        progress=False)


@pytest.fixture
def two_episode_buffer(two_episodes):
    from morca_env.data import to_replay_buffer

    return lambda track="full", n_step=1: to_replay_buffer(two_episodes, track=None if track == "full" else track,
                                                           n_step=n_step)


def test_a_scalars_track_run_trains_on_the_tracks_observations_and_plays_on_its_env(monkeypatch, two_episodes):
    from morca_env.data import to_replay_buffer

    data = two_episodes
    seen = []

    def buffer_of(dataset, episodes, track="full", n_step=1):
        seen.append(track)
        return to_replay_buffer(data, track=None if track == "full" else track)

    monkeypatch.setattr(leaderboard, "ENV_ID", "MorcaTinyRandom-v0")
    monkeypatch.setattr(leaderboard, "buffer_of", buffer_of)
    args = argparse.Namespace(episodes=2, updates=2, pair_step=4)
    job = {"family": "offline", "method": "DiscreteCQL", "dataset": "random", "seed": 0, "track": "scalars"}
    record = leaderboard.run_job(job, args)
    assert seen == ["scalars"] and record["track"] == "scalars" and record["played_on"] == "scalars"
    trained = []
    original = leaderboard.offline_algo
    monkeypatch.setattr(leaderboard, "offline_algo", lambda *a, **k: trained.append(original(*a, **k)) or trained[-1])
    iql = leaderboard.run_job({**job, "method": "IQL (MORCA)"}, args)  # the MORCA network, its latent branch off
    assert seen[-1] == "full" and iql["played_on"] == "full"
    config = trained[-1].algo.config
    assert config.shared_critic_encoder and config.critic_encoder_factory.features == ""
    assert not trained[-1].reads_latents


def test_the_value_methods_learn_from_the_boards_return_horizon_with_the_envs_discount(tmp_path, monkeypatch,
                                                                                         two_episodes):
    from morca_env.data import to_replay_buffer

    data = two_episodes
    horizons, trained = [], []

    def buffer_of(dataset, episodes, track="full", n_step=1):
        horizons.append(n_step)
        return to_replay_buffer(data, track=None if track == "full" else track, n_step=n_step)

    original = leaderboard.offline_algo
    monkeypatch.setattr(leaderboard, "ENV_ID", "MorcaTinyRandom-v0")
    monkeypatch.setattr(leaderboard, "buffer_of", buffer_of)
    monkeypatch.setattr(leaderboard, "offline_algo", lambda *a, **k: trained.append(original(*a, **k)) or trained[-1])
    args = argparse.Namespace(episodes=2, updates=2, pair_step=4, n_step=50)
    leaderboard.run_job({"family": "offline", "method": "DQN (offline)", "dataset": "random", "seed": 0,
                         "track": "scalars"}, args)
    assert horizons == [50] and trained[-1].config.gamma == 1.0  # d3rlpy's default is 0.99
    calls = []  # the paper's recipe: its curve starts at its offline phase alone, then a point per online round
    leaderboard.online_policy({"family": "online", "method": "IQL offline-to-online", "dataset": "random", "seed": 0,
                               "track": "full"}, argparse.Namespace(online_episodes=2, **vars(args)),
                              tmp_path / "o2o", [1, 2], lambda policy, count: calls.append(count))
    assert calls == [0, 1, 2] and horizons == [50, 50]
    with pytest.raises(SystemExit):
        leaderboard.main(["--n-step", "0", "--out", str(tmp_path / "lb")])


def test_the_sb3_methods_learn_with_the_envs_discount(tmp_path, monkeypatch):
    pytest.importorskip("sb3_contrib")
    monkeypatch.setattr(leaderboard, "ENV_ID", "MorcaTinyRandom-v0")
    args = argparse.Namespace(online_episodes=1, updates=6, pair_step=4, episodes=2, out=str(tmp_path))
    for method in ("MaskablePPO", "DQN (sb3)"):
        job = {"family": "online", "method": method, "dataset": "-", "seed": 0, "track": "scalars"}
        assert leaderboard.online_policy(job, args, tmp_path / method).gamma == 1.0  # sb3's default is 0.99


def test_a_board_from_before_the_return_horizon_continues_only_with_one_step_td(tmp_path):
    out = tmp_path / "lb"
    out.mkdir()
    (out / "settings.json").write_text(json.dumps({"episodes": 400, "updates": 1000, "online_episodes": 48,
                                                   "pair_step": 40, "curve_points": 0}))
    with pytest.raises(SystemExit, match=r"other settings \(--n-step 1 -> 50\)"):
        leaderboard.main(["--only", "rules", "--pair-step", "40", "--curve-points", "0", "--out", str(out),
                          "--page", str(tmp_path / "p.md")])
    leaderboard.check_fingerprint(out, argparse.Namespace(episodes=400, updates=1000, online_episodes=48,
                                                          pair_step=40, curve_points=0, n_step=1))


@pytest.mark.parametrize("method,played_on", [("MaskablePPO", "scalars"), ("DQN (sb3)", "scalars"),
                                             ("REINFORCE", "full"), ("IQL online (scratch)", "full")])
def test_online_methods_on_the_scalars_track(method, played_on, tmp_path, monkeypatch):
    pytest.importorskip("sb3_contrib")
    monkeypatch.setattr(leaderboard, "ENV_ID", "MorcaTinyRandom-v0")
    args = argparse.Namespace(online_episodes=2, updates=6, pair_step=4, episodes=2, out=str(tmp_path),
                              n_step=3)  # the board's n-step returns (sb3's DQN takes them only from a flat Box)
    job = {"family": "online", "method": method, "dataset": "-", "seed": 0, "track": "scalars"}
    calls = []
    policy = leaderboard.online_policy(job, args, tmp_path / "run", [1, 2], lambda model, n: calls.append(n))
    if method == "MaskablePPO":  # sb3 trained on the scalars track's Dict, in chunks for its learning curve
        assert set(policy.observation_space.spaces) == {"scalars", "action_mask"}
        assert calls == [1, 2] and policy.num_timesteps >= 2 * 10
    elif method == "DQN (sb3)":  # the scalars track's flat layout, mask inside, with the board's n-step returns
        assert policy.observation_space.shape == (len(SCALAR_NAMES) + 2,) and policy.n_steps == 3
    elif method == "REINFORCE":  # the MORCA policy network with its latent branch off: the paper's scalar state
        assert policy.network.trunk.branch3d is None and policy.network.trunk.branch2d is None
        assert calls == [2]  # its one update (of up to 8 episodes) passed both checkpoints: one point
    else:  # a point per round: 2 episodes in 2 rounds
        assert calls == [1, 2]
    assert leaderboard.run_job(job, args)["played_on"] == played_on


def test_only_the_morca_iql_runs_train_on_the_boards_device(tmp_path, monkeypatch):
    """`--device cuda` moves the IQL runs (20x the MLP algorithms' update cost) to the GPU, offline and online; the
    other methods stay on the CPU, where their updates take milliseconds."""
    import types

    import agents
    import agents.online

    seen = {}

    class Config:
        def __init__(self, method):
            self.method = method

        def create(self, device):
            seen[self.method] = device
            return types.SimpleNamespace(fit=lambda *a, **k: None)

    monkeypatch.setattr(leaderboard, "offline_config", lambda method, track="full", gamma=1.0: Config(method))
    monkeypatch.setattr(agents, "MorcaPolicy", lambda algo: algo)
    for method in ("IQL (MORCA)", "DiscreteCQL"):
        leaderboard.offline_algo(method, None, 4, 0, device="cuda:3")
    assert seen == {"IQL (MORCA)": "cuda:3", "DiscreteCQL": "cpu"}

    class Built(Exception):
        pass

    def trainer(*args, device, **kwargs):
        seen["online"] = device
        raise Built

    monkeypatch.setattr(agents.online, "OnlineTrainer", trainer)
    monkeypatch.setattr(leaderboard, "ENV_ID", "MorcaTinyRandom-v0")
    args = argparse.Namespace(online_episodes=2, updates=6, episodes=2, n_step=3, device="cuda:3")
    job = {"family": "online", "method": "IQL online (scratch)", "dataset": "-", "seed": 0, "track": "scalars"}
    with pytest.raises(Built):
        leaderboard.online_policy(job, args, tmp_path / "run")
    assert seen["online"] == "cuda:3"


def test_a_device_this_machine_lacks_is_refused_naming_the_valid_ones(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(SystemExit) as exit_:
        leaderboard.main(["--device", "cuda", "--out", str(tmp_path / "board")])
    assert exit_.value.code == 2 and "'cuda': this machine has no CUDA device; valid here: cpu" in capsys.readouterr().err
    assert not (tmp_path / "board").exists()


def test_curve_checkpoints_double_up_to_the_budget():
    assert leaderboard.curve_points(1000, 4) == [125, 250, 500, 1000]
    assert leaderboard.curve_points(48, 4) == [6, 12, 24, 48]
    assert leaderboard.curve_points(3, 4) == [1, 3] and leaderboard.curve_points(10, 0) == []


def test_the_validation_pairs_are_disjoint_from_every_slice_the_board_trains_fits_or_selects_on():
    from morca_env.data import CollectionRecipe
    from morca_env.evaluation import benchmark
    from morca_env.models.presets import get_preset
    from morca_env.prompts import get_suite

    validation = {p for p, _ in get_suite(leaderboard.VALIDATION_PROMPTS).pairs()}
    assert len(validation) == 8
    prompts = get_preset("tiny").prompts
    used = [benchmark.suite_of("MorcaTiny-v0").train_pool, benchmark.suite_of("MorcaTiny-v0").prompts,
            prompts.fit_fixed, prompts.select_on, prompts.anchor, prompts.trainers]
    used += [CollectionRecipe.from_file(d).env_kwargs["prompts"] for d in leaderboard.DATASETS.values()]
    used += ["tiny-train[5::22]"]  # the anchored data
    for spec in used:
        assert not validation & {p for p, _ in get_suite(spec).pairs()}, spec


def test_a_learned_run_records_its_learning_curve_on_validation_pairs(tmp_path, monkeypatch, two_episodes):
    from morca_env import schedulers
    from morca_env.data import to_replay_buffer
    from morca_env.evaluation import benchmark

    monkeypatch.setattr(leaderboard, "ENV_ID", "MorcaTinyRandom-v0")
    data = two_episodes
    monkeypatch.setattr(leaderboard, "buffer_of",
                        lambda dataset, episodes, track="full", n_step=1: to_replay_buffer(data))
    env = benchmark.make_env("MorcaTinyRandom-v0", leaderboard.validation_suite())
    refs = benchmark.measure_references("MorcaTinyRandom-v0", env=env, best_fixed=schedulers.make("uniform", env),
                                        suite=leaderboard.validation_suite(), progress=False)
    env.close()
    args = argparse.Namespace(episodes=2, updates=4, pair_step=4, curve_points=2, validation_references=refs)
    record = leaderboard.run_job({"family": "offline", "method": "DiscreteCQL", "dataset": "random", "seed": 0,
                                  "track": "full"}, args)
    assert [p["x"] for p in record["curve"]] == [2, 4] and record["curve_x"] == "gradient updates"
    assert all(np.isfinite(p["normalized"]) and set(p["per_target"]) == {"2", "3"} for p in record["curve"])


def test_the_page_shows_the_curves_and_whether_each_reached_a_plateau(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    def with_curve(method, seed, points):
        return {**run(method, seed, (0.0, 0.0)), "curve": [{"x": x, "normalized": v} for x, v in points]}

    results = [with_curve("Flat", s, [(1, 10.0 + s), (2, 50.0 + s), (4, 51.0 + s)]) for s in range(3)]
    results += [with_curve("Rising", s, [(1, 0.0 + s), (2, 20.0 + s), (4, 60.0 + s)]) for s in range(3)]
    results += [{**with_curve("Falling", s, [(1, 90.0 + s), (2, 60.0 + s)]), "track": "scalars"} for s in range(3)]
    args = argparse.Namespace(seeds=3, pair_step=2, updates=4, episodes=4, online_episodes=2, run_command=None,
                              command="morca leaderboard")
    page = tmp_path / "board.md"
    panels = []
    subplots = plt.subplots

    def counting_subplots(*shape, **kwargs):
        panels.append(shape)
        return subplots(*shape, **kwargs)

    monkeypatch.setattr(plt, "subplots", counting_subplots)
    leaderboard_report.write_page(results, args, page)
    rows = {line.split(" | ")[1]: line.split(" | ")[-1].strip(" |") for line in page.read_text().splitlines()
            if line.startswith("| ") and line[2].isdigit()}
    assert rows == {"Flat on mixture": "yes", "Rising on mixture": "no, rising",
                    "Falling on mixture [scalars]": "no, falling"}
    assert (tmp_path / "board_curves.png").stat().st_size > 1000
    assert panels == [(1, 2), (1, 2)]  # the profile and the curves: a panel per observation track (one family)


def test_a_learned_entry_that_plays_a_rules_schedule_is_named_on_its_row(tmp_path):
    def psnr_run(method, seed, psnr, family="offline", dataset="random", rule=None):
        return {**run(method, seed, (0.0, 0.0), family=family, dataset=dataset, rule=rule),
                "scores": {t: {"normalized": 0.0, "psnr": p, "projected": 0.0} for t, p in zip(("2", "3"), psnr)}}

    results = [psnr_run("always recompute (masked)", 0, (16.3, 15.5), "rule", "-", "always-recompute"),
               psnr_run("always reuse (masked)", 0, (19.2, 16.4), "rule", "-", "always-reuse")]
    results += [psnr_run("random feasible", s, (27.0 + s, 23.0), "rule", "-", "random") for s in range(2)]
    results += [psnr_run("Collapsed", s, (16.3, 15.5 + 1e-4 * s)) for s in range(2)]
    results += [psnr_run("Almost", s, (16.3, 15.5 + 0.01 * s)) for s in range(2)]  # one run plays something else
    results += [psnr_run("Random-like", s, (27.0 + s, 23.0)) for s in range(2)]  # a seeded rule is no one schedule
    args = argparse.Namespace(seeds=2, pair_step=2, updates=4, episodes=4, online_episodes=2, run_command=None,
                              command="morca leaderboard")
    page = tmp_path / "board.md"
    leaderboard_report.write_page(results, args, page)
    header = next(line for line in page.read_text().splitlines() if line.startswith("| rank |")).split(" | ")
    column = header.index("plays")
    plays = {line.split(" | ")[1]: line.split(" | ")[column] for line in page.read_text().splitlines()
             if line.startswith("| ") and line[2].isdigit()}
    assert plays["Collapsed on random"] == "always recompute (masked)"
    assert plays["Almost on random"] == "-" and plays["Random-like on random"] == "-"
    assert plays["always reuse (masked)"] == "-"  # a rule's own row



def test_the_committed_run_records_are_whole_runs_of_the_board_under_their_own_names():
    """The board is made over many sessions and machines from the records in the repository, and its page from
    them alone: each record must be a finished run of the board's own jobs, made with the settings the page states
    and the command it gives."""
    settings = json.loads((BOARD / "settings.json").read_text())
    command = (BOARD / "command.txt").read_text().strip()
    assert command.startswith("morca leaderboard --out leaderboard/tiny ")
    for key in ("updates", "online_episodes", "curve_points"):  # the page's command makes these runs
        assert f"--{key.replace('_', '-')} {settings[key]}" in command, key
    page = (ROOT / "docs" / "results" / "leaderboard_tiny.md").read_text()
    assert (f"offline {settings['updates']} gradient updates" in page
            and f"first {settings['episodes']} episodes" in page
            and f"online {settings['online_episodes']} environment episodes" in page)
    args = argparse.Namespace(only=["rules", "offline", "online"], datasets=["random", "anchored"], seeds=5,
                              tracks=["full", "scalars"], methods=None)
    names = {leaderboard.run_name(job) for job in leaderboard.jobs(args)}
    records = sorted((BOARD / "runs").glob("[!.]*.json"))  # not a file being written
    assert records, "no run record is committed"
    for path in records:
        record = leaderboard.finished_run(path)
        assert record is not None and path.stem in names and leaderboard.run_name(record) == path.stem, path.name
        assert set(record["scores"]) == {"2", "2.5", "3"} and record["machine"], path.name
        if record["family"] == "offline":
            assert record["budget"] == f"{settings['updates']} updates on {settings['episodes']} episodes", path.name
        elif record["family"] == "online":
            assert record["budget"].startswith(f"{settings['online_episodes']} env episodes"), path.name


class Stop(Exception):
    pass


@pytest.mark.parametrize("method", ["DiscreteCQL", "IQL (MORCA)"])
def test_an_offline_run_stopped_after_a_checkpoint_continues_from_its_networks(tmp_path, method, two_episode_buffer,
                                                                             monkeypatch):
    """A board stopped mid-run (a session ends) loses only the updates since the run's last checkpoint."""
    import torch

    buffer = two_episode_buffer("scalars" if method == "DiscreteCQL" else "full")
    run_dir = tmp_path / "train" / "run"
    saved = {}

    def stop_at_the_second(policy, count):
        algo = getattr(policy, "algo", policy)
        if count == 2:
            saved.update({k: v.clone() for k, v in algo.impl.modules.q_funcs[0].state_dict().items()})
        else:
            raise Stop

    with pytest.raises(Stop):
        leaderboard.offline_algo(method, buffer, 4, 0, "scalars", (2, 4), stop_at_the_second, run_dir=run_dir)
    assert json.loads((run_dir / leaderboard.OFFLINE_STATE).read_text())["updates"] == 2
    loaded, points = {}, []
    original = leaderboard._resume_offline

    def resume(algo, *args):
        done = original(algo, *args)
        loaded.update({k: v.clone() for k, v in algo.impl.modules.q_funcs[0].state_dict().items()})
        return done

    monkeypatch.setattr(leaderboard, "_resume_offline", resume)
    policy = leaderboard.offline_algo(method, buffer, 4, 0, "scalars", (2, 4),
                                      lambda p, count: points.append((count, getattr(p, "algo", p).grad_step)),
                                      run_dir=run_dir)
    assert points == [(4, 4)]  # 2 updates more, counted from the run's first
    assert saved.keys() == loaded.keys() and all(torch.equal(saved[k], loaded[k]) for k in saved)
    assert [p.name for p in run_dir.glob("model_*.d3")] == ["model_4.d3"]
    assert getattr(policy, "algo", policy).grad_step == 4
    monkeypatch.setattr(leaderboard, "_resume_offline", original)
    state = json.loads((run_dir / leaderboard.OFFLINE_STATE).read_text())
    (run_dir / leaderboard.OFFLINE_STATE).write_text(json.dumps({**state, "updates": 9}))
    with pytest.raises(ValueError, match=r"holds 9 updates; valid: 1\.\.4"):
        leaderboard.offline_algo(method, buffer, 4, 0, "scalars", run_dir=run_dir)
    (run_dir / leaderboard.OFFLINE_STATE).write_text(json.dumps({**state, "updates": 2, "config": "{}"}))
    points.clear()  # another config's networks are not loaded: the run starts over
    leaderboard.offline_algo(method, buffer, 4, 0, "scalars", (2, 4), lambda p, count: points.append(count),
                             run_dir=run_dir)
    assert points == [2, 4]


def test_a_resumed_run_keeps_its_curve_and_seconds_so_far(tmp_path, two_episode_buffer, monkeypatch):
    calls = []

    class Counted:
        def __init__(self, references):
            pass

        def __call__(self, policy):
            calls.append(policy)
            if len(calls) == 2:
                raise Stop  # the board stops while the second point is measured
            return {"normalized": float(len(calls)), "per_target": {}}

        def close(self):
            pass

    monkeypatch.setattr(leaderboard, "ENV_ID", "MorcaTinyRandom-v0")
    monkeypatch.setattr(leaderboard, "Validation", Counted)
    monkeypatch.setattr(leaderboard, "buffer_of", lambda dataset, episodes, track="full", n_step=1:
                        two_episode_buffer(track))
    args = argparse.Namespace(episodes=2, updates=4, pair_step=4, curve_points=2, validation_references={},
                              out=str(tmp_path))
    job = {"family": "offline", "method": "DiscreteBC", "dataset": "random", "seed": 0, "track": "scalars"}
    with pytest.raises(Stop):
        leaderboard.run_job(job, args)
    before = json.loads((tmp_path / "train" / leaderboard.run_name(job) / leaderboard.PROGRESS).read_text())
    assert [p["x"] for p in before["curve"]] == [2] and before["train_s"] > 0
    record = leaderboard.run_job(job, args)
    assert [(p["x"], p["normalized"]) for p in record["curve"]] == [(2, 1.0), (4, 3.0)]
    assert len(calls) == 3 and record["train_s"] > before["train_s"] and record["eval_s"] >= before["eval_s"]
