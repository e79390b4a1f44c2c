"""The scoring protocol: one evaluation suite per env, scored at the same K, normalized against shipped references.

    from morca_env.evaluation import benchmark
    result = benchmark.evaluate(my_policy, "MorcaTiny-v0")   # any obs -> action callable, sb3 model, d3rlpy algo, ...
    print(result.table())                                    # per target: PSNR, SSIM, vs best fixed, normalized score

Every method plays the same episodes: the suite's held-out (prompt, seed) pairs at each
target speedup, in the budget-enforcing env, where a target becomes the same K for every
method (the env's calibration and per-seed rounding; nothing timed). The normalized score
is 100 x (PSNR - random feasible) / (best fixed - random feasible), both references
measured on the same episodes: 0 is a random schedule with K reuses, 100 the best fixed
schedule, the bar a learned scheduler must clear. The references ship as package data
(`benchmark_references.json`); `morca benchmark-references MorcaTiny-v0` remakes them.

Two observation tracks are scored apart (`observation=`): "full", the paper's state with latent features, and
"scalars", its seven scalars and the mask. A policy whose library records its input (an sb3 model's observation
space, a d3rlpy algorithm's observation shape) is scored on its own track; any other plays "full" unless told.
The episodes, K and references are the same on both tracks: only what the policy sees differs.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable

import gymnasium as gym
import numpy as np
from scipy import stats

from .. import schedulers
from ..utils.io import atomic_write_text
from ..observation import (FLAT_MASK, TRACK_KEYS, as_flat, as_tuple, check_observation, is_flat_shape, parse_action,
                           track_of_flat_size)
from ..prompts import get_suite

REFERENCES_FILE = "benchmark_references.json"
REFERENCE_METHODS = ("random", "best-fixed")
PSNR_CAP = 100.0  # a schedule without reuse matches its reference exactly (infinite PSNR): capped as in evaluation


@dataclass(frozen=True)
class Suite:
    """What one env is scored on: held-out prompts (each with its fixed seed), the targets and the env's settings."""

    env_id: str
    prompts: str  # a prompt suite spec (`morca_env.prompts.get_suite`), disjoint from every training prompt
    targets: tuple[float, ...]
    env_kwargs: tuple[tuple[str, Any], ...] = ()
    note: str = ""
    train_prompts: str = "tiny-train"  # where an agent may train and tune (disjoint from `prompts`)
    # the training env's episodes: a fixed pool of (prompt, seed) pairs from `train_prompts`, spread over its
    # grammar, so each pair's no-cache reference is rendered once and read from the cache after (a fresh seed per
    # episode would render one every episode: 2.85 s against 1.19 s an episode on MorcaTiny)
    train_pool: str = "tiny-train[::22]"

    @property
    def kwargs(self) -> dict:
        return dict(self.env_kwargs)

    def pairs(self) -> list[tuple[str, int]]:
        return get_suite(self.prompts).pairs()


SUITES = {
    # 40 of the 200 held-out tiny-eval prompts (tiny-train fits every rule, schedule and agent), 3 targets
    "MorcaTiny-v0": Suite("MorcaTiny-v0", "tiny-eval[::5]", (2.0, 2.5, 3.0), (("lpips", False),),
                          "MorcaTiny (CPU): 40 held-out prompts x their fixed seeds"),
    # 40 of the 240 held-out scenes-eval pairs, 5 of each content class (motion x simple/complex)
    "MorcaScenes-v0": Suite("MorcaScenes-v0", "scenes-eval[::6]", (2.0, 2.5, 3.0), (("lpips", False),),
                            "MorcaScenes (CPU): 40 held-out prompts, 5 per content class, x their fixed seeds",
                            "scenes-train", "scenes-train:256"),
    # the random-weights tiny model of the tests: a protocol check in seconds, not a benchmark
    "MorcaTinyRandom-v0": Suite("MorcaTinyRandom-v0", "tiny-eval[:4]", (2.0, 3.0),
                                (("lpips", False), ("num_inference_steps", 10)), "tests only: random weights"),
    # the paper's 200 VBench evaluation prompts and targets (Table 2)
    "MorcaWan21-v0": Suite("MorcaWan21-v0", "vbench-eval", (2.4, 3.0, 4.0), (),
                           "Wan2.1 (GPU): the paper's 200 VBench prompts, targets 2.4x / 3.0x / 4.0x", "vbench-train",
                           "vbench-train[::1]"),
    "MorcaWan22-v0": Suite("MorcaWan22-v0", "vbench-eval", (1.8, 2.4, 3.0), (),
                           "Wan2.2 (GPU): the paper's 200 VBench prompts, targets 1.8x / 2.4x / 3.0x", "vbench-train",
                           "vbench-train[::1]"),
}


