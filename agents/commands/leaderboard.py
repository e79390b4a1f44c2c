"""The MorcaTiny leaderboard: standard algorithms and the cache rules, one protocol, several training seeds.

    morca leaderboard                       # everything; resumable (rerun to continue)
    morca leaderboard --workers 2 --only rules offline   # a family at a time
    morca leaderboard --report              # only rewrite the page from the runs done

Every run is scored by `morca_env.evaluation.benchmark.evaluate` on MorcaTiny-v0's suite (at the
same K, paired to the shipped references; `--pair-step 2` scores every second pair).
Training budgets, common to a family: offline algorithms `--updates` gradient updates
on the first `--episodes` of a dataset; online ones `--online-episodes` environment
episodes (offline-to-online IQL: both). Every method discounts as the env does (gamma 1), and the value-based ones
learn from `--n-step`-step returns (default: the whole episode, Monte-Carlo); every other setting is the
library's default. Each learned method runs on each observation track (`--tracks`): "full",
the paper's state with latent features, and "scalars", its seven scalars and the mask (the MORCA networks with
no latent branch; the other algorithms on the scalars track's own observations). Each run is one JSON file under `--out`
(written when done). A run in flight when the board stops continues, on the same machine, from what it saved
under `--out/train/` (offline runs: their last learning-curve checkpoint; the MORCA online trainers: their last
round; REINFORCE: its last update), with its curve so far; sb3's runs start over.
Each learned run records its learning curve (`--curve-points`): the normalized score on 8 validation pairs of
training prompts at checkpoints twice apart in updates (offline) or episodes (online; the MORCA online trainers at
each round of episodes). The page
(the leaderboard page, `--page`, with a performance-profile plot) aggregates the
normalized scores with rliable: IQM over runs and targets, 95% stratified-bootstrap CIs.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from importlib.util import find_spec
from multiprocessing import get_context
from pathlib import Path

from agents.leaderboard_report import SEEDED_RULES, track_of
from morca_env.parallel.workers import exit_with_parent

ENV_ID = "MorcaTiny-v0"
# the learning curves' validation pairs: training prompts that no dataset (tiny-train:250, [5::22]), training pool
# ([::22]), fixed-schedule fit ([::464], [11:2651:132]) or margin choice ([7::44]) uses (tests check it), 8 pairs
VALIDATION_PROMPTS = "tiny-train[1001:1705:88]"
# packaged recipes: uniformly random feasible schedules, schedules spread around good ones, and the quickstart's data
# (groups around the best fixed schedule), on which the paper's offline-to-online recipe trains
DATASETS = {"random": "morca/tiny/random-v0", "mixture": "morca/tiny/mixture-v0", "anchored": "morca/tiny/anchored-v2"}
RECIPE_DATASET = "anchored"
RULES = {"random feasible": "random", "uniform": "uniform", "best fixed": "best-fixed",
         "SeaCache (exact K)": "seacache-exact", "TeaCache (exact K)": "teacache-exact",
         # trained once and shipped (agents/trained/README.md), so scored like a rule: one run, no training here
         "MORCA anchored (shipped)": "morca",
         # the floor: what a collapsed agent plays, so a reader can place a learned method's score
         "always recompute (masked)": "always-recompute", "always reuse (masked)": "always-reuse",
         "coin flip (masked)": "coin-flip"}
# the env's discount: the reward is the terminal PSNR alone, so every step's decision counts in full (d3rlpy's and
# sb3's default 0.99 would weigh a step's effect on the end by how far the end is)
GAMMA = 1.0
OFFLINE = ("IQL (MORCA)", "DiscreteCQL", "DiscreteBCQ", "DiscreteBC", "DQN (offline)")
SB3_METHODS = ("MaskablePPO", "DQN (sb3)")  # trained by sb3: no resume from a stopped run
ONLINE = (*SB3_METHODS, "REINFORCE", "IQL online (scratch)", "IQL offline-to-online")
METHODS = (*RULES, *OFFLINE, *ONLINE)


def jobs(args) -> list[dict]:
    """Every run, in the order they are worth having: rules, offline on each dataset, online; each learned one on
    each observation track (a rule reads the scalars and the mask only: one run serves both tracks)."""
    out = []
    tracks = getattr(args, "tracks", ["full"])
    if "rules" in args.only:
        for label, name in RULES.items():
            for seed in (range(args.seeds) if name in SEEDED_RULES else [0]):
                out.append({"family": "rule", "method": label, "rule": name, "dataset": "-", "seed": seed,
                            "track": "-"})
    if "offline" in args.only:
        for dataset in args.datasets:
            out += [{"family": "offline", "method": m, "dataset": dataset, "seed": s, "track": t} for m in OFFLINE
                    for t in tracks for s in range(args.seeds)]
    if "online" in args.only:
        recipe = RECIPE_DATASET if RECIPE_DATASET in args.datasets else args.datasets[0]
        out += [{"family": "online", "method": m, "dataset": recipe if "offline-to" in m else "-", "seed": s,
                 "track": t} for m in ONLINE for t in tracks for s in range(args.seeds)]

    methods = getattr(args, "methods", None)
    if methods:
        out = [j for j in out if j["method"] in methods]

    def cost(job):  # cheap first, so a stopped run has the most complete methods: IQL's updates are ~20x slower
        iql = "IQL" in job["method"]
        return (job["family"] != "rule", iql, job["dataset"] not in ("-", args.datasets[0]), job["family"] == "online",
                job["track"] == "full")
    return sorted(out, key=cost)


def run_name(job: dict) -> str:
    track = "" if track_of(job) in ("full", "-") else f"__{track_of(job)}"  # full-track runs keep their old names
    return "".join(c if c.isalnum() else "_" for c in f"{job['method']}__{job['dataset']}__s{job['seed']}{track}")


def buffer_of(dataset: str, episodes: int, track: str = "full", n_step: int = 1):
    from morca_env.data import CollectionRecipe, to_replay_buffer
    from morca_env.data.integrity import load_dataset

    data = load_dataset(CollectionRecipe.from_file(DATASETS[dataset]).dataset_id)
    if data.total_episodes < episodes:
        raise SystemExit(f"{dataset}: {data.total_episodes} episodes collected, --episodes {episodes} asked; run "
                         f"morca collect {DATASETS[dataset]} --episodes {episodes}")
    return to_replay_buffer(data, episode_indices=list(range(episodes)), n_step=n_step,  # flat
                            track=None if track == "full" else track)


def offline_algo(method: str, buffer, updates: int, seed: int, track: str = "full", checkpoints=(), on_checkpoint=None,
                 gamma: float = GAMMA, device: str = "cpu", run_dir: Path | None = None):
    """`method` trained on `buffer`: the MORCA IQL reads the full track's flat buffer, its latent branch off on the
    scalars track (the paper's scalar state); the others read the track's own flat observations. At each update
    count in `checkpoints`, `on_checkpoint(policy, updates_so_far)` (the learning curve). The MORCA IQL trains on
    `device`; the MLP algorithms on the CPU (their updates cost milliseconds there: a GPU would add transfers).
    With `run_dir`, the networks and optimizers are saved after each checkpoint, and a run interrupted there
    continues from them (its sampling then draws from a stream seeded by the seed and the updates done)."""
    import d3rlpy

    import agents

    d3rlpy.seed(seed)
    algo = offline_config(method, track, gamma).create(device=device if method == "IQL (MORCA)" else "cpu")
    wrap = (lambda a: agents.MorcaPolicy(a)) if method == "IQL (MORCA)" else (lambda a: a)
    done = _resume_offline(algo, buffer, run_dir, seed, updates)
    for stop in sorted({*(c for c in checkpoints if done < c < updates), updates} - {done}):
        algo.fit(buffer, n_steps=stop - done, n_steps_per_epoch=stop - done, show_progress=False,
                 logger_adapter=d3rlpy.logging.NoopAdapterFactory())  # a later fit continues the same networks
        done = stop
        if on_checkpoint is not None and stop in checkpoints:
            on_checkpoint(wrap(algo), done)
        if run_dir is not None:
            _save_offline(algo, run_dir, done)
    return wrap(algo)


PROGRESS = "progress.json"  # in a run's train folder: its learning curve and seconds so far


def _progress(run_dir: Path | None) -> dict | None:
    """What an interrupted run had recorded (curve, train_s, eval_s), or None."""
    if run_dir is None or not (run_dir / PROGRESS).exists():
        return None
    return json.loads((run_dir / PROGRESS).read_text())


def _save_progress(run_dir: Path, curve: list, train_s: float, eval_s: float) -> None:
    from morca_env.utils.io import atomic_write_text

    atomic_write_text(run_dir / PROGRESS, json.dumps({"curve": curve, "train_s": train_s, "eval_s": eval_s}))


OFFLINE_STATE = "offline.json"  # in a run's train folder: the updates done and the file of their networks


def _resume_offline(algo, buffer, run_dir: Path | None, seed: int, updates: int) -> int:
    """The updates an interrupted run of this job had done, its networks and optimizers loaded into `algo`; else 0."""
    if run_dir is None or not (run_dir / OFFLINE_STATE).exists():
        return 0
    import d3rlpy

    state = json.loads((run_dir / OFFLINE_STATE).read_text())
    if state.get("config", algo.config.serialize()) != algo.config.serialize():  # another config's networks
        print(f"{run_dir} was trained with another config; the run starts over", file=sys.stderr)
        return 0
    done = int(state["updates"])
    if not 0 < done <= updates:
        raise ValueError(f"{run_dir / OFFLINE_STATE} holds {done} updates; valid: 1..{updates} (this board's "
                         f"--updates). Delete {run_dir} to train the run from the start")
    algo.build_with_dataset(buffer)
    algo.load_model(str(run_dir / state["model"]))
    algo.set_grad_step(done)  # target syncs count from the run's first update
    d3rlpy.seed(seed * 1_000_003 + done)  # uninterrupted runs keep their one stream; a resumed run gets its own
    return done


def _save_offline(algo, run_dir: Path, done: int) -> None:
    """The networks after `done` updates, written before the state file names them (a crash keeps the last pair)."""
    from morca_env.utils.io import atomic_path, atomic_write_text

    model = f"model_{done}.d3"
    with atomic_path(run_dir / model) as tmp:
        algo.save_model(str(tmp))
    atomic_write_text(run_dir / OFFLINE_STATE, json.dumps({"updates": done, "model": model,
                                                           "config": algo.config.serialize()}))
    for old in run_dir.glob("model_*.d3"):
        if old.name != model:
            old.unlink()


def offline_config(method: str, track: str = "full", gamma: float = GAMMA):
    """The d3rlpy config `method` trains with: the env's discount, every other setting the library's default."""
    import d3rlpy

    import agents

    # IQL's twin Q and V share one encoder: the paper's architecture allows it, and it halves the update cost
    # (benchmarks/bench_update_cost.py), so the board's common budget buys the method more of what it needs
    encoder = agents.MorcaEncoderFactory(features="" if track == "scalars" else "p3,mean,var")
    shared = functools.partial(agents.DiscreteIQLConfig, shared_critic_encoder=True, actor_encoder_factory=encoder,
                               critic_encoder_factory=encoder, value_encoder_factory=encoder)
    configs = {"IQL (MORCA)": shared, "DiscreteCQL": d3rlpy.algos.DiscreteCQLConfig,
               "DiscreteBCQ": d3rlpy.algos.DiscreteBCQConfig, "DiscreteBC": d3rlpy.algos.DiscreteBCConfig,
               "DQN (offline)": d3rlpy.algos.DQNConfig}
    return configs[method](gamma=gamma)


def sb3_options(method: str, steps: int, n_step: int = 1) -> dict:
    """What the board sets on an sb3 method (the env's discount, a rollout and warm-up that fit its episodes, DQN's
    return horizon); every other setting is the library's default."""
    if method == "MaskablePPO":
        return {"n_steps": 250, "batch_size": 50, "gamma": GAMMA}
    return {"learning_starts": 250, "buffer_size": steps, "gamma": GAMMA, "n_steps": n_step}


def online_config(episodes: int, updates: int, n_step: int, **given):
    """The MORCA online trainers' config at the board's budget: 4 rounds of episodes (fewer when there are fewer
    episodes), the offline update budget spread over their epochs (one warm-up, two joint each)."""
    from agents.online import OnlineConfig

    rounds = min(4, episodes)
    return OnlineConfig(rounds=rounds, trajectories_per_round=episodes // rounds, warmup_epochs=1, joint_epochs=2,
                        max_steps_per_epoch=max(1, updates // (3 * rounds)), n_step=n_step, **given)


def hyperparameters(n_step: int, episodes: int, updates: int) -> list[tuple[str, str]]:
    """(method, its training settings) as the board builds them, for the page: read from the configs themselves."""
    import dataclasses
    import inspect

    from agents.reinforce import ReinforceConfig

    try:
        from sb3_contrib import MaskablePPO
        from stable_baselines3 import DQN
        sb3 = (("MaskablePPO", MaskablePPO), ("DQN (sb3)", DQN))
    except ImportError:  # the board's sb3 rows need the [sb3] extra; the page names what it can
        sb3 = ()

    names = {"learning_rate": "lr", "critic_learning_rate": "critic lr", "actor_learning_rate": "actor lr",
             "batch_size": "batch", "gamma": "gamma", "target_update_interval": "target sync every",
             "tau": "target tau", "expectile": "expectile", "alpha": "CQL alpha", "n_steps": "n-step",
             "n_epochs": "epochs", "learning_starts": "learning starts", "exploration_fraction": "exploration fraction",
             "n_step": "n-step", "rounds": "rounds", "trajectories_per_round": "episodes / round",
             "max_steps_per_epoch": "updates / epoch", "episodes_per_update": "episodes / update",
             "baseline_decay": "baseline decay", "observation": "observation",
             "shared_critic_encoder": "critic and value share an encoder"}
    steps = episodes * 50
    rows = []
    for method in OFFLINE:
        config = offline_config(method)
        fields = {k: getattr(config, k) for k in names if hasattr(config, k)}
        if method != "DiscreteBC":  # behaviour cloning has no value target
            fields["n_steps"] = n_step
        rows.append((method, fields))
    for method, algo in sb3:
        defaults = {k: v.default for k, v in inspect.signature(algo.__init__).parameters.items()}
        fields = {k: v for k, v in {**defaults, **sb3_options(method, steps, n_step)}.items() if k in names}
        if method == "DQN (sb3)":
            fields["observation"] = "flat (mask inside)"
        rows.append((method, {("rollout" if k == "n_steps" and method == "MaskablePPO" else k): v
                              for k, v in fields.items()}))
    online = dataclasses.asdict(online_config(episodes, updates, n_step))
    rows.append(("IQL online (both)", {k: v for k, v in online.items() if k in names}))
    rows.append(("REINFORCE", {k: v for k, v in dataclasses.asdict(ReinforceConfig()).items() if k in names}))
    names["rollout"] = "rollout"
    def shown(key, value):
        if isinstance(value, bool):  # a switch reads as its name, or not at all
            return names[key] if value else None
        return f"{names[key]} {value:g}" if isinstance(value, float) else f"{names[key]} {value}"

    return [(method, ", ".join(filter(None, (shown(k, v) for k, v in fields.items())))) for method, fields in rows]


def curve_points(total: int, points: int) -> list[int]:
    """`points` checkpoints up to `total`, each twice the one before (a learning curve's x axis)."""
    return sorted({max(1, total >> (points - 1 - i)) for i in range(points)}) if points > 0 else []


class Validation:
    """The learning curve's measure: the normalized score on validation pairs of training prompts (disjoint from
    every slice the board trains, fits or selects on, and from the suite), against references measured on them."""

    def __init__(self, references: dict):
        self.references = references
        self.envs: dict[str, object] = {}

    def __call__(self, policy) -> dict:
        from morca_env.evaluation import benchmark

        track = benchmark.policy_track(policy) or "full"
        if track not in self.envs:
            self.envs[track] = benchmark.make_env(ENV_ID, validation_suite(), observation=track)
        rows = benchmark.play(benchmark.as_policy(policy), self.envs[track], validation_suite(), progress=False,
                              references=self.references)
        scores = benchmark.score(rows, self.references)
        per_target = {f"{t:g}": s.normalized for t, s in scores.items()}
        return {"normalized": float(sum(per_target.values()) / len(per_target)), "per_target": per_target}

    def close(self):
        for env in self.envs.values():
            env.close()


def validation_suite():
    from morca_env.evaluation import benchmark

    suite = benchmark.suite_of(ENV_ID)
    return benchmark.Suite(ENV_ID, VALIDATION_PROMPTS, suite.targets, suite.env_kwargs, "validation pairs")


def validation_references(out: Path) -> dict:
    """The random feasible and best fixed references on the validation pairs, measured once per board (cached)."""
    from morca_env.evaluation import benchmark
    from morca_env.utils.io import atomic_write_text

    path = out / "validation_references.json"
    if path.exists():
        return json.loads(path.read_text())
    refs = benchmark.measure_references(ENV_ID, suite=validation_suite(), progress=False)
    atomic_write_text(path, json.dumps(refs) + "\n")
    return refs


def online_policy(job: dict, args, run_dir: Path, checkpoints=(), on_checkpoint=None):
    """Train one online method for `--online-episodes` episodes of the training env; returns what evaluate takes.
    sb3's methods and REINFORCE call `on_checkpoint(policy, episodes_so_far)` at each of `checkpoints`; the MORCA
    trainers at the end of each round (their unit), and offline-to-online IQL also at 0 (its offline phase alone)."""
    from morca_env.evaluation import benchmark

    method, seed, episodes, track = job["method"], job["seed"], args.online_episodes, track_of(job)
    features = "" if track == "scalars" else "p3,mean,var"  # the MORCA networks' latent branch
    sb3_track = method in SB3_METHODS and track == "scalars"
    flat = method == "DQN (sb3)"  # sb3's n-step replay buffer refuses Dict observations: the flat layout, mask inside
    env = benchmark.training_env(ENV_ID, **({"observation": "scalars"} if sb3_track else {}),
                                 **({"flat": True} if flat else {}))
    steps = episodes * env.unwrapped.num_steps
    if method in SB3_METHODS:
        from sb3_contrib import MaskablePPO
        from stable_baselines3 import DQN

        algo = MaskablePPO if method == "MaskablePPO" else DQN
        model = algo("MlpPolicy" if flat else "MultiInputPolicy", env, seed=seed, verbose=0, device="cpu",
                     **sb3_options(method, steps, getattr(args, "n_step", 1)))
        done = 0
        for stop in sorted({*(c for c in checkpoints if 0 < c < episodes), episodes}):
            model.learn(total_timesteps=(stop - done) * env.unwrapped.num_steps, reset_num_timesteps=False)
            done = stop
            if on_checkpoint is not None and stop in checkpoints:
                on_checkpoint(model, done)
        return model
    import agents
    from agents.online import OnlineTrainer
    from agents.reinforce import Reinforce, ReinforceConfig

    targets = benchmark.suite_of(ENV_ID).targets
    speedups = (min(targets), max(targets))
    if method == "REINFORCE":
        trainer = Reinforce(env, ReinforceConfig(total_episodes=episodes, speedup_range=speedups, seed=seed,
                                                 features=features), run_dir, progress=False)
        trainer.train(checkpoints, on_checkpoint)
        return trainer.policy()
    offline, buffer = None, None
    if method == "IQL offline-to-online":
        buffer = buffer_of(job["dataset"], args.episodes, n_step=getattr(args, "n_step", 1))
        offline = offline_algo("IQL (MORCA)", buffer, args.updates, seed, track, device=iql_device(args),
                               checkpoints=curve_points(args.updates, getattr(args, "curve_points", 0)),
                               run_dir=run_dir / "offline").algo  # saved where the offline board's runs are
        if on_checkpoint is not None and checkpoints:
            on_checkpoint(agents.MorcaPolicy(offline), 0)
    config = online_config(episodes, args.updates, getattr(args, "n_step", 1), speedup_range=speedups, seed=seed,
                           features=features)
    trainer = OnlineTrainer(env, config, run_dir, offline_algo=offline, offline_buffer=buffer, progress=False,
                            device=iql_device(args))
    trainer.run(None if on_checkpoint is None or not checkpoints else
                lambda algo, count: on_checkpoint(agents.MorcaPolicy(algo), count))
    return agents.MorcaPolicy(trainer.algo)


def iql_device(args) -> str:
    """The torch device the MORCA IQL runs train on (`--device`; boards from before it: the CPU)."""
    return getattr(args, "device", "cpu")


def machine(device: str = "cpu") -> str:
    """Where a run was made, for the page (the board is resumed across sessions and machines): the CPU model and
    its cores, and the GPU a run trained on."""
    import platform

    model = platform.processor() or platform.machine()
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    where = f"{model}, {os.cpu_count()} cores"
    if device.startswith("cuda"):
        import torch

        where += f", trained on {torch.cuda.get_device_name(torch.device(device))}"
    return where


def run_job(job: dict, args) -> dict:
    import torch

    torch.set_num_threads(1)
    import morca_env  # noqa: F401
    from morca_env.evaluation import benchmark
    from morca_env import schedulers

    env = benchmark.make_env(ENV_ID)
    validate = None
    if job["family"] != "rule" and getattr(args, "curve_points", 0):
        validate = Validation(args.validation_references)
    run_dir = Path(args.out) / "train" / run_name(job) if getattr(args, "out", None) else None
    # a run that continues where it stopped (not sb3's: they start over) keeps its curve and seconds so far
    before = _progress(run_dir) if job["method"] not in SB3_METHODS else None
    curve = before["curve"] if before else []
    train_before, eval_before = (before["train_s"], before["eval_s"]) if before else (0.0, 0.0)
    eval_s = eval_before

    def checkpoint(policy, count):
        nonlocal eval_s
        if any(p["x"] == count for p in curve):  # measured before the stop (the trainer redid its last stretch)
            return
        t = time.perf_counter()
        curve[:] = sorted([*curve, {"x": count, **validate(policy)}], key=lambda p: p["x"])
        eval_s += time.perf_counter() - t
        if run_dir is not None:
            _save_progress(run_dir, curve, train_before + time.perf_counter() - t0 - (eval_s - eval_before), eval_s)

    t0 = time.perf_counter()
    if job["family"] == "rule":
        policy = schedulers.make(job["rule"], env, **({"seed": job["seed"]} if job["rule"] in SEEDED_RULES else {}))
        budget = "none (a fixed rule)"
    elif job["family"] == "offline":
        track = "full" if job["method"] == "IQL (MORCA)" else track_of(job)  # the buffer the algorithm reads
        buffer = buffer_of(job["dataset"], args.episodes, track, getattr(args, "n_step", 1))
        policy = offline_algo(job["method"], buffer, args.updates,
                              job["seed"], track_of(job), curve_points(args.updates, getattr(args, "curve_points", 0)),
                              checkpoint if validate else None, device=iql_device(args), run_dir=run_dir)
        budget = f"{args.updates} updates on {args.episodes} episodes"
    else:
        policy = online_policy(job, args, run_dir,
                               curve_points(args.online_episodes, getattr(args, "curve_points", 0)),
                               checkpoint if validate else None)
        budget = f"{args.online_episodes} env episodes" + (f" after {args.updates} offline updates"
                                                           if job["dataset"] != "-" else "")
    if validate is not None:
        x_final = args.updates if job["family"] == "offline" else args.online_episodes
        if not curve or curve[-1]["x"] != x_final:  # the MORCA online trainers: their final point
            checkpoint(policy, x_final)
        validate.close()
    train_s = train_before + time.perf_counter() - t0 - (eval_s - eval_before)
    if run_dir is not None and job["family"] != "rule":
        _save_progress(run_dir, curve, train_s, eval_s)
    t_scored = time.perf_counter()
    # a policy reading the scalars track's own observations plays in an env on that track (evaluate makes it)
    own_track = track_of(job) == "scalars" and benchmark.policy_track(policy) == "scalars"
    result = benchmark.evaluate(policy, ENV_ID, env=None if own_track else env, progress=False, name=job["method"],
                                pair_step=args.pair_step)
    env.close()
    trained_on = iql_device(args) if "IQL" in job["method"] else "cpu"
    return {**job, "machine": machine(trained_on), "budget": budget, "train_s": train_s,
            "eval_s": eval_s + time.perf_counter() - t_scored,
            "played_on": result.observation, "curve": curve,
            "curve_x": "gradient updates" if job["family"] == "offline" else "env episodes",
            "scores": {f"{t:g}": {"normalized": s.normalized, "psnr": s.psnr, "ssim": s.ssim,
                                  "vs_best_fixed": s.vs_best_fixed, "projected": s.projected_per_episode}
                       for t, s in result.scores.items()}}


# the settings a run's scores depend on: a rerun into the same --out with others would mix two protocols
FINGERPRINT = ("episodes", "updates", "online_episodes", "pair_step", "curve_points", "n_step")


def finished_run(path: Path) -> dict | None:
    """A run file's record when it is whole and every score finite; else None (named on stderr when the file
    exists: a run not made yet is no news), so it reruns."""
    import math

    if not path.exists():
        return None

    try:
        record = json.loads(path.read_text())
        values = [v for s in record["scores"].values() for v in (s["normalized"], s["psnr"])]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        print(f"run file {path} is damaged ({type(error).__name__}: {error}); it will run again", file=sys.stderr)
        return None
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
        print(f"run file {path} holds a non-finite score; it will run again", file=sys.stderr)
        return None
    return record


def check_fingerprint(out: Path, args) -> None:
    """Refuse a rerun into `out` whose settings differ from the ones its runs were made with."""
    from morca_env.utils.io import atomic_write_text

    path = out / "settings.json"
    mine = {k: getattr(args, k) for k in FINGERPRINT}
    if path.exists():
        theirs = json.loads(path.read_text())
        # a board made before learning curves recorded none: it continues with --curve-points 0
        # and one made before the return horizon was a setting trained on one-step TD
        theirs = {"curve_points": 0, "n_step": 1, **theirs}
        changed = {k: (theirs.get(k), v) for k, v in mine.items() if theirs.get(k) != v}
        if changed:
            raise SystemExit(f"{out} holds runs made with other settings ("
                             + ", ".join(f"--{k.replace('_', '-')} {a} -> {b}" for k, (a, b) in changed.items())
                             + "): use another --out, or the same settings to continue them")
    else:
        atomic_write_text(path, json.dumps(mine, indent=1) + "\n")


def board_command(argv: list[str]) -> str:
    """The command for the page: as given, less `--workers` and `--device` (a machine's choices that change no
    protocol), so a board continued on other machines keeps one command."""
    machine_only = ("--workers", "--device")
    kept, skip = [], False
    for token in argv:
        if skip:
            skip = False
        elif token in machine_only:
            skip = True
        elif not token.startswith(tuple(f"{flag}=" for flag in machine_only)):
            kept.append(token)
    return " ".join(["morca leaderboard", *kept])


def main(argv=None) -> int:
    from morca_env.cli import positive_int, torch_device, worker_count

    p = argparse.ArgumentParser(prog="morca leaderboard", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/leaderboard")
    p.add_argument("--only", nargs="+", choices=("rules", "offline", "online"), default=["rules", "offline", "online"])
    p.add_argument("--datasets", nargs="+", choices=sorted(DATASETS), default=["random", "anchored"],
                   help="the offline methods' datasets (the first is the cheapest to complete); offline-to-online "
                        f"IQL trains on {RECIPE_DATASET!r} when it is one of them")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=None, metavar="METHOD",
                   help="run these methods' entries only (the page still lists every entry): one of "
                        + ", ".join(repr(m) for m in METHODS))
    p.add_argument("--seeds", type=positive_int, default=5)
    p.add_argument("--tracks", nargs="+", choices=("full", "scalars"), default=["full", "scalars"],
                   help="the observation tracks every learned method runs on")
    p.add_argument("--episodes", type=positive_int, default=400, help="dataset episodes the offline algorithms train on")
    p.add_argument("--updates", type=positive_int, default=1000, help="gradient updates of every offline algorithm")
    p.add_argument("--online-episodes", type=positive_int, default=48, help="env episodes of every online algorithm")
    p.add_argument("--pair-step", type=positive_int, default=2, help="score every n-th pair of the suite")
    p.add_argument("--curve-points", type=int, default=4, choices=range(0, 9), metavar="{0..8}",
                   help="learning-curve checkpoints per learned run, each at twice the updates (episodes) of the one "
                        "before, scored on validation pairs of training prompts; 0: none")
    p.add_argument("--n-step", type=positive_int, default=50,
                   help="return horizon of the value-based methods' targets, gamma 1 "
                        "(morca_env.data.transition_picker): "
                        "50, the episode, makes each target the episode's own return (Monte-Carlo); 1: one-step TD, "
                        "the paper's, whose terminal-only reward takes d3rlpy's target network (updated every 8000 "
                        "updates by default) longer than the board's budget to propagate")
    p.add_argument("--workers", type=worker_count, default=2)
    p.add_argument("--device", type=torch_device, default="cpu",
                   help="where the MORCA IQL runs train (offline, offline-to-online, online); the other methods train "
                        "on the CPU, every run plays its episodes there")
    p.add_argument("--report", action="store_true", help="only write the page from the finished runs")
    p.add_argument("--page", default=None, help="the Markdown page to write (default: <out>/leaderboard.md; the "
                   "project's own page is its documentation's results/leaderboard_tiny.md)")
    args = p.parse_args(argv)
    args.command = board_command(sys.argv[1:] if argv is None else argv)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        p.error(f"--out {out} is a file; give a directory")
    runs = out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    from morca_env.utils.io import atomic_write_text, exclusive_lock

    failed = []
    with exclusive_lock(out / ".lock", f"leaderboard {out}"):  # one writer: two would run every job twice
        if not args.report:
            check_fingerprint(out, args)
        elif (out / "settings.json").exists():  # the page states the settings its runs were made with
            vars(args).update({k: v for k, v in json.loads((out / "settings.json").read_text()).items()
                               if k in FINGERPRINT})
        todo = [j for j in jobs(args) if finished_run(runs / f"{run_name(j)}.json") is None]
        command_file = out / "command.txt"  # the command that made the runs, for the page
        if not args.report and not args.methods:  # a subset continues the board; its command stays the whole one
            atomic_write_text(command_file, args.command)
        args.run_command = command_file.read_text().strip() if command_file.exists() else None
        if not args.report and todo:
            from tqdm import tqdm

            if args.curve_points and any(j["family"] != "rule" for j in todo):
                args.validation_references = validation_references(out)

            # the workers end with this process, even when it is killed -9 (a run would otherwise train on, orphaned)
            with ProcessPoolExecutor(args.workers, mp_context=get_context("spawn"), initializer=exit_with_parent,
                                     initargs=(os.getpid(),)) as pool:
                futures = {pool.submit(run_job, j, args): j for j in todo}
                for future in tqdm(as_completed(futures), total=len(futures), desc="leaderboard runs"):
                    job = futures[future]
                    try:
                        atomic_write_text(runs / f"{run_name(job)}.json", json.dumps(future.result(), indent=1))
                        # its resume state is spent: a rerun of the job (a deleted record) trains afresh
                        shutil.rmtree(out / "train" / run_name(job), ignore_errors=True)
                    except Exception as error:  # one failed run does not stop the others; rerun to retry it
                        failed.append(run_name(job))
                        print(f"run {run_name(job)} failed: {error!r}", file=sys.stderr)
        # not ".name.json.XXXX.tmp.json": a run file being written (or left by a writer killed mid-write)
        done = [r for r in (finished_run(f) for f in sorted(runs.glob("[!.]*.json"))) if r is not None]
        if find_spec("rliable") is None:  # a machine that only makes runs (a GPU sweep) may lack the page's extra
            from morca_env.utils.extras import install_hint

            message = (f"the page needs rliable ({install_hint('benchmark')}); {len(done)} finished runs are in "
                       f"{runs}: write the page where rliable is installed, with --report")
            if args.report:
                raise SystemExit(message)
            print(f"page not written: {message}", file=sys.stderr)
        else:
            from agents.leaderboard_report import write_page

            write_page(done, args, Path(args.page) if args.page else out / "leaderboard.md", jobs(args),
                       hyperparameters(args.n_step, args.online_episodes, args.updates))
    if failed:
        print(f"{len(failed)} run(s) failed: {', '.join(failed)}; rerun to retry them", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
