"""Silent wrong results, failed resets and stored files."""

import json
import os
import stat

import gymnasium as gym
import numpy as np
import pytest
import torch

import morca_env
from morca_env.utils.io import atomic_write_text
from morca_env.schedulers.fixed import UniformInterval
from morca_env.diffusion.reference_videos import ReferenceCache
from tests.conftest import make_pipe, prompt_embeds

FAST = dict(num_inference_steps=10, lpips=False)


def tiny(tmp_path, **kwargs):
    return gym.make("MorcaTiny-v0", reference_cache_dir=str(tmp_path / "refs"), **{**FAST, **kwargs})


def run_episode(env, **options):
    obs, info = env.reset(options=options or None)
    done = False
    while not done:
        obs, reward, done, _, info = env.step(int(obs["action_mask"][1]))
    return info


def test_speedup_never_uses_the_latency_stored_with_a_cached_reference(tmp_path):
    env = tiny(tmp_path, budget=4)
    first = run_episode(env, seed=3, prompt="a red circle")
    fields = env.unwrapped._reference_fields()
    cache = ReferenceCache(tmp_path / "refs")
    cache.store(fields, cache.load(fields).video, 1000.0)  # a slow first run, or another machine's timing
    again = run_episode(tiny(tmp_path, budget=4), seed=3, prompt="a red circle")
    assert again["reference_latency_s"] < 100 and again["speedup"] < 20
    assert first["reference_latency_s"] < 100


def test_every_byte_of_a_reference_file_is_covered_by_its_checksum(tmp_path):
    cache = ReferenceCache(tmp_path)
    fields = {"prompt": "p", "seed": 1}
    video = torch.arange(24, dtype=torch.uint8).reshape(2, 2, 2, 3)
    path = cache.store(fields, video, 1.35)
    original = path.read_bytes()
    text = original.replace(b'"latency_s":"1.35"', b'"latency_s":"5.35"')
    assert text != original
    path.write_bytes(text)
    with pytest.warns(UserWarning, match=f"reference file {path} is unreadable"):
        assert cache.load(fields) is None
    for position in range(len(original)):
        data = bytearray(original)
        data[position] ^= 0x01
        path.write_bytes(bytes(data))
        with pytest.warns(UserWarning, match="is unreadable"):
            assert cache.load(fields) is None, f"byte {position} changed undetected"
    path.write_bytes(original)
    assert cache.load(fields).latency_s == 1.35


@pytest.mark.parametrize("bad", [0.9, "1", True, 2, -1, np.array([0, 1])])
def test_accelerate_takes_exactly_the_actions_step_takes(bad):
    class Constant(UniformInterval):
        def __call__(self, obs):
            return bad

    pipe = make_pipe("wan21", with_text_encoder=False, with_vae=True)
    embeds = prompt_embeds()
    with pytest.raises(ValueError, match=r"action=.* valid actions: 0 \(recompute\) or 1 \(reuse\)"):
        morca_env.accelerate(pipe, Constant(), budget=2, prompt_embeds=embeds[0], negative_prompt_embeds=embeds[1],
                             height=32, width=32, num_frames=9, num_inference_steps=6, output_type="latent")
    assert not pipe.transformer._diffusers_hook.hooks  # hooks removed after the error


@pytest.mark.parametrize("name", ["Tiny", "wan2.1"])
def test_a_mistyped_calibration_name_raises_listing_the_valid_ones(tmp_path, name):
    with pytest.raises(ValueError, match=f"calibration='{name}' is not a registered model; valid: scenes, tiny.*wan21, wan22"):
        tiny(tmp_path, calibration=name)
    pipe = make_pipe("wan21", with_text_encoder=False, with_vae=True)
    with pytest.raises(ValueError, match=f"calibration='{name}' is not a registered model"):
        morca_env.accelerate(pipe, UniformInterval(), speedup=2.0, calibration=name, num_inference_steps=6)


def test_a_failed_reset_leaves_the_env_needing_a_reset(tmp_path):
    env = tiny(tmp_path, budget=4)
    obs, _ = env.reset(options={"seed": 1, "prompt": "a red circle"})
    env.step(0)
    with pytest.raises(ValueError, match="speedup=99"):
        env.reset(options={"seed": 2, "prompt": "a blue square", "speedup": 99})
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(0)


