"""One evaluation run: every method's episodes at every target over a prompt suite, each timed next to a stock
run, written row by row to `<out>/episodes.jsonl` (resumable), then the tables, figures and videos.

The run is defined by its `EvaluationConfig`; `run.json` records what defines its rows (the env, the suite, the
timing protocol, each method's spec with its checkpoints' sha256), so a rerun into the same `out` continues only
an identical run and names what changed otherwise: old rows are never reported as new ones.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import gymnasium as gym
import numpy as np
from tqdm import tqdm

from .. import schedulers
from ..speedup.measure import fastest, measure_calibration, stock_seconds
from ..speedup.files import load_threshold_map
from ..parallel.executors import WorkerFailed
from ..speedup.governor import SpeedupGovernor
from ..utils.io import atomic_write_text, exclusive_lock, read_json_lines, repair_json_lines, writable_directory
from ..diffusion.video import side_by_side, write_video
from ..parallel.workers import needs_gpu
from .comparison import pending_matched
from .episodes import GroupEvaluator, Methods, evaluate_episode, make_envs, run_episode, scheduler_step_cost, work_entry
from .plots import plot_pareto, plot_schedules, schedule_rows
from .tables import summarise, write_tables

DEFAULT_METHODS = ("uniform", "seacache-global", "seacache-exact", "random")
DEFAULT_BASELINES = ("seacache-exact", "seacache-global", "best-fixed")


DEFAULT_PROMPTS = 200
ROW_KEYS = ("method", "target", "prompt_index", "prompt", "seed", "psnr")  # what every row of episodes.jsonl holds


@dataclass(frozen=True)
class EvaluationConfig:
    """What an evaluation runs. `methods`: `name[=spec]` strings as `schedulers.parse_method` reads them;
    `targets`/`suite` default to the model's evaluation targets and held-out suite."""

    env_id: str = "MorcaTiny-v0"
    env_kwargs: dict = field(default_factory=dict)
    methods: tuple[str, ...] = DEFAULT_METHODS
    targets: tuple[float, ...] | None = None
    suite: str | None = None
    prompts: int = DEFAULT_PROMPTS  # at most this many by default (a smaller suite plays all it has)
    skip_prompts: int = 0
    out: Path = Path("runs/eval")
    videos: int = 3
    lpips: bool = False
    threads: int | None = None
    calibrate: int = 0
    timing_repeats: int = 1
    feedback: bool = False
    baselines: tuple[str, ...] = DEFAULT_BASELINES
    matched: bool = True
    same_k: bool = False
    workers: int = 2

    def __post_init__(self):
        object.__setattr__(self, "out", Path(self.out))
        object.__setattr__(self, "methods", tuple(self.methods))
        for name, value, low in (("prompts", self.prompts, 1), ("skip_prompts", self.skip_prompts, 0),
                                 ("videos", self.videos, 0), ("calibrate", self.calibrate, 0),
                                 ("timing_repeats", self.timing_repeats, 1), ("workers", self.workers, 1)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"{name}={value!r}: give an integer >= {low}")
        if not self.methods:
            raise ValueError("methods=(): give at least one method")
        labels = [label for label, _ in self.parsed_methods()]
        twice = sorted({label for label in labels if labels.count(label) > 1})
        if twice:
            raise ValueError(f"method label(s) {twice} given more than once: each label names one method's rows "
                             "(give the second one its own label, e.g. other=<checkpoint>)")
        if self.feedback and self.same_k:
            raise ValueError("feedback and same_k exclude each other: per-method feedback would give each method "
                             "its own K")

    def parsed_methods(self) -> list[tuple[str, str | None]]:
        """(label, spec or None) per method."""
        out = []
        for item in self.methods:
            label, _, spec = item.partition("=")
            out.append((label, spec or None))
        return out


@dataclass
class EvaluationResult:
    rows: list[dict]
    table: list[dict]
    text: str


