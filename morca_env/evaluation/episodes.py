"""The evaluation's episodes: loading a method, timing its episode next to a stock run, one result row.

`runner` runs these in a loop on this machine (with speedup feedback if
asked) or hands groups of them to Ray actors (`GroupEvaluator`, `--ray`); the rows are
the same either way, and the driver alone writes them to `episodes.jsonl`.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from .. import schedulers
from ..speedup.measure import fastest, stock_seconds
from ..rollout import rollout


def make_envs(env_id: str, suite, env_kwargs: dict):
    """(env, free_env) on one pipeline: exact-budget schedulers run in `env`, rules that spend their own K in
    `free_env` (no budget enforced)."""
    per_episode = sorted(set(env_kwargs) & {"budget", "speedup", "enforce_budget", "prompts"})
    if per_episode:
        raise ValueError(f"env_kwargs {per_episode}: the evaluation sets these itself (the targets give each "
                         "episode's speedup and K, the suite its prompts, each method's form the budget mode); "
                         "remove them, and pass --targets / --suite instead")
    env = gym.make(env_id, budget=0, prompts=suite, **env_kwargs)
    free_env = gym.make(env_id, budget=0, enforce_budget=False, pipeline=env.unwrapped.pipe,
                        prompts=env.unwrapped.suite, **{k: v for k, v in env_kwargs.items() if k != "model_id"})
    return env, free_env


def load_method(name: str, spec: str | None, env, free_env, threshold_map=None, seed: int = 0):
    """-> (policy, env it runs in) for a command line's method `name[=spec]` (`schedulers.parse_method`: a registry
    name, `<label>=<checkpoint>`, or `<label>={"name": <registry name>, <option>: ...}`); randomised schedulers are
    seeded with `seed`, and `seacache-global` takes `threshold_map` when one is given (a recalibrated map)."""
    options = schedulers.parse_method(name, spec)
    kind = options.pop("name")
    if kind == "seacache-global" and threshold_map is not None:
        options.setdefault("threshold_map", threshold_map)
    policy = schedulers.make(kind, env, seed=seed, **options)
    return policy, (env if schedulers.needs_exact_budget(policy) else free_env)


class Methods:
    """The evaluated methods on one pair of envs. A randomised method is drawn afresh for every episode from a
    seed of (prompt index, target), so its schedules do not depend on the order the episodes run in (a
    resumed run, Ray actors)."""

    def __init__(self, methods: list, env, free_env, threshold_map=None):
        self.specs = dict(methods)
        self.env, self.free_env, self.threshold_map = env, free_env, threshold_map
        self.loaded = {name: load_method(name, spec, env, free_env, threshold_map) for name, spec in methods}

    def __getitem__(self, name: str):
        return self.loaded[name]

    def values(self):
        return self.loaded.values()

    def for_episode(self, name: str, target: float, index: int):
        """(policy, env) for the episode of prompt `index` at `target`."""
        if not schedulers.is_seeded(schedulers.parse_method(name, self.specs[name])["name"]):
            return self.loaded[name]
        seed = int(np.random.SeedSequence([index, round(1000 * target)]).generate_state(1)[0])
        return load_method(name, self.specs[name], self.env, self.free_env, self.threshold_map, seed=seed)


def run_episode(env, policy, options):
    """-> (final info, seconds in the policy's per-step calls, seconds in its per-episode setup)."""
    trajectory = rollout(env, policy, options)
    return trajectory.info, trajectory.policy_seconds, trajectory.setup_seconds


def scheduler_step_cost(policy, env, prompt: str, seed: int, repeats: int = 1) -> float:
    """Seconds per step of a policy inside a real episode (K = 0): learned schedulers cost ~1 ms per step
    on a CPU, a few % of a MorcaTiny step, so the speedup -> K map must count it. Timed in the loop (a
    repeated call runs with warmer caches), after a warm-up episode (the first call of a d3rlpy model is
    slow); the fastest of `repeats` timed episodes, as latencies are: one episode's reading of a ~15 us
    step varies by ~2 us, enough to move a prompt's K by one at equal measured speedup."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"timing repeats={repeats!r} must be an integer >= 1 (checked before the warm-up episode)")
    options = {"prompt": prompt, "seed": seed, "budget": 0}
    run_episode(env, policy, options)
    return fastest(lambda: run_episode(env, policy, options)[1], repeats) / env.unwrapped.num_steps


def timed_episode(env, policy, options, repeats: int):
    """-> (info of the first run, latency, policy seconds, setup seconds): the episode is run `repeats`
    times and its latency (env latency + the policy's per-step time) is the fastest run's; quality
    metrics come from the first run (the same schedule for deterministic policies, the same K for all)."""
    runs = [run_episode(env, policy, options) for _ in range(repeats)]
    (info, policy_time, setup_time), best = runs[0], min(r[0]["latency_s"] + r[1] for r in runs)
    return info, best, policy_time, setup_time


def evaluate_episode(name: str, policy, method_env, target: float, index: int, pair: tuple, *, requested: float,
                     stock_s: float, scheduler_cost_s: float, k_cost_s: float, timing_repeats: int,
                     budget: int | None = None) -> dict:
    """Run one method's episode for (target, prompt `index`) and return its row of `episodes.jsonl`. With
    `budget`, the episode runs at that K instead of the target's (a matched episode, `name` its label), timed
    once: it is compared in PSNR only."""
    prompt, seed = pair
    options = ({"budget": budget} if budget is not None
               else {"speedup": requested, "scheduler_cost_s": k_cost_s})
    timing_repeats = 1 if budget is not None else timing_repeats
    info, latency, policy_time, setup_time = timed_episode(method_env, policy, {"prompt": prompt, "seed": seed,
                                                                               **options}, timing_repeats)
    row = {"method": name, "target": target, "prompt_index": index, "prompt": prompt, "seed": seed,
           "num_reuse": info["num_reuse"], "psnr": min(info["psnr"], 100.0), "ssim": info["ssim"],
           "latency_s": latency, "policy_s": policy_time, "setup_s": setup_time,
           "stock_latency_s": stock_s, "scheduler_cost_s": scheduler_cost_s,
           "speedup": stock_s / latency, "timing_repeats": timing_repeats,
           "requested_speedup": requested, "schedule": info["schedule"]}
    if "lpips" in info:
        row["lpips"] = info["lpips"]
    return row


def work_entry(entry) -> tuple:
    """An evaluation work item's entry as (label, method name, K or None, stock seconds or None): a method's name
    (its episode at the item's target, timed next to a stock run), or a matched episode's
    (label, method name, K, stock seconds of the episode it is matched to) (`comparison.pending_matched`)."""
    return (entry, entry, None, None) if isinstance(entry, str) else tuple(entry)


class GroupEvaluator:
    """One Ray actor's evaluation: its own envs and methods; per item (target, prompt index, entries) it times one
    stock generation (unless every entry is a matched episode, which brings its own) and runs the entries'
    episodes (`work_entry`; open loop), returning the rows.

    `cost` / `k_cost` (seconds per step per method) are measured once by the driver, so every actor
    converts targets to K alike; `calibration` / `threshold_map`, when given, replace the installed ones.
    """

    def __init__(self, env_id: str, suite, env_kwargs: dict, methods: list, pairs: list, cost: dict, k_cost: dict,
                 timing_repeats: int, calibration=None, threshold_map=None):
        self.env, free_env = make_envs(env_id, suite, env_kwargs)
        if calibration is not None:
            self.env.unwrapped.calibration = free_env.unwrapped.calibration = calibration
        self.methods = Methods(methods, self.env, free_env, threshold_map)
        self.pairs, self.cost, self.k_cost, self.timing_repeats = pairs, cost, k_cost, timing_repeats

    def __call__(self, item) -> list[dict]:
        """`item`: (target, prompt index, entries), each entry as `work_entry` reads it."""
        target, index, entries = item
        prompt, seed = self.pairs[index]
        entries = [work_entry(entry) for entry in entries]
        stock_s = (fastest(lambda: stock_seconds(self.env.unwrapped, prompt, seed), self.timing_repeats)
                   if any(entry[3] is None for entry in entries) else None)
        rows = []
        for label, name, budget, given_stock_s in entries:
            rows.append(evaluate_episode(label, *self.methods.for_episode(name, target, index), target, index,
                                         self.pairs[index], requested=target,
                                         stock_s=given_stock_s if given_stock_s is not None else stock_s,
                                         scheduler_cost_s=self.cost[name], k_cost_s=self.k_cost[name],
                                         timing_repeats=self.timing_repeats, budget=budget))
        return rows
