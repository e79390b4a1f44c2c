"""Does step error predict terminal error? (paper Table 1), on a MORCA Minari dataset.

    python research/ablation_tiny/analyze_terminal_error.py --dataset morca/tiny/random-v0

Per episode, the target is the terminal PSNR. Two ridge-regression predictors
are fitted on 80% of the episodes and scored (R^2, MAE) on the held-out 20%
(`--split prompt`: 80% of the prompts, so no held-out prompt was seen in fitting;
datasets whose episodes share prompts, e.g. the anchored ones in groups of 4,
need it, or the latent features can recognise a prompt instead of predicting):
  * step error only: SeaCache's filtered step distance d_t at every reuse step
    (a length-N vector, zero where the step recomputes) and K;
  * step error + latent features: the same plus, per step, the channel means of
    phi(x_t) (P3 pool, temporal mean and variance pools).
Ridge is written out in numpy (closed form, penalty picked by 5-fold CV on the
training split); scikit-learn is not a dependency.
"""

from __future__ import annotations

import argparse
import sys

import minari
import numpy as np

from morca_env.observation import Scalar


PREDICTORS = ("step error only", "step error + latent features")


def episode_features(ep, channels: int):
    obs = ep.observations
    actions = np.asarray(ep.actions)
    n = len(actions)
    d = obs["scalars"][:n, Scalar.d_t] * actions
    step = np.concatenate([d, [actions.sum() / n]])
    pooled = obs["pooled"][:n, :channels].astype(np.float32).mean(axis=(2, 3, 4))
    temporal = obs["temporal"][:n].astype(np.float32)
    mean = temporal[:, :channels].mean(axis=(2, 3))
    var = temporal[:, 3 * channels:4 * channels].mean(axis=(2, 3))
    latent = np.concatenate([pooled, mean, var], axis=1).reshape(-1)
    return step, np.concatenate([step, latent]), float(ep.rewards[-1])


def ridge_fit(x, y, alpha):
    mu, sd = x.mean(0), x.std(0) + 1e-8
    z = (x - mu) / sd
    w = np.linalg.solve(z.T @ z + alpha * np.eye(z.shape[1]), z.T @ (y - y.mean()))
    return lambda q: ((q - mu) / sd) @ w + y.mean()


def fit_cv(x, y, rng):
    alphas = [1e-2, 1e-1, 1, 10, 100, 1000]
    folds = np.array_split(rng.permutation(len(y)), 5)
    def cv_error(alpha):
        errs = []
        for k in range(5):
            val = folds[k]
            tr = np.concatenate([folds[j] for j in range(5) if j != k])
            errs.append(np.mean((ridge_fit(x[tr], y[tr], alpha)(x[val]) - y[val]) ** 2))
        return np.mean(errs)
    best = min(alphas, key=cv_error)
    return ridge_fit(x, y, best), best


def split(dataset, count: int, by: str, rng) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) episode indices: 80 / 20 of the episodes, or of the prompts (each with all its episodes)."""
    if by == "episode":
        order = rng.permutation(count)
        return order[:int(0.8 * count)], order[int(0.8 * count):]
    prompts = [m["options"]["prompt"] for m in dataset.storage.get_episode_metadata(range(count))]
    unique = sorted(set(prompts))
    held = set(rng.permutation(unique)[int(0.8 * len(unique)):])
    test = np.array([i for i, p in enumerate(prompts) if p in held])
    return np.array([i for i, p in enumerate(prompts) if p not in held]), test


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="morca/tiny/random-v0")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=1, help="random splits (seeds --seed, --seed + 1, ...)")
    p.add_argument("--split", choices=("episode", "prompt"), default="episode",
                   help="hold out 20%% of the episodes, or of the prompts (with all their episodes)")
    args = p.parse_args(argv)
    dataset = minari.load_dataset(args.dataset)
    channels = dataset.observation_space["pooled"].shape[0] // 3
    rows = [episode_features(ep, channels) for ep in dataset.iterate_episodes()]
    step = np.stack([r[0] for r in rows])
    full = np.stack([r[1] for r in rows])
    y = np.array([r[2] for r in rows])
    print(f"{args.dataset}: {len(y)} episodes, terminal PSNR {y.mean():.2f} ± {y.std():.2f} dB; held out: 20% of "
          f"the {args.split}s, {args.repeats} split(s) from seed {args.seed}\n")
    scores = {name: [] for name in PREDICTORS}
    for repeat in range(args.repeats):
        rng = np.random.default_rng(args.seed + repeat)
        train, test = split(dataset, len(y), args.split, rng)
        for name, x in zip(PREDICTORS, (step, full)):
            model, _ = fit_cv(x[train], y[train], rng)
            pred = model(x[test])
            r2 = 1 - np.sum((pred - y[test]) ** 2) / np.sum((y[test] - y[test].mean()) ** 2)
            scores[name].append((r2, np.mean(np.abs(pred - y[test]))))
    print("| features | R^2 | MAE (dB) |\n|---|---|---|")
    for name, rows in scores.items():
        r2, mae = np.array(rows).T
        print(f"| {name} | {r2.mean():.3f} ± {r2.std():.3f} | {mae.mean():.3f} ± {mae.std():.3f} |")
    gain = np.array([a[0] - b[0] for a, b in zip(scores[PREDICTORS[1]], scores[PREDICTORS[0]])])
    print(f"\nlatent features add {gain.mean():+.3f} ± {gain.std():.3f} R^2 (mean ± std over the splits; "
          f"higher on {int((gain > 0).sum())} of {len(gain)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