def suite_of(env_id: str) -> Suite:
    if env_id not in SUITES:
        raise ValueError(f"no benchmark suite for env_id={env_id!r}; suites: {', '.join(SUITES)}")
    return SUITES[env_id]


# ---- policies: anything that maps an observation to an action -------------------------------------------------

class CallablePolicy:
    """The scheduler protocol (`reset(obs, info)`, `policy(obs) -> action`) around `fn(obs) -> action`."""

    def __init__(self, fn: Callable, name: str = "callable"):
        self.fn, self.name = fn, name

    def reset(self, obs, info) -> None:
        pass

    def __call__(self, obs) -> int:
        action = self.fn(obs)
        try:
            return parse_action(action)  # strict: 0.9 or "1" is the policy's bug, never a silent recompute
        except ValueError as error:
            raise ValueError(f"policy {self.name!r} returned {action!r} ({type(action).__name__}): {error}") from None


def _sb3(model) -> CallablePolicy:
    """A stable-baselines3 model on the Dict observation, or on gymnasium's `FlattenObservation` of it (the env's
    Dict is flattened in the same order, `morca_env.observation.FLAT_KEYS`); MaskablePPO is given the mask."""
    masked = "action_masks" in inspect.signature(model.predict).parameters
    space = model.observation_space
    flat = isinstance(space, gym.spaces.Box) and len(space.shape) == 1

    def act(obs):
        kwargs = {"action_masks": np.asarray(obs["action_mask"], dtype=bool)} if masked else {}
        x = as_flat({k: np.asarray(v)[None] for k, v in obs.items()})[0] if flat else obs
        if flat and x.shape != space.shape:
            raise ValueError(f"{type(model).__name__} was trained on flat observations of shape {space.shape} and "
                             f"this env's flattened observation has {x.shape}: score it on the track it was trained "
                             f"on (observation={track_of_flat_size(space.shape[0])!r}) and the same model")
        action, _ = model.predict(x, deterministic=True, **kwargs)
        return action
    return CallablePolicy(act, type(model).__name__)


def _tensordict_module(module) -> CallablePolicy:
    """A torchrl / tensordict actor (a `TensorDictModuleBase`: reads the observation's keys, writes "action"), as
    torchrl's own DQN and PPO recipes build them. The mask reaches it as bool, torchrl's mask dtype, whatever the
    scoring env's `mask_dtype` (an actor trained with `mask_dtype="bool"` is scored on the default env)."""
    import torch
    from tensordict import TensorDict

    def act(obs):
        td = TensorDict({k: torch.as_tensor(np.asarray(v, dtype=bool) if k == "action_mask" else np.asarray(v))
                         for k, v in obs.items()}, batch_size=[])
        with torch.no_grad():
            action = module(td).get("action")
        action = action.reshape(-1)
        if action.numel() == 2:  # one-hot action encoding (torchrl's default for a Discrete space)
            action = action.argmax()
        return action.item()
    return CallablePolicy(act, type(module).__name__)


def _d3rlpy(algo) -> CallablePolicy:
    """A d3rlpy algorithm: the flat layout (`morca_env.observation.FLAT_KEYS`, `to_replay_buffer`'s default) or
    the tuple layout (`observation="tuple"`), read from the algorithm's own observation shape."""
    shape = algo.impl.observation_shape
    flat = is_flat_shape(shape)

    def act(obs):
        batch = {k: np.asarray(v)[None] for k, v in obs.items()}
        x = as_flat(batch) if flat else [a.astype(np.float32) for a in as_tuple(batch)]
        return algo.predict(x)
    return CallablePolicy(act, type(algo).__name__)


