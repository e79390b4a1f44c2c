"""Ray: collection through a local Ray runtime equals the multiprocessing path, survives a killed worker.

The Ray tests share one local runtime (2 CPUs) started by a module fixture: a runtime
start costs ~10 s and each actor ~5-20 s of imports on the 2-core CI machine, so the
tests that start Ray are `slow` (`pytest -m slow tests/data/test_ray_collect.py`; they are
skipped with a reason when ray is not installed). The error-message tests run by default.
"""

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import morca_env.data as data
import morca_env.parallel.workers as workers
from morca_env.data import collect_dataset, completed_indices, read_episode, staging_root

ROOT = Path(__file__).resolve().parents[2]
ENV_KWARGS = {"speedup": [1.5, 3.0], "lpips": False, "num_inference_steps": 10, "latent_features": False}
EPISODES = 6
HAS_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not HAS_RAY, reason='ray is not installed (pip install -e ".[ray]")')


@pytest.fixture(scope="module")
def ray_runtime(tmp_path_factory):
    """A local Ray runtime and a Minari root for this module; the multiprocessing reference dataset."""
    if not HAS_RAY:
        pytest.skip('ray is not installed (pip install -e ".[ray]")')
    import ray

    root = tmp_path_factory.mktemp("ray_collect")
    old = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(root / "minari")  # set before ray.init: the workers inherit it
    reference = collect("test/tiny/mp-v0", workers=2)
    ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    yield reference
    ray.shutdown()
    if old is None:
        os.environ.pop("MINARI_DATASETS_PATH", None)
    else:
        os.environ["MINARI_DATASETS_PATH"] = old


def collect(dataset_id, **kwargs):
    return collect_dataset(dataset_id, "MorcaTinyRandom-v0", EPISODES, env_kwargs=ENV_KWARGS, behavior="random",
                           progress=False, **kwargs)


def assert_same_episodes(a, b):
    assert a.total_episodes == b.total_episodes == EPISODES
    for x, y in zip(a.iterate_episodes(), b.iterate_episodes()):
        assert x.id == y.id
        np.testing.assert_array_equal(x.actions, y.actions)
        np.testing.assert_array_equal(x.rewards, y.rewards)
        assert x.observations.keys() == y.observations.keys()
        for key in x.observations:
            np.testing.assert_array_equal(x.observations[key], y.observations[key], err_msg=key)
    timed = ("latency_s", "speedup")  # wall-clock measurements, not data
    assert [{k: v for k, v in o.items() if k not in timed} for o in data.episode_options(a)] == \
        [{k: v for k, v in o.items() if k not in timed} for o in data.episode_options(b)]


@pytest.mark.slow
@needs_ray
def test_ray_collection_gives_the_multiprocessing_episodes(ray_runtime):
    from morca_env.parallel.executors import RayExecutor

    dataset = collect("test/tiny/ray-v0", workers=2, executor=RayExecutor())
    assert_same_episodes(dataset, ray_runtime)


