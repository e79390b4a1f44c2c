"""Every argument a user passes, given a bad value: a clear error that names the value and what is valid.

One row per (argument, bad value, expected message fragment).
"""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from morca_env import commands
import torch

import morca_env
from morca_env.data import collect_dataset
from morca_env.env import MorcaEnv
from morca_env.schedulers.fixed import UniformInterval
from tests.conftest import make_pipe, prompt_embeds

ROOT = Path(__file__).resolve().parents[2]

ENV_ROWS = [  # MorcaEnv("tiny", **{argument: value}), checked at construction
    ("model", "nope", "unknown model 'nope'; valid models: wan21, wan22, tiny"),
    ("speedup", 99, "speedup=99.0 is outside the feasible range [1.00, "),
    ("speedup", "3", "speedup='3' must be a number or a (low, high) pair in [1.00, "),
    ("speedup", (3, 2), "speedup range (3, 2) must be (low, high) with low <= high"),
    ("speedup", float("nan"), "speedup=nan is outside the feasible range [1.00, "),
    ("budget", 999, "budget K=999 is outside the feasible range [0, 48]"),
    ("budget", -1, "budget K=-1 is outside the feasible range [0, 48]"),
    ("budget", 2.5, "budget=2.5 must be an integer number of reuse steps in [0, 48]"),
    ("prompts", "nosuchsuite", "unknown prompt suite 'nosuchsuite'; valid suites: vbench-train"),
    ("prompts", [], "prompts=[] must be a suite name (vbench-train"),
    ("prompts", 5, "prompts=5 must be a suite name"),
    ("prompts", "tiny-eval:99999", "prompts='tiny-eval:99999': suite 'tiny-eval' has"),
    ("num_inference_steps", 0, "num_inference_steps=0 must be a positive integer"),
    ("num_inference_steps", 2.5, "num_inference_steps=2.5 must be a positive integer"),
    ("num_inference_steps", 2, "num_inference_steps=2 leaves no step that may reuse the cache (steps [0, 1] always "
                               "recompute); valid: >= 3"),
    ("num_inference_steps", 3, "num_inference_steps=3: the default speedup range (1.5, 3.5) is outside the feasible "
                               "range [1.00, 1."),
    ("height", 17, "height=17 must be a positive multiple of 2 for this model"),
    ("height", 0, "height=0 must be a positive integer"),
    ("width", 15, "width=15 must be a positive multiple of 2 for this model"),
    ("num_frames", 3, "num_frames=3 does not fit this model (VAE temporal factor 1, temporal patch 2); valid: 2, 4, 6, "
                      "8, ..."),
    ("guidance_scale", -1, "guidance_scale=-1 must be a non-negative number"),
    ("guidance_scale_2", -2, "guidance_scale_2=-2 must be a non-negative number"),
    ("negative_prompt", 5, "negative_prompt=5 must be a string"),
    ("r_max", 0, "r_max=0 must be a positive finite number of dB"),
    ("r_max", float("inf"), "r_max=inf must be a positive finite number of dB"),
    ("device", "gpu", "device='gpu' is not a torch device; valid: 'cpu', 'cuda', 'cuda:<index>'"),
    ("dtype", "float64", "dtype='float64'; valid: float32, float16, bfloat16"),
    ("dtype", torch.int8, "dtype=torch.int8; valid: float32, float16, bfloat16"),
    ("pipeline", object(), "pipeline must be a diffusers WanPipeline, got object"),
    ("model_id", "/nonexistent/dir", "MorcaTiny weights not found at /nonexistent/dir"),
    ("reference_cache_dir", 5, "reference_cache_dir=5 must be a directory path"),
    ("lpips", "yes", "lpips='yes' must be True or False"),
    ("signal", "foo", "signal='foo'; valid: ('official', 'latent')"),
    ("calibration", "Tiny", "calibration='Tiny' is not a registered model; valid: scenes, tiny, tiny-random, wan21, wan22"),
    ("calibration", 5, "calibration=5; valid: a registered model name, a calibration JSON path or a SpeedupCalibration"),
    ("enforce_budget", "no", "enforce_budget='no' must be True or False"),
    ("budget_rounding", "up", "budget_rounding='up'; valid: ('dither', 'nearest')"),
    ("latent_features", "no", "latent_features='no' must be True or False"),
    ("render_mode", "human", "render_mode='human'; valid: ['rgb_array']"),
]
if not torch.cuda.is_available():
    ENV_ROWS.append(("device", "cuda", "device='cuda' but CUDA is not available on this machine; valid here: 'cpu'"))


