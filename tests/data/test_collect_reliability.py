"""Collection: behaviour names, dataset ids, worker errors, orphans, replay-buffer defaults."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import morca_env.data as data
from morca_env.data import build, collect as collecting
from morca_env.data import collect_dataset, staging_root, to_replay_buffer
from tests.conftest import child_pids, process_running

ROOT = Path(__file__).resolve().parents[2]
ENV_KWARGS = {"speedup": [1.5, 3.0], "lpips": False, "num_inference_steps": 10, "latent_features": False}


@pytest.fixture
def roots(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    monkeypatch.setenv("MORCA_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def collect(dataset_id, n, behavior="random", **kwargs):
    return collect_dataset(dataset_id, "MorcaTinyRandom-v0", n, env_kwargs=ENV_KWARGS, behavior=behavior,
                           progress=False, **kwargs)


def test_a_behaviour_name_string_works_in_the_api_and_the_cli(roots):
    assert collect("test/tiny/name-v0", 1, behavior="uniform").total_episodes == 1
    recipe = roots / "recipe.json"
    recipe.write_text(json.dumps({"dataset_id": "test/tiny/cli-v0", "env_id": "MorcaTinyRandom-v0", "num_episodes": 1,
                                  "env_kwargs": ENV_KWARGS, "behavior": "random"}))
    out = subprocess.run([sys.executable, "-m", "morca_env.commands", "collect", str(recipe)], cwd=roots,
                         capture_output=True, text=True, timeout=300, env={**os.environ})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "dataset test/tiny/cli-v0: 1 episodes" in out.stdout


def test_a_bad_dataset_id_is_refused_before_collecting_and_no_build_dir_is_left(roots, monkeypatch):
    with pytest.raises(ValueError, match="dataset_id='test/tiny/noversion' is not a Minari dataset id"):
        collect("test/tiny/noversion", 2)
    assert not (roots / "cache" / "collect").exists()
    real = build._create_dataset
    monkeypatch.setattr(build, "_create_dataset", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        collect("test/tiny/build-v0", 2)
    assert not list((roots / "minari").glob(".morca-build-*"))
    monkeypatch.setattr(build, "_create_dataset", real)
    assert collect("test/tiny/build-v0", 2).total_episodes == 2  # the staged episodes are used


def test_a_workers_own_error_reaches_the_user(roots, monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("the behaviour exploded at step 3")

    monkeypatch.setattr(collecting, "record_episode", broken)  # workers fork (threads=1 on Linux) and inherit it
    with pytest.raises(RuntimeError, match="collection failed: ValueError: the behaviour exploded at step 3"):
        collect("test/tiny/workers-v0", 4, workers=2)


def test_a_corrected_behaviour_name_reruns_under_the_same_id(roots):
    with pytest.raises(ValueError, match="behavior=.*'randm'.*valid: .*random, .*threshold-curve"):
        collect("test/tiny/typo-v0", 1, behavior={"name": "randm"})
    assert collect("test/tiny/typo-v0", 1, behavior={"name": "random"}).total_episodes == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_exit_when_the_collecting_parent_is_killed(roots):
    code = ("from morca_env.data import collect_dataset\n"
            f"collect_dataset('test/tiny/orphan-v0', 'MorcaTinyRandom-v0', 400, env_kwargs={ENV_KWARGS!r}, "
            "behavior='random', workers=2, progress=False)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=roots, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ})
    staging = staging_root() / "test/tiny/orphan-v0" / "episodes"
    deadline = time.time() + 240
    while time.time() < deadline and len(list(staging.glob("ep_*.npz"))) < 2:
        time.sleep(0.1)
    workers = child_pids(proc.pid)
    assert len(workers) == 2, "the workers must be running"
    proc.kill()
    proc.wait()
    deadline = time.time() + 20
    while time.time() < deadline and any(process_running(w) for w in workers):
        time.sleep(0.1)
    survivors = [w for w in workers if process_running(w)]
    for w in survivors:
        os.kill(w, signal.SIGKILL)
    assert not survivors, "collection workers outlived their parent"


def test_the_default_replay_buffer_works_with_d3rlpys_own_algorithms(roots):
    import d3rlpy

    from agents.iql import DiscreteIQLConfig

    dataset = collect("test/tiny/cql-v0", 2)
    cql = d3rlpy.algos.DiscreteCQLConfig(batch_size=8).create(device="cpu")
    cql.fit(to_replay_buffer(dataset), n_steps=2, n_steps_per_epoch=2, show_progress=False,
            logger_adapter=d3rlpy.logging.NoopAdapterFactory())
    iql = DiscreteIQLConfig(batch_size=8).create(device="cpu")  # ours takes the default (flat) buffer too
    iql.fit(to_replay_buffer(dataset), n_steps=2, n_steps_per_epoch=2, show_progress=False,
            logger_adapter=d3rlpy.logging.NoopAdapterFactory())
    assert iql.grad_step == 2


@pytest.mark.slow  # about 36 s on one core: kept out of the default suite (about 13 min)
def test_two_collections_of_one_id_never_mix(roots):
    """A second collection of an id that is being collected fails at once, naming the first one's pid;
    the dataset then holds the first run's episodes only."""
    code = (f"from morca_env.data import collect_dataset\n"
            f"collect_dataset('test/tiny/shared-v0', 'MorcaTinyRandom-v0', 150, env_kwargs={ENV_KWARGS!r}, "
            f"behavior='uniform', progress=False)\n")
    first = subprocess.Popen([sys.executable, "-c", code], env={**os.environ}, stderr=subprocess.PIPE, text=True)
    staged = staging_root() / "test" / "tiny" / "shared-v0" / "episodes"
    try:
        deadline = time.time() + 120
        while not list(staged.glob("ep_*.npz")) and time.time() < deadline and first.poll() is None:
            time.sleep(0.1)
        assert list(staged.glob("ep_*.npz")), first.stderr.read() if first.poll() is not None else "no episode"
        with pytest.raises(RuntimeError, match=rf"dataset 'test/tiny/shared-v0' is being written by another process "
                                               rf"\(pid {first.pid}"):
            collect("test/tiny/shared-v0", 150, behavior="random")
        assert first.wait(timeout=300) == 0, first.stderr.read()[-2000:]
    finally:
        first.kill()
    import minari

    dataset = minari.load_dataset("test/tiny/shared-v0")
    assert json.loads(dataset.storage.metadata["morca_recipe"])["behavior"] == {"name": "uniform"}
    assert dataset.total_episodes == 150


