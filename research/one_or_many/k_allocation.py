"""K allocation: at a fixed total number of reuses over a suite, how much mean PSNR does choosing K per video gain
over the same K for every video?

Each held-out video's PSNR(K) curve is measured with the best fixed schedule at every K of a range (the shipped
`StaticSchedule`, fitted at each of them), then the total reuses N x K_target are shared out three ways:
the same K for all (the env's contract today), one K per content class (what a scheduler that knows the class
could do), and one K per video (the exact optimum: a multiple-choice knapsack solved by dynamic programming).
The last is the upper bound of a scheduler that decides how much to reuse, not only where (AdaCache-style).

    python research/one_or_many/k_allocation.py --env MorcaScenes-v0 --low 18 --high 38 --targets 27 32 36

Resumable: every episode is logged under `--out`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np

import morca_env  # noqa: F401
from morca_env.utils.io import atomic_write_text
from morca_env.schedulers.fixed import StaticSchedule
from morca_env.evaluation.search import schedule_key
from morca_env.parallel.workers import map_on_envs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from class_headroom import ENV_KWARGS, TESTBEDS, _evaluate, class_pairs, psnr_table, slug  # noqa: E402


def curves(args, split: dict, budgets: list[int]) -> dict:
    """{class: array (videos, len(budgets)) of PSNR}, played (resumably) with the best fixed schedule at each K."""
    env = gym.make(args.env, **ENV_KWARGS)
    spec = env.unwrapped.budget_spec
    fixed = StaticSchedule.packaged(TESTBEDS[args.env][0])
    schedules = {str(k): [int(a) for a in fixed.plan(spec, k)] for k in budgets}
    env.close()
    out = args.out / "k_allocation"
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(str(out / f"curves_{slug(c)}.jsonl"), g["eval"], schedules) for c, g in split.items()]
    from tqdm import tqdm

    for _ in tqdm(map_on_envs(_evaluate, jobs, args.env, ENV_KWARGS, args.workers, args.threads), total=len(jobs),
                  desc="PSNR(K) curves", unit="class"):
        pass
    result = {}
    for c, g in split.items():
        table = psnr_table(out / f"curves_{slug(c)}.jsonl")
        result[c] = np.array([[table[(p, s, schedule_key(schedules[str(k)]))] for k in budgets] for p, s in g["eval"]])
    return result


def best_allocation(psnr: np.ndarray, budgets: list[int], total: int) -> tuple[float, np.ndarray]:
    """The exact maximum of sum_i psnr[i, j_i] subject to sum_i budgets[j_i] == total (a multiple-choice knapsack,
    dynamic programming over the reuses spent so far) -> (that sum, the chosen K per row)."""
    n = psnr.shape[0]
    ks = np.asarray(budgets)
    offset = n * ks.min()
    span = total - offset  # reuses beyond the least every row must take
    if span < 0 or total > n * ks.max():
        raise ValueError(f"total {total} reuses cannot be shared among {n} videos with K in [{ks.min()}, {ks.max()}]")
    extra = ks - ks.min()
    value = np.full(span + 1, -np.inf)
    value[0] = 0.0
    choice = np.zeros((n, span + 1), dtype=np.int64)
    for i in range(n):
        new = np.full(span + 1, -np.inf)
        for j, e in enumerate(extra):
            if e > span:
                continue
            candidate = np.full(span + 1, -np.inf)
            candidate[e:] = value[:span + 1 - e] + psnr[i, j]
            better = candidate > new
            new[better] = candidate[better]
            choice[i, better] = j
        value = new
    if not np.isfinite(value[span]):
        raise ValueError(f"no choice of K in {list(ks)} for {n} videos sums to exactly {total} reuses")
    picked, left = np.zeros(n, dtype=np.int64), span
    for i in range(n - 1, -1, -1):  # walk the choices back
        picked[i] = choice[i, left]
        left -= extra[picked[i]]
    return float(value[span]), ks[picked]


def replay(psnr: np.ndarray, budgets: list[int], chosen: np.ndarray) -> float:
    index = {k: j for j, k in enumerate(budgets)}
    return float(sum(psnr[i, index[int(k)]] for i, k in enumerate(chosen)))


def report(args, split: dict, budgets: list[int], data: dict) -> dict:
    classes = list(split)
    everything = np.concatenate([data[c] for c in classes])
    sizes = [len(data[c]) for c in classes]
    n = len(everything)
    results = {"env": args.env, "budgets": budgets, "classes": classes, "targets": {}}
    for target in args.targets:
        total = n * target
        uniform = float(everything[:, budgets.index(target)].mean())
        per_video, chosen = best_allocation(everything, budgets, total)
        # per class: every video of a class gets its class's K; a knapsack over the classes' mean curves
        class_means = np.array([data[c].mean(axis=0) for c in classes])
        weights = np.array(sizes)
        # classes of equal size (the suites hold the same count per class): one row per class, total per class
        if len(set(sizes)) != 1:
            raise ValueError(f"class sizes differ ({sizes}); the class allocation assumes equal classes")
        per_class_sum, class_k = best_allocation(class_means, budgets, len(classes) * target)
        results["targets"][str(target)] = {
            "same_k_psnr": uniform,
            "per_class_psnr": per_class_sum / len(classes), "per_class_k": dict(zip(classes, map(int, class_k))),
            "per_video_psnr": per_video / n,
            "per_video_k_by_class": {c: [int(k) for k in chosen[sum(sizes[:i]):sum(sizes[:i + 1])]]
                                     for i, c in enumerate(classes)},
            "videos": int(weights.sum())}
    atomic_write_text(args.out / "k_allocation.json", json.dumps(results, indent=1) + "\n")
    plot(results, data, budgets, args.out / "k_allocation.png")
    return results


def plot(results: dict, data: dict, budgets: list[int], path: Path) -> None:
    """Left: each class's mean PSNR(K). Right: mean PSNR of each allocation per target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for c, psnr in data.items():
        left.plot(budgets, psnr.mean(axis=0), label=c, lw=1.2)
    left.set_xlabel("K (reuse steps)")
    left.set_ylabel("mean PSNR (dB)")
    left.set_title("PSNR(K) per class, best fixed schedule")
    left.legend(fontsize=6)
    targets = list(results["targets"])
    x = np.arange(len(targets))
    for i, (key, name) in enumerate((("same_k_psnr", "same K"), ("per_class_psnr", "K per class"),
                                     ("per_video_psnr", "K per video (bound)"))):
        gains = [results["targets"][t][key] - results["targets"][t]["same_k_psnr"] for t in targets]
        right.bar(x + (i - 1) * 0.27, gains, 0.27, label=name)
    right.set_xticks(x, [f"mean K = {t}" for t in targets])
    right.set_ylabel("mean PSNR gain over the same K (dB)")
    right.set_title("same total reuses, allocated three ways")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", choices=sorted(TESTBEDS), default="MorcaScenes-v0")
    p.add_argument("--low", type=int, required=True, help="the smallest K of the curves")
    p.add_argument("--high", type=int, required=True, help="the largest K of the curves")
    p.add_argument("--targets", type=int, nargs="+", required=True, help="the mean K of each allocation")
    p.add_argument("--eval-per-class", type=int, default=20)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=None, help="default runs/one_or_many/<model>")
    args = p.parse_args(argv)
    args.out = args.out or Path("runs/one_or_many") / TESTBEDS[args.env][0]
    budgets = list(range(args.low, args.high + 1))
    bad = [t for t in args.targets if t not in budgets]
    if bad:
        p.error(f"--targets {bad} outside [--low, --high] = [{args.low}, {args.high}]")
    split = class_pairs(args.env, 0, 0, args.eval_per_class)
    results = report(args, split, budgets, curves(args, split, budgets))
    for t, r in results["targets"].items():
        print(f"mean K={t}: same K {r['same_k_psnr']:.2f} dB; K per class {r['per_class_psnr'] - r['same_k_psnr']:+.3f}"
              f" dB {r['per_class_k']}; K per video {r['per_video_psnr'] - r['same_k_psnr']:+.3f} dB (the bound)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