@pytest.mark.parametrize("argument, value, fragment", ENV_ROWS, ids=[f"{a}={v!r}" for a, v, _ in ENV_ROWS])
def test_env_argument(argument, value, fragment, tmp_path):
    kwargs = {"reference_cache_dir": str(tmp_path), "lpips": False}
    with pytest.raises((ValueError, TypeError, RuntimeError), match=re.escape(fragment)):
        if argument == "model":
            MorcaEnv(value, **kwargs)
        else:
            MorcaEnv("tiny", **{**kwargs, argument: value})


RESET_ROWS = [  # env.reset(options={...}) on MorcaTiny with 10 steps
    ({"seed": -1}, "options['seed']=-1 must be an integer in [0, 2**63 - 1]"),
    ({"seed": 2**64}, "options['seed']=18446744073709551616 must be an integer in [0, 2**63 - 1]"),
    ({"seed": 1.5}, "options['seed']=1.5 must be an integer in [0, 2**63 - 1]"),
    ({"prompt": ""}, "options['prompt']='' must be a non-empty string"),
    ({"prompt": 5}, "options['prompt']=5 must be a non-empty string"),
    ({"speedup": 99}, "speedup=99 is outside the feasible range [1.00, "),
    ({"speedup": "2"}, "options['speedup']='2' must be a number"),
    ({"budget": 99}, "budget K=99 is outside the feasible range [0, 8]"),
    ({"budget": 2, "speedup": 2}, "reset options take speedup or budget, not both"),
    ({"scheduler_cost_s": -1}, "scheduler_cost_s=-1 must be a finite number >= 0"),
    ({"foo": 1}, "unknown reset options ['foo']; valid: prompt, seed, speedup, budget, scheduler_cost_s"),
    ("prompt", "options='prompt' must be a dict (or None)"),
    ([], "options=[] must be a dict (or None)"),  # was taken as {}
]
STEP_ROWS = [2, -1, 0.5, "1", None, True, np.array([0, 1])]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return MorcaEnv("tiny", num_inference_steps=10, lpips=False,
                    reference_cache_dir=str(tmp_path_factory.mktemp("refs")))


@pytest.mark.parametrize("options, fragment", RESET_ROWS, ids=[json.dumps(o, default=str) for o, _ in RESET_ROWS])
def test_reset_option(env, options, fragment):
    with pytest.raises((ValueError, TypeError), match=re.escape(fragment)):
        env.reset(options=options)


@pytest.mark.parametrize("action", STEP_ROWS, ids=repr)
def test_step_action(env, action):
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"action=.* valid actions: 0 \(recompute\) or 1 \(reuse\)"):
        env.step(action)


ACCELERATE_ROWS = [  # morca_env.accelerate(pipe, policy, **kwargs) on a tiny Wan2.1 pipeline with 6 steps
    ({"speedup": 99, "calibration": "wan21"}, "speedup=99 is outside the feasible range [1.00, "),
    ({"speedup": "3", "calibration": "wan21"}, "speedup='3' must be a number in [1.00, "),
    ({"speedup": 2}, "no speedup calibration is known for this pipeline's transformer"),
    ({"speedup": 2, "calibration": "wan21", "scheduler_cost_s": 100.0},
     "scheduler_cost_s=100.0: a scheduler this slow"),  # was "range [1.00, 0.00]"
    ({"budget": 1, "policy": UniformInterval}, "policy=UniformInterval is a class: pass an instance"),
    ({"budget": 99}, "budget K=99 is outside the feasible range [0, 4]"),
    ({"budget": 1.5}, "budget=1.5 must be an integer number of reuse steps in [0, 4]"),
    ({"speedup": 2, "budget": 2}, "pass exactly one of speedup or budget (got speedup=2, budget=2)"),
    ({}, "pass exactly one of speedup or budget (got speedup=None, budget=None)"),
    ({"budget": 1, "signal": "foo"}, "signal='foo'; valid: ('official', 'latent')"),
    ({"speedup": 2, "calibration": "wan2.1"}, "calibration='wan2.1' is not a registered model; valid: scenes, tiny"),
    ({"speedup": 2, "calibration": 5}, "calibration=5; valid: a registered model name"),
    ({"speedup": 2, "calibration": "wan21", "scheduler_cost_s": -1}, "scheduler_cost_s=-1 must be a finite number >= 0"),
    ({"budget": 1, "num_inference_steps": 0}, "num_inference_steps=0 must be a positive integer"),
    ({"budget": 1, "num_inference_steps": "6"}, "num_inference_steps='6' must be a positive integer"),
    ({"budget": 1, "num_inference_steps": 2}, "budget K=1 is outside the feasible range [0, 0]"),
    ({"budget": 1, "policy": None}, "policy=None must have reset(obs, info) and __call__(obs) -> action"),
]


