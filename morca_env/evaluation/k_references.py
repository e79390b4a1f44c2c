"""References per reuse budget K: a return means little without its K, so each episode is scored against its own.

A dataset collected over a speedup range (`morca/tiny/random-v0`: 1.5x-3.5x) mixes episodes of many K, and PSNR
falls as K grows. `minari.get_normalized_score(dataset, returns)` takes one (ref_min_score, ref_max_score) per
dataset, which fits a dataset of one target only (the `random-3x` recipes carry it). Here the random feasible
policy and the best fixed schedule are played at every K of a range on the benchmark suite's held-out pairs, and
`normalized_return(env_id, k, episode_return)` is 100 x (return - random at K) / (best fixed at K - random at K):
Minari's normalized score x 100, with the references of the episode's own K.

    morca benchmark-references MorcaTiny-v0 --per-k 20 45 --pair-step 4   # remakes the shipped file
"""

from __future__ import annotations

import copy
import json
from importlib import resources
from pathlib import Path

import numpy as np

from .. import schedulers
from .benchmark import PSNR_CAP, REFERENCE_METHODS, make_env, save_references, suite_of

K_REFERENCES_FILE = "benchmark_k_references.json"


def measure_k_references(env_id: str, ks, *, env=None, pair_step: int = 4, seed: int = 0, progress: bool = True,
                         best_fixed: str = "best-fixed") -> dict:
    """Play the random feasible policy (seeded) and the best fixed schedule (`best_fixed`: another scheduler's
    name stands in for a model without one) at every K of `ks` on every `pair_step`-th pair of `env_id`'s
    benchmark suite; per K and method, each episode's PSNR (capped)."""
    from ..rollout import episodes_per_batch, rollout_many
    from ..vector import single_env

    ks = sorted({int(k) for k in ks})
    suite = suite_of(env_id)
    pairs = suite.pairs()[::pair_step]
    own_env = env is None
    env = make_env(env_id, suite, latent_features=False) if own_env else env
    try:
        top = single_env(env).budget_spec.max_budget
        bad = [k for k in ks if not 1 <= k <= top]
        if bad:
            raise ValueError(f"K {bad} cannot be played on {env_id}; valid: 1 to {top}")
        slots = episodes_per_batch(env)
        played = {}
        for method in REFERENCE_METHODS:
            policy = (schedulers.make("random", env, seed=seed) if method == "random"
                      else schedulers.make(best_fixed, env))
            members = [policy] + [copy.deepcopy(policy) for _ in range(slots - 1)]
            options = [{"prompt": p, "seed": s, "budget": k} for k in ks for p, s in pairs]
            trajectories = rollout_many(env, [members[j % slots] for j in range(len(options))], options,
                                        progress=f"K references {env_id}: {method}" if progress else None)
            psnr = [float(min(t.info["psnr"], PSNR_CAP)) for t in trajectories]
            played[method] = {k: psnr[i * len(pairs):(i + 1) * len(pairs)] for i, k in enumerate(ks)}
    finally:
        if own_env:
            env.close()
    return {"env_id": env_id, "suite": f"{suite.prompts}[::{pair_step}]", "env_kwargs": suite.kwargs,
            "random_seed": seed, "num_pairs": len(pairs),
            "ks": {str(k): {m: {"psnr": played[m][k]} for m in REFERENCE_METHODS} for k in ks},
            "command": f"morca benchmark-references {env_id} --per-k {ks[0]} {ks[-1]} --pair-step {pair_step}"}


def _packaged_path() -> Path:
    return Path(str(resources.files("morca_env") / "data_files" / K_REFERENCES_FILE))


def save_k_references(refs: dict, path: Path | None = None) -> Path:
    """Merge one env's per-K references into the JSON file at `path` (the packaged one by default), atomically."""
    return save_references(refs, _packaged_path() if path is None else path)


def load_k_references(env_id: str, references: dict | str | Path = "packaged") -> dict:
    """`env_id`'s per-K references: the shipped ones ("packaged"), a `measure_k_references` dict or a JSON file."""
    if isinstance(references, dict):
        refs = references
    else:
        path = _packaged_path() if references == "packaged" else Path(references)
        data = json.loads(path.read_text()) if path.is_file() else {}
        refs = data.get(env_id, data if data.get("env_id") == env_id else None)
    if not refs or refs.get("env_id") != env_id:
        raise ValueError(f"no per-K references for {env_id!r}: measure them with "
                         f"`morca benchmark-references {env_id} --per-k LOW HIGH`")
    return refs


def reference_returns_at(env_id: str, k: int, r_max: float, references: dict | str | Path = "packaged"
                         ) -> tuple[float, float]:
    """(random feasible, best fixed) mean return, min(PSNR, r_max), at reuse budget `k`."""
    refs = load_k_references(env_id, references)
    entry = refs["ks"].get(str(int(k)))
    if entry is None:
        measured = sorted(int(x) for x in refs["ks"])
        raise ValueError(f"K={k} has no reference on {env_id}; measured: {measured[0]} to {measured[-1]}")
    low, high = (float(np.mean(np.minimum(entry[m]["psnr"], r_max))) for m in REFERENCE_METHODS)
    if high <= low:  # beyond the K the fixed schedules were fitted at, the moved schedule can lose to random
        raise ValueError(f"K={k} on {env_id}: the best fixed schedule ({high:.2f}) does not beat a random one "
                         f"({low:.2f}) there, so the scale has no meaning; valid: K where it does")
    return low, high


def normalized_return(env_id: str, k: int, episode_return: float, r_max: float | None = None,
                      references: dict | str | Path = "packaged") -> float:
    """100 x (return - random at K) / (best fixed at K - random at K): 0 is a random feasible schedule of the
    same K, 100 the best fixed one. `r_max`: the env's reward cap (default: the model's)."""
    if r_max is None:
        from ..models.presets import preset_for_env

        r_max = preset_for_env(env_id).r_max
    low, high = reference_returns_at(env_id, k, r_max, references)
    return 100.0 * (float(episode_return) - low) / (high - low)


def normalized_returns(dataset, references: dict | str | Path = "packaged") -> np.ndarray:
    """Every episode of a MORCA Minari dataset scored against the references at its own K (its relabelled budget)."""
    spec = dataset.spec.env_spec
    env_id, r_max = spec.id, spec.kwargs.get("r_max")
    metadata = dataset.storage.get_episode_metadata(range(dataset.total_episodes))
    budgets = [int(m["options"]["budget"]) for m in metadata]
    returns = [float(np.sum(ep.rewards)) for ep in dataset.iterate_episodes()]
    return np.array([normalized_return(env_id, k, ret, r_max, references) for k, ret in zip(budgets, returns)])