def _torch_module(module) -> CallablePolicy:
    """A torch module from the flat observation (1, D) to two action logits or values; infeasible ones masked."""
    import torch

    def act(obs):
        x = torch.as_tensor(as_flat({k: np.asarray(v)[None] for k, v in obs.items()}))
        with torch.no_grad():
            scores = module(x).reshape(-1).float().numpy()
        mask = x[0, FLAT_MASK].numpy() > 0
        return int(np.argmax(np.where(mask, scores, -np.inf)))
    return CallablePolicy(act, type(module).__name__)


def _tianshou(policy) -> CallablePolicy:
    """A tianshou 2.x policy (or the algorithm holding it) trained through `morca_env.wrappers.FlatWithMask`: it
    reads `obs.obs` (the flat observation) and masks its action values with `obs.mask`."""
    import torch
    from tianshou.data import Batch

    policy = getattr(policy, "policy", policy)  # an Algorithm acts through its policy

    def act(obs):
        flat = as_flat({k: np.asarray(v)[None] for k, v in obs.items()})
        with torch.no_grad():
            out = policy(Batch(obs=Batch(obs=flat, mask=flat[:, FLAT_MASK] > 0), info=Batch()))
        return np.asarray(out.act).reshape(-1)[0].item()
    return CallablePolicy(act, type(policy).__name__)


def policy_track(agent) -> str | None:
    """The observation track `agent` was trained on, where its library records its input: an sb3 model's
    observation space (a Dict's keys, or a flat Box's length), a d3rlpy algorithm's observation shape; else None."""
    if hasattr(agent, "predict") and hasattr(agent, "policy") and hasattr(agent, "observation_space"):
        space = agent.observation_space
        if isinstance(space, gym.spaces.Dict):
            return next((t for t, keys in TRACK_KEYS.items() if set(keys) == set(space.spaces)), None)
        if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
            return track_of_flat_size(space.shape[0])
    if hasattr(agent, "predict") and getattr(agent, "impl", None) is not None:
        shape = agent.impl.observation_shape
        return track_of_flat_size(shape[0]) if is_flat_shape(shape) else "full"
    return None


def _from_library(agent, package: str) -> bool:
    return any(c.__module__.split(".")[0] == package for c in type(agent).__mro__)


def as_policy(agent) -> Any:
    """A scheduler for `agent`: a scheduler already (it has `reset`), a stable-baselines3 model (on the Dict
    observation or its `FlattenObservation`), a torchrl / tensordict actor, a tianshou policy or algorithm
    (trained through `FlatWithMask`), a d3rlpy algorithm, a torch module (flat observation -> 2 scores) or any
    callable obs -> action."""
    if hasattr(agent, "reset") and callable(agent):
        return agent
    if hasattr(agent, "predict") and hasattr(agent, "policy") and hasattr(agent, "observation_space"):
        return _sb3(agent)
    if any(c.__name__ == "TensorDictModuleBase" and c.__module__.startswith("tensordict") for c in type(agent).__mro__):
        return _tensordict_module(agent)
    if _from_library(agent, "tianshou"):
        return _tianshou(agent)
    if hasattr(agent, "predict") and hasattr(agent, "impl"):
        if agent.impl is None:
            raise ValueError("the d3rlpy algorithm is not built yet: fit it (or build_with_env / build_with_dataset) first")
        return _d3rlpy(agent)
    import torch

    if isinstance(agent, torch.nn.Module):
        return _torch_module(agent)
    if callable(agent):
        return CallablePolicy(agent, getattr(agent, "__name__", type(agent).__name__))
    raise TypeError(f"cannot score {type(agent).__name__}: pass a callable obs -> action, a scheduler, "
                    "a stable-baselines3 model, a d3rlpy algorithm or a torch module")