def _parent_pid(pid: int) -> int:
    stat = (Path("/proc") / str(pid) / "stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[1])  # the field after the state; the name may hold spaces


def _descends_from_this_process(pid: int) -> bool:
    """Only this test's Ray runtime: another Ray job on the machine once made the count 4, not 2."""
    try:
        while pid > 1:
            pid = _parent_pid(pid)
            if pid == os.getpid():
                return True
    except (OSError, ValueError):
        pass
    return False


def _ray_worker_pids() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes().startswith(b"ray::MorcaWorker"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return sorted(pid for pid in pids if _descends_from_this_process(pid))


@pytest.mark.slow
@needs_ray
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the Ray worker in /proc")
def test_a_killed_ray_worker_loses_no_finished_episode_and_resume_finishes(ray_runtime, monkeypatch):
    from morca_env.parallel.executors import RayExecutor

    written, killed = [], []
    from morca_env.data import collect as collecting

    real_write = collecting.write_episode

    def write_then_kill(staging, index, episode):  # the driver writes every episode on the Ray path
        real_write(staging, index, episode)
        written.append(index)
        if not killed:  # SIGKILL one actor after the first episode: with 4 episodes still queued, one of
            pids = _ray_worker_pids()  # them always goes to (or is running on) the dead actor
            assert len(pids) == 2, f"expected the 2 Ray workers, found {pids}"
            os.kill(pids[0], signal.SIGKILL)
            killed.append(pids[0])

    monkeypatch.setattr(collecting, "write_episode", write_then_kill)
    with pytest.raises(RuntimeError, match=r"1 Ray worker\(s\) failed: item \d.*rerun with resume=True"):
        collect("test/tiny/killed-v0", workers=2, executor=RayExecutor())
    staging = staging_root() / "test/tiny/killed-v0"
    kept = completed_indices(staging, EPISODES)
    assert kept == set(written) and 1 <= len(kept) < EPISODES  # every returned episode is on disk
    for index in kept:  # and is the reference episode
        np.testing.assert_array_equal(read_episode(data.episode_path(staging, index))["actions"],
                                      ray_runtime[index].actions)
    monkeypatch.setattr(collecting, "write_episode", real_write)
    dataset = collect("test/tiny/killed-v0", workers=2, executor=RayExecutor())  # resume=True is the default
    assert_same_episodes(dataset, ray_runtime)


# ---------------------------------------------------------------- no Ray runtime needed
def test_ray_address_without_ray_and_a_missing_ray_are_clear_errors(tmp_path, monkeypatch):
    import morca_env.parallel.executors as executors

    recipe = tmp_path / "recipe.json"
    recipe.write_text('{"dataset_id": "test/tiny/cli-v0", "env_id": "MorcaTinyRandom-v0", "num_episodes": 1}')
    out = subprocess.run([sys.executable, "-m", "morca_env.commands", "collect", str(recipe), "--ray-address", "auto"],
                         capture_output=True, text=True, timeout=120, env={**os.environ})
    assert out.returncode == 2 and "--ray-address 'auto' given without --ray" in out.stderr, out.stderr[-2000:]
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError, as when it is not installed
    with pytest.raises(ImportError, match=r"RayExecutor needs ray, which is not installed: pip install 'morca-gym\[ray\]'"):
        executors.RayExecutor()
    with pytest.raises(ValueError, match="ray address='' must be a non-empty string"):
        executors.RayExecutor("")


@pytest.mark.slow
@needs_ray
def test_more_workers_than_the_runtime_can_hold_is_refused_naming_the_range(ray_runtime):
    from morca_env.parallel.executors import RayExecutor

    with pytest.raises(ValueError, match=r"workers=3 need 3 CPU\(s\) .*has 2: valid: workers in \[1, 2\]"):
        list(RayExecutor().map_unordered(abs, (), [1, 2, 3], workers=3))
    with pytest.raises(ValueError, match=r"workers=1 need 1 GPU\(s\) .*has 0: valid: workers in \[1, 1\] once it has a GPU"):
        list(RayExecutor().map_unordered(abs, (), [1], workers=1, gpus=1))


def test_wan_envs_ask_for_a_gpu_per_worker_and_morca_tiny_does_not():
    assert workers.needs_gpu("MorcaWan21-v0", {}) and workers.needs_gpu("MorcaWan22-v0", {"device": "cuda"})
    assert not workers.needs_gpu("MorcaWan21-v0", {"device": "cpu"})
    assert not workers.needs_gpu("MorcaTiny-v0", {}) and not workers.needs_gpu("MorcaTinyRandom-v0", {})


@pytest.mark.slow
@needs_ray
def test_schedule_search_on_ray_finds_the_local_schedules(ray_runtime, tmp_path):
    from morca_env.parallel.executors import RayExecutor
    from morca_env.evaluation.search import SearchConfig, SearchTask, search_many

    kwargs = {"budget": 4, "num_inference_steps": 10, "r_max": 200, "reference_cache_dir": str(tmp_path / "refs")}
    tasks = [SearchTask("a", (("a red circle", 1),), 3), SearchTask("b", (("a blue square", 2),), 4)]
    local = search_many(tasks, "MorcaTinyRandom-v0", kwargs, tmp_path / "local", SearchConfig(evaluations=3),
                        progress=False)
    on_ray = search_many(tasks, "MorcaTinyRandom-v0", kwargs, tmp_path / "ray", SearchConfig(evaluations=3),
                         workers=2, progress=False, executor=RayExecutor())
    assert on_ray == local
    assert sorted(p.name for p in (tmp_path / "ray").glob("*.json")) == ["a.json", "b.json"]  # written by the driver


def _evaluate_main():
    from morca_env.commands.evaluate import main

    return main


EVAL_ARGS = ["--env", "MorcaTinyRandom-v0", "--prompts", "2", "--targets", "1.5", "2", "--videos", "0",
             "--methods", "uniform", "random", "seacache-exact", "--baselines", "uniform", "--threads", "1"]


@pytest.mark.slow
@needs_ray
def test_evaluation_on_ray_gives_the_local_rows(ray_runtime, tmp_path):
    """Same methods, prompts and targets: the same K, schedules and PSNR on Ray actors as in the local loop."""
    env_kwargs = ('{"num_inference_steps": 10, "latent_features": false, "reference_cache_dir": "%s"}'
                  % (tmp_path / "refs"))
    main = _evaluate_main()
    assert main([*EVAL_ARGS, "--env-kwargs", env_kwargs, "--out", str(tmp_path / "local")]) == 0
    assert main([*EVAL_ARGS, "--env-kwargs", env_kwargs, "--out", str(tmp_path / "ray"), "--ray",
                 "--workers", "2"]) == 0

    def rows(out):
        lines = (out / "episodes.jsonl").read_text().splitlines()
        keep = ("method", "target", "prompt_index", "prompt", "seed", "num_reuse", "psnr", "ssim", "schedule",
                "requested_speedup")
        return sorted(({k: r[k] for k in keep} for r in map(__import__("json").loads, lines)),
                      key=lambda r: (r["target"], r["prompt_index"], r["method"]))

    local, on_ray = rows(tmp_path / "local"), rows(tmp_path / "ray")
    assert len(local) == 2 * 2 * 3 and on_ray == local
    assert (tmp_path / "ray" / "table.md").exists()


def test_evaluate_refuses_feedback_on_ray():
    out = subprocess.run([sys.executable, "-m", "morca_env.commands", "evaluate", "--ray", "--feedback"],
                         capture_output=True, text=True, timeout=120, env={**os.environ})
    assert out.returncode == 2 and "--feedback needs the episodes in order on one machine" in out.stderr, \
        out.stderr[-2000:]