def test_a_killed_build_leaves_nothing_behind_and_never_loses_the_old_dataset(roots):
    """Build directories and a dataset moved aside by a rebuild killed midway are cleaned up (or put
    back) by the next run on that id."""
    import minari

    collect("test/tiny/left-v0", 2, behavior="uniform")
    root = roots / "minari"
    final = root / "test" / "tiny" / "left-v0"
    (root / f"{build._build_prefix('test/tiny/left-v0')}dead0000").mkdir()  # a build killed before its rename
    other = root / f"{build._build_prefix('test/tiny/other-v0')}dead0000"
    other.mkdir()  # another id's build: not ours to remove
    final.rename(final.with_name(f".{final.name}.old-dead0000"))  # killed between moving aside and renaming in
    data.recover_leftovers("test/tiny/left-v0")
    assert minari.load_dataset("test/tiny/left-v0").total_episodes == 2  # the old dataset is back
    assert not list(root.glob(build._build_prefix("test/tiny/left-v0") + "*")) and other.exists()
    assert not list(final.parent.glob(".left-v0.old-*"))
    assert collect("test/tiny/left-v0", 3, behavior="uniform", overwrite=True).total_episodes == 3
    assert not [p for p in final.parent.iterdir() if p.name.startswith(".")]


def _flip_one_value(path, dataset_path: str, index: int = 0):
    """Change one stored value of `dataset_path` (e.g. episode_0/rewards) in place, as a flipped bit would."""
    import h5py
    import numpy as np

    with h5py.File(path, "r+") as f:
        data = f[dataset_path]
        values = np.array(data)
        flat = values.reshape(-1)
        flat[index] = flat[index] + 1 if values.dtype != bool else not flat[index]
        data[...] = values