# ---- scores -----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TargetScore:
    target: float
    episodes: int
    mean_k: float
    psnr: float
    ssim: float
    projected_per_episode: float  # actions the env changed to keep the budget feasible
    vs_best_fixed: float | None = None  # mean paired PSNR difference (dB), same episodes
    vs_best_fixed_ci: tuple[float, float] | None = None  # its 95% t interval
    normalized: float | None = None  # 100 x (PSNR - random) / (best fixed - random)


@dataclass
class BenchmarkResult:
    env_id: str
    suite: str
    method: str
    rows: list[dict]
    scores: dict[float, TargetScore] = field(default_factory=dict)
    observation: str = "full"  # the track the policy saw

    @property
    def mean_normalized(self) -> float | None:
        values = [s.normalized for s in self.scores.values()]
        return None if any(v is None for v in values) else float(np.mean(values))

    def table(self) -> str:
        """The per-target scores as a Markdown table. "overridden" counts the actions per episode the env replaced
        to keep the budget feasible: a policy that ignores the mask is scored on the env's choices, not its own."""
        lines = [f"{self.method} on {self.env_id} ({self.suite}, {self.observation} observation track)", "",
                 "| target | K | PSNR | SSIM | vs best fixed (dB, 95% CI) | normalized | overridden / episode |",
                 "|---|---|---|---|---|---|---|"]
        for s in self.scores.values():
            diff = "-" if s.vs_best_fixed is None else (f"{s.vs_best_fixed:+.2f} [{s.vs_best_fixed_ci[0]:+.2f}, "
                                                        f"{s.vs_best_fixed_ci[1]:+.2f}]")
            norm = "-" if s.normalized is None else f"{s.normalized:.1f}"
            lines.append(f"| {s.target:g}x | {s.mean_k:.1f} | {s.psnr:.2f} | {s.ssim:.4f} | {diff} | {norm} | "
                         f"{s.projected_per_episode:.1f} |")
        return "\n".join(lines)


def normalized_score(psnr: float, random_psnr: float, best_fixed_psnr: float) -> float:
    """100 x (psnr - random) / (best fixed - random): 0 = a random feasible schedule, 100 = the best fixed one."""
    gap = best_fixed_psnr - random_psnr
    if not gap > 0:
        raise ValueError(f"best fixed ({best_fixed_psnr:.3f} dB) must beat random ({random_psnr:.3f} dB) to normalize")
    return 100.0 * (psnr - random_psnr) / gap


def _paired_interval(diffs: np.ndarray) -> tuple[float, float]:
    if len(diffs) < 2 or np.all(diffs == diffs[0]):
        return float(diffs.mean()), float(diffs.mean())
    low, high = stats.t.interval(0.95, len(diffs) - 1, loc=diffs.mean(), scale=stats.sem(diffs))
    return float(low), float(high)


def score(rows: list[dict], references: dict | None) -> dict[float, TargetScore]:
    """Per-target scores of one method's episode rows; with references (the same suite), paired to them."""
    out = {}
    for target in sorted({r["target"] for r in rows}):
        sel = sorted((r for r in rows if r["target"] == target), key=lambda r: r["index"])
        psnr = np.array([r["psnr"] for r in sel])
        base = dict(target=target, episodes=len(sel), mean_k=float(np.mean([r["k"] for r in sel])),
                    psnr=float(psnr.mean()), ssim=float(np.mean([r["ssim"] for r in sel])),
                    projected_per_episode=float(np.mean([r["projected"] for r in sel])))
        ref = None if references is None else references["targets"].get(_key(target))
        if ref is not None:
            indices = [r["index"] for r in sel]
            best = np.array(ref["best-fixed"]["psnr"])[indices]
            rand = np.array(ref["random"]["psnr"])[indices]
            diffs = psnr - best
            base.update(vs_best_fixed=float(diffs.mean()), vs_best_fixed_ci=_paired_interval(diffs),
                        normalized=normalized_score(float(psnr.mean()), float(rand.mean()), float(best.mean())))
        out[target] = TargetScore(**base)
    return out