def file_digest(path: str | Path) -> str:
    """sha256 of a file, or of a directory's files (names and contents), for a run's fingerprint."""
    path = Path(path)
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        digest.update(str(file.relative_to(path) if path.is_dir() else file.name).encode())
        with open(file, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def method_fingerprint(label: str, spec: str | None) -> dict:
    """A method as the run records it: its registry spec, and each file it reads (checkpoints, schedule files,
    search directories) by sha256, so a retrained checkpoint under an old label is a different method."""
    options = schedulers.parse_method(label, spec)
    record = {"spec": options}
    if "path" in options:
        record["files"] = {p: file_digest(p) if Path(p).exists() else "missing"
                           for p in schedulers.registry.checkpoint_paths(options["path"])}
    return record


def run_fingerprint(config: EvaluationConfig, suite_name: str) -> dict:
    """What every row of the run depends on besides its method: changing any of it makes the old rows stale."""
    return {"env_id": config.env_id, "env_kwargs": config.env_kwargs, "suite": suite_name,
            "skip_prompts": config.skip_prompts, "lpips": config.lpips, "calibrate": config.calibrate,
            "timing_repeats": config.timing_repeats, "feedback": config.feedback, "same_k": config.same_k,
            # rows made before 2026-12-04 (only learned schedulers paid their step time in K; a governor per
            # method) are not resumed under today's protocol
            "k_costs": None if config.same_k else "every exact-K method",
            "governors": "machine-shared" if config.feedback else None}


def as_json(value):
    """`value` as `run.json` stores it (paths and other objects in env kwargs as strings), to compare like with like."""
    return json.loads(json.dumps(value, default=str))


def check_resume(out: Path, run: dict, methods: dict) -> None:
    """Refuse to continue a run whose rows were made by another configuration; -> writes `run.json` (the union of
    the old and new methods: methods may be added to a run, never changed)."""
    path = out / "run.json"
    if path.exists():
        try:
            recorded = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is damaged ({error.msg}): move the directory away to start over") from None
        changed = [f"{key}: {recorded['run'].get(key)!r} -> {value!r}" for key, value in run.items()
                   if recorded["run"].get(key) != as_json(value)]
        changed += [f"method {label!r}: {recorded['methods'][label]} -> {record}" for label, record in methods.items()
                    if label in recorded["methods"] and recorded["methods"][label] != as_json(record)]
        if changed:
            raise ValueError(f"{out} holds an evaluation made with other settings, so its rows would be reported as "
                             f"this run's: {'; '.join(changed)}. Use another out directory, or overwrite=True "
                             "(--overwrite) to start afresh")
        methods = {**recorded["methods"], **methods}
    elif (out / "episodes.jsonl").exists():
        raise ValueError(f"{out / 'episodes.jsonl'} has no run.json beside it (made by an older version), so what "
                         "made its rows is unknown: use another out directory, or overwrite=True (--overwrite)")
    atomic_write_text(path, json.dumps(as_json({"run": run, "methods": methods}), indent=1) + "\n")


def check_rows_match_pairs(rows: list[dict], pairs: list, log: Path) -> None:
    for row in rows:
        index = row["prompt_index"]
        if index < len(pairs) and (row["prompt"], row["seed"]) != tuple(pairs[index]):
            raise ValueError(f"{log}: row of prompt index {index} is ({row['prompt']!r}, seed {row['seed']}) but the "
                             f"suite's pair there is {tuple(pairs[index])!r}: the suite changed; use another out "
                             "directory or --overwrite")


def speedup_range(method_env, scheduler_cost_s: float) -> tuple[float, float]:
    """The speedups a method's env accepts: a learned scheduler's own per-step cost lowers the highest one."""
    return method_env.unwrapped.calibration.with_scheduler_cost(scheduler_cost_s).speedup_range


def governor_for(method_env, target: float, scheduler_cost_s: float) -> SpeedupGovernor:
    """A governor whose requests stay inside the range the method's env accepts."""
    return SpeedupGovernor(target, speedup_range(method_env, scheduler_cost_s))


def governors(methods, targets, loaded, k_cost: dict, own_k: set, feedback: bool) -> tuple[dict, dict]:
    """-> ({(method, target): governor}, {method: speedup range its env accepts}); no governors without feedback.

    A method that spends its own K (a threshold rule) gets its own governor: its speedup for a request depends on
    the rule's calibration, which feedback must correct per method. Methods at an exact K share one governor per
    target: for them speedup -> K is the calibration's (their own inference cost counted), so the only unknown is
    the machine's pace, which is the same for all of them. Measured reason: with a governor per method, the best
    fixed schedule and a scheduler that played it action for action ran different K on 45% of 60 prompts and
    differed by -0.15 to +0.36 dB; sharing the machine's governor puts equal
    schedulers of equal cost at the same K, so equal-speedup differences measure the schedulers, not the governors.
    """
    if not feedback:
        return {}, {}
    ranges = {m: speedup_range(loaded[m][1], k_cost[m]) for m, _ in methods}
    exact = [m for m, _ in methods if m not in own_k]
    out = {}
    for target in targets:
        for m in exact:
            lo, hi = ranges[m]
            if not lo <= target <= hi:
                raise ValueError(f"target speedup {target} is outside the range method {m!r} reaches on this "
                                 f"calibration, [{lo:.2f}, {hi:.2f}] (its own inference counted)")
        machine = (SpeedupGovernor(target, (min(ranges[m][0] for m in exact), max(ranges[m][1] for m in exact)))
                   if exact else None)
        for m, _ in methods:
            out[m, target] = governor_for(loaded[m][1], target, k_cost[m]) if m in own_k else machine
    return out, ranges


def use_fresh_calibration(config: EvaluationConfig, targets, env, free_env, threads):
    """Measure (or, on resume, reload) this run's calibration, install it in both envs; -> the
    SeaCache threshold map re-read through it. Wall-clock ratios drift with the machine's state, so
    targets are only hit with a calibration measured next to the episodes it converts."""
    from ..speedup.calibration import SpeedupCalibration

    path = config.out / "calibration.json"
    if path.exists():
        calibration = SpeedupCalibration.from_json(path)
        print(f"calibration from {path} (resume): {calibration.source}")
    else:
        measured = measure_calibration(env, repeats=config.calibrate, threads=threads,
                                       timing_repeats=config.timing_repeats)
        print(measured.table())
        calibration = measured.calibration
        calibration.to_json(path)
    lo, hi = calibration.speedup_range
    bad = [t for t in targets if not lo <= t <= hi]
    if bad:
        raise ValueError(f"targets {bad} are outside the speedups this machine reaches now, [{lo:.2f}, {hi:.2f}] "
                         f"({path}); pick targets in that range, or delete the file to measure again")
    old = env.calibration
    env.calibration = free_env.calibration = calibration
    return load_threshold_map(env.preset.name).recalibrated(old, calibration)


class EvaluationRun:
    """The state of one run between its steps: envs, loaded methods, prompt pairs, rows so far."""

    def __init__(self, config: EvaluationConfig, executor=None, threads: int | None = None):
        from ..models.presets import PRESETS

        self.config, self.executor, self.threads = config, executor, threads
        if executor is not None and config.feedback:
            raise ValueError("feedback needs the episodes in order on one machine (each governor learns from the "
                             "previous episodes' speedups); run without feedback on Ray")
        preset = PRESETS[gym.spec(config.env_id).kwargs["model"]]
        self.targets = list(config.targets or preset.eval_targets)
        self.kwargs = {"lpips": config.lpips, **config.env_kwargs}
        self.env, self.free_env = make_envs(config.env_id, config.suite or preset.eval_suite, self.kwargs)
        suite = self.env.unwrapped.suite
        self.pairs = suite.pairs()[config.skip_prompts: config.skip_prompts + config.prompts]
        if config.skip_prompts + config.prompts > len(suite.pairs()) and config.prompts != DEFAULT_PROMPTS:
            raise ValueError(f"prompts={config.prompts} (after skipping {config.skip_prompts}) asks for more pairs "
                             f"than the suite's {len(suite.pairs())}; valid: 1 to "
                             f"{len(suite.pairs()) - config.skip_prompts}")
        if not self.pairs:
            raise ValueError(f"skip_prompts={config.skip_prompts} leaves no prompts: the suite has "
                             f"{len(suite.pairs())}")
        self.methods = config.parsed_methods()
        self.fingerprint = (run_fingerprint(config, getattr(suite, "name", str(config.suite))),
                            {label: method_fingerprint(label, spec) for label, spec in self.methods})

    def prepare(self) -> None:
        """Check the out directory against this run, calibrate if asked, load the methods and the rows so far."""
        config = self.config
        check_resume(config.out, *self.fingerprint)
        self.threshold_map = (use_fresh_calibration(config, self.targets, self.env.unwrapped, self.free_env.unwrapped,
                                                    self.threads) if config.calibrate else None)
        self.loaded = Methods(self.methods, self.env, self.free_env, self.threshold_map)
        first = self.pairs[0]
        self.own_k = {m for m, _ in self.methods if self.loaded[m][1] is self.free_env}
        # every exact-K method pays its own per-step time in K (the best fixed schedule ~16 us a step, the shipped
        # scheduler ~20 us on MorcaTiny): charging only learned ones put a scheduler that plays the best fixed
        # schedule one K above it on 6-10% of prompts at equal measured speedup
        # (an ideal, unmeasured calibration maps no seconds to K: there only learned schedulers are timed, and refused)
        calibration = self.env.unwrapped.calibration
        timed = bool(calibration.full_latency_s and calibration.num_steps)
        self.cost = {name: scheduler_step_cost(*self.loaded[name], *first, repeats=config.timing_repeats)
                     if getattr(self.loaded[name][0], "learned", False) or (timed and name not in self.own_k) else 0.0
                     for name, _ in self.methods}
        self.k_cost = {name: 0.0 if config.same_k else c for name, c in self.cost.items()}  # what speedup -> K counts
        self.log = config.out / "episodes.jsonl"
        repair_json_lines(self.log)
        self.rows = read_json_lines(self.log, required=ROW_KEYS)
        check_rows_match_pairs(self.rows, self.pairs, self.log)
        self.matched = ([] if not config.matched else
                        [b for b in config.baselines if b in dict(self.methods) and b not in self.own_k])
        self.governors, self.ranges = governors(self.methods, self.targets, self.loaded, self.k_cost, self.own_k,
                                                config.feedback)
        self.requests: dict[tuple, float] = {}  # (target, prompt index) -> the speedup asked of its exact-K methods
        for row in self.rows:  # resume: the governors continue from what the finished episodes realised
            if (row["method"], row["target"]) in self.governors and "requested_speedup" in row:
                self.governors[row["method"], row["target"]].record(row["requested_speedup"], row["stock_latency_s"],
                                                                    row["latency_s"])
                if row["method"] not in self.own_k:
                    self.requests[row["target"], row["prompt_index"]] = row["requested_speedup"]
        self.stock: dict[tuple, float] = {}  # (target, prompt index) -> no-cache latency timed beside its episodes

    def request(self, name: str, target: float, index: int, governor) -> float:
        """The speedup method `name` asks its env for at (target, prompt `index`). Exact-K methods share one request
        per prompt (their target's machine governor, read before the prompt's first episode), clipped to the range
        the method's env accepts."""
        if name in self.own_k:
            return governor.request()
        shared = self.requests.setdefault((target, index), governor.request())
        lo, hi = self.ranges[name]
        return min(hi, max(lo, shared))

    def pending(self) -> list[tuple]:
        done = {(r["method"], r["target"], r["prompt_index"]) for r in self.rows}
        return [(t, i, m) for t in self.targets for i in range(len(self.pairs)) for m, _ in self.methods
                if (m, t, i) not in done]

    def run_episodes(self, todo, record) -> None:
        """The episodes of `todo`, (target, prompt index, entry), an entry as `work_entry` reads it."""
        if not todo:
            return
        if self.executor is not None:
            return self.run_on_ray(todo, record)
        for target, index, entry in tqdm(todo, desc="evaluate", unit="episode"):
            label, name, budget, given_stock_s = work_entry(entry)
            policy, method_env = self.loaded.for_episode(name, target, index)
            prompt, seed = self.pairs[index]
            if (target, index) not in self.stock and given_stock_s is None:
                self.stock[target, index] = fastest(lambda: stock_seconds(self.env.unwrapped, prompt, seed),
                                                    self.config.timing_repeats)
            governor = self.governors.get((name, target)) if budget is None else None
            requested = self.request(name, target, index, governor) if governor else target
            row = evaluate_episode(label, policy, method_env, target, index, self.pairs[index], requested=requested,
                                   stock_s=given_stock_s if given_stock_s is not None else self.stock[target, index],
                                   scheduler_cost_s=self.cost[name], k_cost_s=self.k_cost[name],
                                   timing_repeats=self.config.timing_repeats, budget=budget)
            if governor:
                governor.record(requested, row["stock_latency_s"], row["latency_s"])
            record(row)

    def run_on_ray(self, todo, record) -> None:
        """The pending episodes, grouped by (target, prompt), on Ray actors (`GroupEvaluator`); each group's rows
        are written as it returns, so a killed run resumes where it stopped. Each actor times its own stock runs."""
        config = self.config
        groups: dict[tuple, list] = {}
        for target, index, entry in todo:
            groups.setdefault((target, index), []).append(entry)
        items = [(target, index, names) for (target, index), names in groups.items()]
        factory_args = (config.env_id, self.env.unwrapped.suite, self.kwargs, self.methods, self.pairs, self.cost,
                        self.k_cost, config.timing_repeats, self.env.unwrapped.calibration if config.calibrate else None,
                        self.threshold_map)
        bar = tqdm(total=len(todo), desc=f"evaluate on Ray ({config.workers} workers)", unit="episode")
        try:
            gpus = 1 if needs_gpu(config.env_id, config.env_kwargs) else 0  # a Wan env's actor holds one GPU
            for _, group_rows in self.executor.map_unordered(GroupEvaluator, factory_args, items,
                                                             workers=config.workers, threads=self.threads, gpus=gpus):
                for row in group_rows:
                    record(row)
                bar.update(len(group_rows))
        except WorkerFailed as error:
            raise RuntimeError(f"{error}; the episodes returned so far are in {self.log}: rerun the same command to "
                               "finish") from None
        finally:
            bar.close()

    def render_videos(self) -> None:
        """Side-by-side videos of the first `videos` prompts at the middle target (skipped where they exist)."""
        middle = self.targets[len(self.targets) // 2]
        for index in range(min(self.config.videos, len(self.pairs))):
            if (self.config.out / f"video_{index:03d}.mp4").exists():
                continue
            prompt, seed = self.pairs[index]
            vids = {}
            for name, _ in self.methods:
                policy, method_env = self.loaded[name]
                info, _, _ = run_episode(method_env, policy, {"prompt": prompt, "seed": seed, "speedup": middle,
                                                              "scheduler_cost_s": self.k_cost[name]})
                vids["reference"] = method_env.unwrapped.reference_video
                vids[f"{name} {min(info['psnr'], 99):.1f}dB"] = method_env.unwrapped.last_video
            write_video(side_by_side(vids), self.config.out / f"video_{index:03d}.gif")
            write_video(side_by_side(vids, min_height=256), self.config.out / f"video_{index:03d}.mp4")

    def report(self) -> EvaluationResult:
        """table.md, table.csv, pareto.png, schedules.png from the rows."""
        config, rows = self.config, self.rows
        table = summarise(rows, self.targets, self.methods)
        reference_latency = float(np.mean([r["latency_s"] * r["speedup"] for r in rows])) if rows else 0.0
        text = write_tables(config.out, table, rows, self.methods, self.targets, reference_latency, config.baselines,
                            self.own_k, self.matched)
        plot_pareto(config.out, table)
        middle = self.targets[len(self.targets) // 2]
        schedules = schedule_rows(rows, middle)
        if schedules:
            plot_schedules(config.out, schedules, f"schedules at {middle:.1f}x: {self.pairs[0][0]}")
        return EvaluationResult(rows=rows, table=table, text=text)

    def close(self) -> None:
        for policy, _ in (self.loaded.values() if hasattr(self, "loaded") else ()):
            if hasattr(policy, "close"):
                policy.close()


def run_evaluation(config: EvaluationConfig, executor=None, threads: int | None = None,
             overwrite: bool = False) -> EvaluationResult:
    """Run (or resume) the evaluation `config` describes and write its tables, figures and videos into
    `config.out`. One writer per out directory (a second one fails naming the first one's pid); `overwrite`
    discards the rows of an earlier run there instead of refusing a changed configuration."""
    writable_directory(config.out, "evaluation output --out")
    with exclusive_lock(config.out / ".lock", f"evaluation {config.out}"):
        if overwrite:
            for name in ("episodes.jsonl", "run.json", "calibration.json"):
                with contextlib.suppress(FileNotFoundError):
                    (config.out / name).unlink()
            for video in config.out.glob("video_*"):
                video.unlink()
        run = EvaluationRun(config, executor, threads)
        try:
            run.prepare()
            with open(run.log, "a") as f:
                def record(row):
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    run.rows.append(row)

                run.run_episodes(run.pending(), record)
                # a method on its own K (a native or global rule) meets each exact-budget baseline at that K too
                run.run_episodes(pending_matched(run.rows, run.own_k, run.matched), record)
            run.render_videos()
            return run.report()
        finally:
            run.close()