@pytest.mark.parametrize("kwargs, fragment", ACCELERATE_ROWS, ids=[json.dumps(k, default=str) for k, _ in ACCELERATE_ROWS])
def test_accelerate_argument(kwargs, fragment):
    pipe = make_pipe("wan21", with_text_encoder=False, with_vae=True)
    embeds = prompt_embeds()
    kwargs = dict(kwargs)
    policy = kwargs.pop("policy", UniformInterval())
    call = dict(prompt_embeds=embeds[0], negative_prompt_embeds=embeds[1], height=32, width=32, num_frames=9,
                num_inference_steps=6, output_type="latent")
    with pytest.raises((ValueError, TypeError), match=re.escape(fragment)):
        morca_env.accelerate(pipe, policy, **{**call, **kwargs})


COLLECT_ROWS = [  # collect_dataset(**{argument: value}); all refused before any episode is collected
    ("dataset_id", "morca/tiny/noversion", "dataset_id='morca/tiny/noversion' is not a Minari dataset id; valid: "
                                           "'<namespace>/<name>-v<version>'"),
    ("dataset_id", 5, "dataset_id=5 is not a Minari dataset id"),
    ("env_id", "MorcaHuge-v0", "env_id='MorcaHuge-v0' is not registered; valid: "),
    ("num_episodes", 0, "num_episodes=0 must be a positive integer"),
    ("env_kwargs", "speedup=2", "env_kwargs='speedup=2' must be a dict of MorcaEnv arguments"),
    ("behavior", "threshold", "behavior={'name': 'threshold'}; valid: a behaviour name (acid, acid-exact, "),
    ("behavior", ["random"], "behavior=['random']; valid: a behaviour name"),
    ("workers", 0, "workers=0 must be a positive integer"),
    ("threads", -1, "threads=-1 must be a positive integer"),
    ("seed", -3, "seed=-3 must be a non-negative integer"),
    ("feature_dtype", "float64", "feature_dtype='float64'; valid: float16, float32"),
]