# ---- running the suite ------------------------------------------------------------------------------------------

def _key(target: float) -> str:
    return f"{float(target):g}"


def make_env(env_id: str, suite: Suite | None = None, num_envs: int = 1, **env_kwargs):
    """The budget-enforcing env the suite is played in (its prompts, its settings; `env_kwargs` add to them); a
    `MorcaVectorEnv` of `num_envs` episodes per batch when > 1 (same K, scores equal up to float32 rounding)."""
    suite = suite or suite_of(env_id)
    kwargs = dict(speedup=suite.targets[0], prompts=suite.prompts, **{**suite.kwargs, **env_kwargs})
    if num_envs == 1:
        return gym.make(env_id, **kwargs)
    return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **kwargs)


def training_kwargs(env_id: str, **env_kwargs) -> dict:
    """The env arguments to train on for `env_id`'s suite: its fixed training pool of (prompt, seed) pairs
    (`Suite.train_pool`: each reference rendered once, then cached), target speedups drawn across the suite's
    targets, the suite's settings (`env_kwargs` add to them: `prompts="tiny-train"` draws a fresh seed per episode
    instead); for `gym.make`, `make_vec`, torchrl's GymEnv."""
    suite = suite_of(env_id)
    return {"speedup": (min(suite.targets), max(suite.targets)), "prompts": suite.train_pool, **suite.kwargs,
            **env_kwargs}


def training_env(env_id: str, **env_kwargs):
    """`gym.make(env_id, **training_kwargs(env_id, **env_kwargs))`."""
    return gym.make(env_id, **training_kwargs(env_id, **env_kwargs))


def play(policy, env, suite: Suite, targets=None, progress: bool = True, references: dict | None = None,
         pair_step: int = 1) -> list[dict]:
    """One row per (target, pair) of `suite` (every `pair_step`-th pair): the episode's K, PSNR, SSIM and projected
    actions; rows keep the pair's index in the suite, so scores pair with the references episode by episode. In a
    `MorcaVectorEnv` (`make_env(..., num_envs=N)`) the episodes play N at a time, each batch slot with its own copy
    of `policy` (a scheduler keeps per-episode state)."""
    import copy

    from ..rollout import episodes_per_batch, rollout_many
    from ..vector import single_env

    if not getattr(single_env(env), "enforce_budget", True):
        raise ValueError("the benchmark scores in the budget-enforcing env (enforce_budget=True): every method "
                         "runs with exactly the target's K")
    targets = tuple(suite.targets if targets is None else targets)
    if isinstance(pair_step, bool) or not isinstance(pair_step, int) or pair_step < 1:
        raise ValueError(f"pair_step={pair_step!r} must be an integer >= 1 (1: every pair of the suite)")
    if pair_step > len(suite.pairs()):
        raise ValueError(f"pair_step={pair_step} leaves only the first of the suite's {len(suite.pairs())} pairs; "
                         f"valid: 1 to {len(suite.pairs())}")
    episodes = [(target, index, prompt, seed) for target in targets
                for index, (prompt, seed) in list(enumerate(suite.pairs()))[::pair_step]]
    if references is not None:  # a wrong calibration or step count fails here, before the suite is played
        for target, index, _, seed in episodes:
            ref = references["targets"].get(_key(target))
            k = single_env(env).budget_for_speedup(float(target), int(seed))
            if ref is not None and ref["k"][index] != k:
                raise RuntimeError(f"the references were measured at K={ref['k'][index]} for target {target:g}, "
                                   f"pair {index}; this env gives K={k} (another calibration or step count): remake "
                                   f"them with morca benchmark-references {suite.env_id}")
    slots = episodes_per_batch(env)
    members = [policy] + [copy.deepcopy(policy) for _ in range(slots - 1)]
    trajectories = rollout_many(env, [members[j % slots] for j in range(len(episodes))],
                                [{"prompt": prompt, "seed": seed, "speedup": float(target)}
                                 for target, _, prompt, seed in episodes],
                                progress=f"benchmark {suite.env_id}" if progress else None)
    rows = []
    for (target, index, prompt, seed), trajectory in zip(episodes, trajectories):
        ref = None if references is None else references["targets"].get(_key(target))
        info = trajectory.info
        row = {"target": float(target), "index": index, "prompt": prompt, "seed": int(seed),
               "k": int(info["budget"]), "psnr": float(min(info["psnr"], PSNR_CAP)),
               "ssim": float(info["ssim"]), "projected": int(info["num_projected"]),
               "schedule": [int(a) for a in info["schedule"]]}
        if ref is not None and ref["k"][index] != row["k"]:
            raise RuntimeError(f"pair {index} at target {target:g} ran K={row['k']}, planned {ref['k'][index]}")
        rows.append(row)
    return rows