def test_a_reset_failing_after_its_reference_leaves_no_half_episode(tmp_path, monkeypatch):
    env = tiny(tmp_path, budget=4)
    env.reset(options={"seed": 0})
    env.step(0)
    denoiser = env.unwrapped.denoiser
    monkeypatch.setattr(denoiser, "start", lambda **kw: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        env.reset(options={"seed": 1})
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(0)


def test_an_unwritable_reference_dir_is_reported_and_episodes_still_run(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.warns(UserWarning, match=f"reference_cache_dir {blocker / 'refs'} is not writable"):
        env = gym.make("MorcaTiny-v0", reference_cache_dir=str(blocker / "refs"), budget=4, **FAST)
    with pytest.warns(UserWarning, match="could not store the reference"):
        info = run_episode(env, seed=1)
    assert info["num_reuse"] == 4 and np.isfinite(info["psnr"])


def test_written_files_get_the_usual_mode_not_0600(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o644


def test_d3rlpy_and_sb3_imports_and_training_print_no_notice_or_info_lines(tmp_path):
    import subprocess
    import sys

    code = ("import morca_env, agents, d3rlpy, sb3_contrib\n"
            "from test_agents import quiet, synthetic_buffer\n"
            "a = agents.DiscreteIQLConfig(batch_size=8).create(device='cpu')\n"
            "for _ in range(2):  # the second fit continues training, as the trainers' curve chunks do\n"
            "    a.fit(synthetic_buffer(), n_steps=2, n_steps_per_epoch=2, show_progress=False, logger_adapter=quiet())\n"
            "import d3rlpy.logging; d3rlpy.logging.LOG.warning('a warning of its own')\n")
    agents_tests = os.path.join(os.path.dirname(os.path.dirname(__file__)), "agents")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([agents_tests, os.environ["PYTHONPATH"]])})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "unmaintained" not in out.stderr and "[info" not in out.stdout + out.stderr, out.stdout + out.stderr
    assert "Skip building" not in out.stdout + out.stderr and "a warning of its own" in out.stdout + out.stderr


def test_a_second_writer_of_one_output_fails_naming_the_first_ones_pid(tmp_path):
    """One writer per output: the lock is held by another process, so ours must refuse, and the lock dies with its
    holder (a killed run leaves no stale lock)."""
    import subprocess
    import sys

    from morca_env.utils.io import exclusive_lock

    lock = tmp_path / ".lock"
    holder = subprocess.Popen([sys.executable, "-c", f"""
import sys, time
from morca_env.utils.io import exclusive_lock
with exclusive_lock({str(lock)!r}, "x"):
    print("held", flush=True)
    time.sleep(60)
"""], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RuntimeError, match=rf"evaluation out is being written by another process \(pid {holder.pid}"):
            with exclusive_lock(lock, "evaluation out"):
                pass
    finally:
        holder.kill()
        holder.wait()
    with exclusive_lock(lock, "evaluation out"):  # the killed holder's lock is gone
        pass


def test_json_lines_reader_drops_only_a_torn_last_line(tmp_path):
    from morca_env.utils.io import read_json_lines

    log = tmp_path / "log.jsonl"
    log.write_text('{"a": 1}\n{"a": 2}\n{"a": ')
    with pytest.warns(UserWarning, match="torn last line"):
        assert read_json_lines(log) == [{"a": 1}, {"a": 2}]
    log.write_text('{"a": 1}\n{"a": \n{"a": 3}\n')
    with pytest.raises(ValueError, match=r"log.jsonl line 2 is not JSON"):
        read_json_lines(log)


def _die_on_two(env, job):
    if job == 2:
        os.kill(os.getpid(), 9)
    return job


def test_a_killed_worker_raises_instead_of_hanging_the_pool():
    """A worker killed mid-job (OOM killer, kill -9) must surface, not leave the caller waiting forever
    (multiprocessing.Pool loses the job and waits)."""
    from morca_env.parallel.workers import WorkerDied, map_on_envs

    kwargs = {"num_inference_steps": 4, "latent_features": False, "lpips": False}
    got = []
    with pytest.raises(WorkerDied, match="a worker process of MorcaTinyRandom-v0 died"):
        for result in map_on_envs(_die_on_two, [0, 1, 2, 3], "MorcaTinyRandom-v0", kwargs, workers=2, threads=1):
            got.append(result)
    assert 2 not in got