@pytest.mark.parametrize("argument, value, fragment", COLLECT_ROWS, ids=[f"{a}={v!r}" for a, v, _ in COLLECT_ROWS])
def test_collect_argument(argument, value, fragment, tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    monkeypatch.setenv("MORCA_CACHE_DIR", str(tmp_path / "cache"))
    kwargs = {"dataset_id": "test/tiny/bad-v0", "env_id": "MorcaTinyRandom-v0", "num_episodes": 2,
              "env_kwargs": {"num_inference_steps": 10}, "behavior": "random", "progress": False}
    with pytest.raises((ValueError, TypeError), match=re.escape(fragment)):
        collect_dataset(**{**kwargs, argument: value})
    assert not (tmp_path / "cache" / "collect" / "test").exists()  # nothing was staged


SCRIPT_ROWS = [  # morca <command> <args>: argparse's usage error (exit code 2) naming the value
    (["collect", "RECIPE", "--episodes", "0"], "argument --episodes: '0' is not a positive integer"),
    (["collect", "RECIPE", "--workers", "two"], "argument --workers: 'two' is not a positive integer"),
    (["collect", "RECIPE", "--threads", "-1"], "argument --threads: '-1' is not a positive integer"),
    (["collect", "RECIPE", "--env-kwargs", "{speedup: 2}"], "argument --env-kwargs: '{speedup: 2}' is not JSON"),
    (["collect", "RECIPE", "--env-kwargs", "[1]"], "argument --env-kwargs: '[1]' is not a JSON object of env kwargs"),
    (["collect", "RECIPE", "--dataset-id", "morca/x"], "dataset_id='morca/x' is not a Minari dataset id"),
    (["collect", "missing.json"], "argument recipe: recipe 'missing.json' is neither a file nor a packaged recipe; valid: a JSON recipe file or one of morca/scenes/anchored-v2"),
    (["train", "--epochs", "0"], "argument --epochs: '0' is not a positive integer"),
    (["train", "--batch-size", "big"], "argument --batch-size: 'big' is not a positive integer"),
    (["train", "--n-step", "-5"], "argument --n-step: '-5' is not a positive integer"),
    (["finetune", "--rounds", "0"], "argument --rounds: '0' is not a positive integer"),
    (["finetune", "--env-kwargs", "speedup=2"], "argument --env-kwargs: 'speedup=2' is not JSON"),
    (["reinforce", "--episodes-per-update", "0"], "argument --episodes-per-update: '0' is not a positive integer"),
    (["reinforce", "--threads", "0"], "argument --threads: '0' is not a positive integer"),
    (["evaluate", "--prompts", "0"], "argument --prompts: '0' is not a positive integer"),
    (["evaluate", "--skip-prompts", "-1"], "argument --skip-prompts: '-1' is not a non-negative integer"),
    (["evaluate", "--targets", "0.5"], "argument --targets: '0.5' is not a speedup (valid: a number >= 1"),
    (["evaluate", "--env-kwargs", "{x}"], "argument --env-kwargs: '{x}' is not JSON"),
    (["evaluate", "--videos", "some"], "argument --videos: 'some' is not a non-negative integer"),
    (["evaluate", "--calibrate", "-2"], "argument --calibrate: '-2' is not a non-negative integer"),
    (["search", "--out", "o", "--count", "0"], "argument --count: '0' is not a positive integer"),
    (["search", "--out", "o", "--evaluations", "0"], "argument --evaluations: '0' is not a positive"),
    (["search", "--out", "o", "--targets", "nan"], "argument --targets: 'nan' is not a speedup"),
    (["search", "--out", "o", "--workers", "0"], "argument --workers: '0' is not a positive integer"),
    (["fit-fixed", "--budgets", "-3"], "argument --budgets: '-3' is not a non-negative integer"),
    (["fit-fixed", "--budgets", "30", "--evaluations", "0"],
     "--candidates and --evaluations 0 choose on validation prompts: pass --select-on"),
    (["fit-fixed", "--budgets", "30", "--evaluations", "-1"], "argument --evaluations: '-1' is not a non-negative integer"),
    (["fit-fixed", "--budgets", "30", "--select-on", "tiny-eval:5"],
     "--select-on 'tiny-eval:5' is an evaluation suite; fit and select on training prompts"),
    (["fit-fixed", "--budgets", "30", "--prompts", "tiny-train:4", "--select-on", "tiny-train[2:6]"],
     "--select-on shares 2 prompts with --prompts"),
    (["calibrate", "--repeats", "0"], "argument --repeats: '0' is not a positive integer"),
    (["calibrate", "--timing-repeats", "0"], "argument --timing-repeats: '0' is not a positive integer"),
    (["export-searched", "logs", "--out", "x.json", "--per-search", "0"], "argument --per-search: '0' is not a positive"),
    (["quickstart", "--episodes", "-4"], "argument --episodes: '-4' is not a positive integer"),
    (["quickstart", "--targets", "x"], "argument --targets: 'x' is not a speedup"),
    (["quickstart", "--episodes", "0"], "argument --episodes: '0' is not a positive integer"),
    (["quickstart", "--workers", "0"], "argument --workers: '0' is not a positive integer"),
    (["dataset-report", "morca/tiny/x-v0", "--plot", "k.txt"], "--plot k.txt: '.txt' is not an image format; valid:"),
    (['calibrate', '--env', 'Nope-v0'], "argument --env: 'Nope-v0' is not a MORCA env; valid: MorcaWan21-v0"),
    (['fit-fixed', '--budgets', '30', '--env', 'Nope-v0'], "argument --env: 'Nope-v0' is not a MORCA env; valid: MorcaWan21-v0"),
    (['search', '--out', 'o', '--env', 'Nope-v0'], "argument --env: 'Nope-v0' is not a MORCA env; valid: MorcaWan21-v0"),
    (['evaluate', '--env', 'Nope-v0'], "argument --env: 'Nope-v0' is not a MORCA env; valid: MorcaWan21-v0"),
    (['fit-rules', '--env', 'Nope-v0'], "argument --env: 'Nope-v0' is not a MORCA env; valid: MorcaWan21-v0"),
    (['anchor', 'c.safetensors', '--out', 'o', '--env', 'Nope-v0'], "argument --env: 'Nope-v0' is not a MORCA env; valid: MorcaWan21-v0"),
    (['finetune', '--env', 'Nope-v0'], "argument --env: 'Nope-v0' is not a MORCA env; valid: MorcaWan21-v0"),
    (['reinforce', '--env', 'Nope-v0'], "argument --env: 'Nope-v0' is not a MORCA env; valid: MorcaWan21-v0"),
    (["reinforce", "--speedup-range", "3", "1"], "--speedup-range 3 1: give LOW HIGH with 1 <= LOW <= HIGH"),
    (["leaderboard", "--pair-step", "0"], "argument --pair-step: '0' is not a positive integer"),
    (["leaderboard", "--seeds", "-1"], "argument --seeds: '-1' is not a positive integer"),
    (["leaderboard", "--workers", "0"], "argument --workers: '0' is not a positive integer"),
    (["leaderboard", "--workers", "99999999999"], "argument --workers: '99999999999' workers is more than any "
                                                  "machine runs (valid: 1 .. 1024)"),
    (["train", "--device", "gpu"], "argument --device: 'gpu' is not a torch device; valid: cpu, cuda, cuda:<index>"),
    (["train", "--run-dir", "A_FILE"], "argument --run-dir: 'A_FILE' is a file: give a directory"),
    (["reinforce", "--run-dir", "A_FILE/run"], "argument --run-dir: 'A_FILE/run' lies under the file A_FILE: give a "
                                                "directory"),
    (["anchor", "c.safetensors", "--out", "A_DIR"], "argument --out: 'A_DIR' is a directory: give a file path in it"),
    (["evaluate", "--out", "A_FILE"], "argument --out: 'A_FILE' is a file: give a directory"),
]
if not __import__("torch").cuda.is_available():
    SCRIPT_ROWS.append((["train", "--device", "cuda:7"], "argument --device: 'cuda:7': this machine has no CUDA "
                                                         "device; valid here: cpu"))


@pytest.mark.parametrize("args, fragment", SCRIPT_ROWS, ids=[" ".join(a) for a, _ in SCRIPT_ROWS])
def test_script_argument(args, fragment, capsys, monkeypatch, tmp_path):
    recipe = "morca/tiny/random-v0"
    monkeypatch.chdir(tmp_path)
    Path("A_FILE").write_text("")
    Path("A_DIR").mkdir()
    script, argv = args[0], [recipe if a == "RECIPE" else a for a in args[1:]]
    with pytest.raises(SystemExit) as exit_info:  # argparse exits before anything runs
        commands.main([script, *argv])
    assert exit_info.value.code == 2
    assert fragment in capsys.readouterr().err


def test_api_values_that_used_to_give_raw_errors_or_pass_silently(tmp_path):
    from agents.checkpoint import verify
    from agents.offline import OfflineConfig
    from morca_env.evaluation.episodes import make_envs

    with pytest.raises(IsADirectoryError, match="is a directory, not a checkpoint file"):
        verify(tmp_path)
    with pytest.raises(TypeError, match="checkpoint path=None: give the path of a checkpoint file"):
        verify(None)
    with pytest.raises(ValueError, match=r"expectile=2 must lie in \(0, 1\)"):
        OfflineConfig(expectile=2)
    with pytest.raises(ValueError, match=r"env_kwargs \['budget', 'speedup'\]: the evaluation sets these itself"):
        make_envs("MorcaTinyRandom-v0", "tiny-eval", {"speedup": 2.0, "budget": 3})
    pipe = make_pipe("wan21", with_text_encoder=False, with_vae=True)  # a numpy step count, as budgets take
    embeds = prompt_embeds()
    result = morca_env.accelerate(pipe, UniformInterval(), budget=np.int64(2), num_inference_steps=np.int64(6),
                                  prompt_embeds=embeds[0], negative_prompt_embeds=embeds[1], height=32, width=32,
                                  num_frames=9, output_type="latent")
    assert sum(result.schedule) == 2 and len(result.schedule) == 6


def test_a_mixture_component_without_a_name_is_named():
    from morca_env import schedulers

    with pytest.raises(ValueError, match=r"mixture component \{'weight': 1\} must be an object with a scheduler"):
        schedulers.make("mixture", components=[{"weight": 1}])


def test_malformed_files_and_options_are_named(tmp_path):
    """Corrupt calibration / threshold map / schedules files and bad scheduler options: errors naming the file,
    the entry and what is valid (they gave raw JSONDecodeError, TypeError, KeyError or numpy errors)."""
    from morca_env import schedulers
    from morca_env.speedup.calibration import SpeedupCalibration
    from morca_env.speedup.files import ThresholdMap
    from morca_env.schedulers.fixed import StaticSchedule

    torn = tmp_path / "torn.json"
    torn.write_text('{"alpha": 1.0, "beta"')
    with pytest.raises(ValueError, match=f"speedup calibration {torn} is not valid JSON \\(line 1, column 22"):
        SpeedupCalibration.from_json(torn)
    wrong = tmp_path / "wrong.json"
    wrong.write_text('{"alpha": 1.0, "gamma": 2}')
    with pytest.raises(ValueError, match=f"speedup calibration {wrong} is not one .*needs alpha, beta, max_budget"):
        SpeedupCalibration.from_json(wrong)
    with pytest.raises(ValueError, match=f"threshold map {wrong} is not a valid one .*needs \"speedups\""):
        ThresholdMap.from_file(wrong)
    with pytest.raises(ValueError, match=f"fixed schedules file {wrong} is not one"):
        StaticSchedule.from_file(wrong)
    with pytest.raises(FileNotFoundError, match="fixed schedules file .*missing.json does not exist"):
        StaticSchedule.from_file(tmp_path / "missing.json")
    entries = tmp_path / "entries.json"
    entries.write_text(json.dumps([{"prompt": "a", "seed": 0, "schedule": [0, 1, 0]}, {"prompt": "b", "seed": 1}]))
    with pytest.raises(ValueError, match=f"replay entries file {entries}, entry 1: .* must be "):
        schedulers.make("replay", path=str(entries))
    for option, value in (("speedup_range", (3, 1)), ("amplitude", (0.5,)), ("num_references", (2.5, 3))):
        with pytest.raises(ValueError, match=f"{option}=.* must be \\(low, high\\)"):
            schedulers.make("threshold-curve", threshold_map=ThresholdMap([1.5, 3.0], [0.1, 0.3]), **{option: value})
    with pytest.raises(ValueError, match="iterations=0 must be a positive integer"):
        schedulers.make("seacache-exact", iterations=0)


def test_an_output_that_is_a_file_or_read_only_is_named(tmp_path, monkeypatch):
    import tempfile

    from morca_env.utils.io import writable_directory

    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(NotADirectoryError, match=f"evaluation output --out {afile} is a file"):
        writable_directory(afile, "evaluation output --out")
    with pytest.raises(NotADirectoryError, match="is a file \\(or lies under one\\)"):
        writable_directory(afile / "sub")
    with pytest.raises(SystemExit):  # refused by the argument's type, before any work
        commands.main(["evaluate", "--env", "MorcaTinyRandom-v0", "--prompts", "1", "--targets", "2", "--videos", "0",
                       "--methods", "uniform", "--out", str(afile)])

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)  # as root, chmod cannot make a directory read-only
    with pytest.raises(PermissionError, match=f"run directory {tmp_path} cannot be written \\(Read-only file system"):
        writable_directory(tmp_path, "run directory")