def evaluate(policy, env_id: str = "MorcaTiny-v0", *, env=None, targets=None, references: dict | str | None = "packaged",
             progress: bool = True, name: str | None = None, pair_step: int = 1,
             observation: str | None = None) -> BenchmarkResult:
    """Score `policy` (anything `as_policy` takes) on `env_id`'s suite; see the module docstring.

    `env`: an already built env for the suite (`make_env(env_id)`), to share one across methods. `targets`: a
    subset of the suite's. `references`: "packaged" (the shipped ones; scores without them if this env has none),
    a dict from `measure_references`, a path to such a JSON file, or None (PSNR and SSIM only). `pair_step`: score
    on every n-th pair only (a cheaper estimate, still paired with the references; report it). `observation`: the
    track, "full" or "scalars" (default: the policy's own where its library records it, else "full"; an `env`
    given must be on it).
    """
    suite = suite_of(env_id)
    if targets is not None:
        unknown = [t for t in targets if _key(t) not in {_key(s) for s in suite.targets}]
        if unknown:
            raise ValueError(f"targets {unknown} are not in the {env_id} suite's {list(suite.targets)}")
    refs = load_references(env_id, references)
    recorded = policy_track(policy)
    track = check_observation(observation or recorded or "full")
    if recorded is not None and track != recorded:
        raise ValueError(f"observation={track!r}, but the policy was trained on the {recorded!r} track: score it there")
    scheduler = as_policy(policy)
    own_env = env is None
    if not own_env:
        from ..vector import single_env

        env_track = getattr(single_env(env), "observation", "full")
        if observation is None and recorded is None:
            track = env_track
        elif env_track != track:
            raise ValueError(f"the env given is on the {env_track!r} track and the policy is scored on {track!r}: "
                             f"make it with make_env({env_id!r}, observation={track!r})")
        if getattr(single_env(env), "flat", False):
            raise ValueError("the benchmark's env gives Dict observations (each policy adapter flattens its own); "
                             "make it with make_env(...) without flat=True")
    env = make_env(env_id, suite, observation=track) if own_env else env
    try:
        rows = play(scheduler, env, suite, targets, progress, refs, pair_step)
    finally:
        if own_env:
            env.close()
    label = name or getattr(scheduler, "name", None) or type(scheduler).__name__
    return BenchmarkResult(env_id, suite.prompts, label, rows, score(rows, refs), track)


# ---- references -------------------------------------------------------------------------------------------------

def measure_references(env_id: str = "MorcaTiny-v0", *, env=None, progress: bool = True, seed: int = 0,
                       best_fixed=None, suite: Suite | None = None) -> dict:
    """Play the random feasible policy (seeded) and the best fixed schedule (the packaged `best-fixed`, or
    `best_fixed`) on the whole suite (`suite`: another one, e.g. validation pairs of training prompts): the 0 and
    100 of the normalized score, per target and per episode."""
    suite = suite or suite_of(env_id)
    own_env = env is None
    env = make_env(env_id, suite) if own_env else env
    try:
        references = {"random": schedulers.make("random", env, seed=seed),
                      "best-fixed": best_fixed if best_fixed is not None else schedulers.make("best-fixed", env)}
        played = {m: play(references[m], env, suite, progress=progress) for m in REFERENCE_METHODS}
    finally:
        if own_env:
            env.close()
    targets = {}
    for target in suite.targets:
        by = {m: [r for r in rows if r["target"] == target] for m, rows in played.items()}
        targets[_key(target)] = {"k": [r["k"] for r in by["best-fixed"]],
                                 **{m: {"psnr": [r["psnr"] for r in by[m]], "ssim": [r["ssim"] for r in by[m]],
                                        "mean_psnr": float(np.mean([r["psnr"] for r in by[m]]))}
                                    for m in REFERENCE_METHODS}}
    return {"env_id": env_id, "suite": suite.prompts, "env_kwargs": suite.kwargs, "random_seed": seed,
            "num_pairs": len(suite.pairs()), "targets": targets,
            "command": f"morca benchmark-references {env_id}"}