@pytest.mark.parametrize("where", ["rewards", "actions", "observations/scalars"])
def test_a_changed_value_anywhere_in_an_episode_is_caught_naming_file_and_episode(roots, where):
    """One flipped reward loaded silently (16.75 -> 4.19). Every loader of ours now checks each
    episode against the checksum recorded at build time."""
    import minari

    from morca_env.data.integrity import DatasetIntegrityError, verify_dataset

    dataset = collect("test/tiny/sums-v0", 3, behavior="uniform")
    assert verify_dataset(dataset) == 3
    hdf5 = Path(dataset.storage.data_path) / "main_data.hdf5"
    _flip_one_value(hdf5, f"episode_1/{where}", index=2)
    damaged = minari.load_dataset("test/tiny/sums-v0")  # Minari itself loads it without a word
    match = r"episode 1 in .*main_data.hdf5 does not match its recorded checksum"
    with pytest.raises(DatasetIntegrityError, match=match):
        verify_dataset(damaged)
    with pytest.raises(DatasetIntegrityError, match=match):
        to_replay_buffer(damaged)
    assert to_replay_buffer(damaged, episode_indices=[0, 2]).size() == 2  # the intact episodes still load
    with pytest.raises(DatasetIntegrityError, match=match):  # resume does not call it complete
        collect("test/tiny/sums-v0", 3, behavior="uniform")
    from morca_env import commands

    assert commands.main(["verify-dataset", "test/tiny/sums-v0"]) == 1  # a plain minari user's check


def test_a_damaged_staged_episode_is_collected_again(roots, caplog):
    collect("test/tiny/staged-v0", 3, behavior="uniform")
    staged = staging_root() / "test" / "tiny" / "staged-v0" / "episodes" / "ep_000001.npz"
    good = data.read_episode(staged)
    raw = staged.read_bytes()
    staged.write_bytes(raw[: len(raw) // 2])  # a torn file
    with pytest.raises(ValueError, match=r"staged episode .*ep_000001.npz is damaged"):
        data.read_episode(staged)
    dataset = collect("test/tiny/staged-v0", 3, behavior="uniform", overwrite=True)
    assert dataset.total_episodes == 3 and "ep_000001.npz is damaged" in caplog.text
    again = data.read_episode(staged)  # recollected: the same episode (all but its timings)
    assert (again["actions"] == good["actions"]).all() and (again["rewards"] == good["rewards"]).all()
    assert all((again["observations"][k] == v).all() for k, v in good["observations"].items())


def test_replay_buffer_inputs_are_checked(roots):
    collect("test/tiny/inputs-v0", 2, behavior="uniform")
    assert to_replay_buffer("test/tiny/inputs-v0").size() == 2  # an id works as the dataset
    with pytest.raises(ValueError, match=r"episode_indices: \[99\] out of range; valid: distinct indices in \[0, 1\]"):
        to_replay_buffer("test/tiny/inputs-v0", episode_indices=[99])
    with pytest.raises(ValueError, match=r"episode_indices: \[0\] repeated"):
        to_replay_buffer("test/tiny/inputs-v0", episode_indices=[0, 0, 0])
    with pytest.raises(TypeError, match="give a minari.MinariDataset, a dataset id"):
        to_replay_buffer(42)
    collect_dataset("test/tiny/inputs20-v0", "MorcaTinyRandom-v0", 1, env_kwargs={**ENV_KWARGS, "num_inference_steps": 8},
                    behavior="uniform", progress=False)
    with pytest.raises(ValueError, match="different step counts"):
        to_replay_buffer(["test/tiny/inputs-v0", "test/tiny/inputs20-v0"])