def test_a_prompt_the_text_encoder_truncates_warns_once():
    import warnings

    from morca_env.diffusion.denoiser import warn_if_truncated

    class Tokenizer:
        def __call__(self, text, add_special_tokens=True):
            return type("Tokens", (), {"input_ids": text.split() + ["</s>"]})()

    pipe = type("Pipe", (), {"tokenizer": Tokenizer()})()
    words = " ".join(f"w{i}" for i in range(20))
    with pytest.warns(UserWarning, match="has 21 tokens and this model reads the first 16"):
        warn_if_truncated(pipe, words, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_truncated(pipe, words, 16)  # once per prompt
        warn_if_truncated(pipe, "a short prompt", 16)


def test_a_second_search_into_one_output_is_refused_naming_the_holder(tmp_path):
    import os

    from morca_env.utils.io import exclusive_lock
    from morca_env.evaluation.search import SearchTask, search_many

    with exclusive_lock(tmp_path / ".lock", "test"):
        with pytest.raises(RuntimeError, match=f"schedule search {tmp_path} is being written by another process "
                                               f"\\(pid {os.getpid()}"):
            search_many([SearchTask("t", [("a", 0)], 2)], "MorcaTinyRandom-v0", {}, tmp_path, progress=False)


@pytest.mark.parametrize("marker", ["final.safetensors", "latest.json"])
def test_train_refuses_a_run_dir_holding_a_run_unless_resumed(tmp_path, marker):
    """`morca train` into an existing run used to replace its checkpoints and final.safetensors silently."""
    from agents.commands import train

    run_dir = tmp_path / "offline"
    run_dir.mkdir()
    (run_dir / marker).write_text("the old run")
    with pytest.raises(SystemExit, match="already holds a run; pass --resume"):
        train.main(["--dataset", "morca/none/none-v0", "--run-dir", str(run_dir)])
    assert (run_dir / marker).read_text() == "the old run"


def test_counts_beyond_what_exists_are_refused_by_name(tmp_path, monkeypatch):
    """evaluate --prompts 1000000, pair_step=10**9 and calibrate --budgets 999 were accepted."""
    from morca_env.evaluation import benchmark
    from morca_env.commands import calibrate, evaluate

    monkeypatch.setenv("MORCA_CACHE_DIR", str(tmp_path))
    with pytest.raises(SystemExit, match=r"prompts=1000000 .* more pairs than the suite's 200; valid: 1 to 200"):
        evaluate.main(["--env", "MorcaTinyRandom-v0", "--prompts", "1000000", "--out", str(tmp_path / "e"),
                       "--methods", "uniform", "--targets", "2"])
    with pytest.raises(ValueError, match=r"pair_step=1000000000 leaves only the first .* valid: 1 to"):
        benchmark.evaluate(lambda obs: 0, "MorcaTinyRandom-v0", references=None, progress=False, pair_step=10**9)
    with pytest.raises(SystemExit, match=r"--budgets 999 exceeds this env's largest reuse budget; valid: 0 to"):
        calibrate.main(["--env", "MorcaTinyRandom-v0", "--budgets", "0", "999"])


@pytest.mark.parametrize("line, fragment", [("[1, 2]", "line 2 is a JSON list, not a row of this log"),
                                            ('{"prompt": "a"}', "line 2 lacks 'seed', 'schedule', 'reward'")])
def test_a_valid_json_line_that_is_not_a_row_is_named_with_its_line(tmp_path, line, fragment):
    from morca_env.evaluation.search import EvaluationLog

    log = tmp_path / "search.jsonl"
    log.write_text(json.dumps({"prompt": "a", "seed": 0, "schedule": "0101", "reward": 30.0, "psnr": 30.0}) + "\n"
                   + line + "\n" + json.dumps({"prompt": "b", "seed": 1, "schedule": "0101", "reward": 1.0}) + "\n")
    with pytest.raises(ValueError, match=re.escape(f"{log} {fragment}")):
        EvaluationLog(log)


def test_a_missing_dataset_names_the_root_and_how_to_make_it_not_a_download(tmp_path, monkeypatch):
    from morca_env.data.integrity import load_dataset

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError) as caught:
        load_dataset("nope/none-v0")
    message = str(caught.value)
    assert f"dataset 'nope/none-v0' is not in the local Minari root {tmp_path}" in message
    assert "morca collect <recipe>" in message and "download" not in message