def _packaged_path() -> Path:
    return Path(str(resources.files("morca_env") / "data_files" / REFERENCES_FILE))


def packaged_references() -> dict:
    """The shipped references: env id -> `measure_references`' dict."""
    path = _packaged_path()
    return json.loads(path.read_text()) if path.is_file() else {}


def load_references(env_id: str, references: dict | str | Path | None = "packaged") -> dict | None:
    if references is None:
        return None
    if isinstance(references, str) and references == "packaged":
        refs = packaged_references().get(env_id)
        if refs is None:
            return None
    elif isinstance(references, dict):
        refs = references
    else:
        refs = json.loads(Path(references).read_text())
        refs = refs.get(env_id, refs) if "targets" not in refs else refs
    suite = suite_of(env_id)
    if refs.get("env_id") != env_id or refs.get("suite") != suite.prompts or refs.get("env_kwargs", {}) != suite.kwargs:
        raise ValueError(f"these references are for {refs.get('env_id')!r} on {refs.get('suite')!r} "
                         f"({refs.get('env_kwargs')}); the {env_id} suite is {suite.prompts!r} ({suite.kwargs})")
    return refs


def reference_scores(env_id: str, target: float) -> tuple[float, float] | None:
    """(random feasible, best fixed) mean PSNR at `target` from the shipped references, or None."""
    refs = packaged_references().get(env_id)
    entry = None if refs is None else refs["targets"].get(_key(target))
    return None if entry is None else (entry["random"]["mean_psnr"], entry["best-fixed"]["mean_psnr"])


# env arguments that do not change what an episode at a target gives (the suite fixes prompts per episode)
_NEUTRAL_KWARGS = ("speedup", "prompts", "lpips", "reference_cache_dir", "pipeline", "device")


def reference_returns(env_id: str, env_kwargs: dict, r_max: float) -> tuple[float, float] | None:
    """Minari's (ref_min_score, ref_max_score) for a dataset collected with `env_kwargs`: the mean return
    (min(PSNR, r_max)) of the random feasible policy and of the best fixed schedule at its one target speedup,
    from the shipped references; None when they do not apply (a speedup range, a budget, other settings)."""
    suite = SUITES.get(env_id)
    refs = packaged_references().get(env_id)
    speedup = env_kwargs.get("speedup")
    if suite is None or refs is None or isinstance(speedup, bool) or not isinstance(speedup, (int, float)):
        return None
    own = {k: v for k, v in env_kwargs.items() if k not in _NEUTRAL_KWARGS}
    if own != {k: v for k, v in suite.kwargs.items() if k not in _NEUTRAL_KWARGS}:
        return None
    entry = refs["targets"].get(_key(speedup))
    if entry is None:
        return None
    return tuple(float(np.mean(np.minimum(entry[m]["psnr"], r_max))) for m in REFERENCE_METHODS)


def save_references(refs: dict, path: Path | None = None) -> Path:
    """Merge one env's references into the JSON file at `path` (the packaged one by default), atomically."""
    path = Path(path) if path is not None else _packaged_path()
    data = json.loads(path.read_text()) if path.is_file() else {}
    data[refs["env_id"]] = refs
    atomic_write_text(path, json.dumps(data, indent=1) + "\n")
    return path
