"""Is the per-run best schedule a smooth function of the run's noise? (what a selector could ever learn)

    python research/headroom/headroom_sensitivity.py --library runs/selector/selector.json --runs 40 --workers 2 \
        --out runs/sensitivity

A selector that reads the run (`research/headroom/selector_library.py`) can only pick well if runs that look alike want the same
schedule. This measures it directly: each label run of a `research/headroom/headroom_selector.py` result is replayed with
its initial noise nudged, x_T' = (x_T + eps z) / sqrt(1 + eps^2) (z a fixed independent draw), the reference
and every library member regenerated, and the members' gains over member 0 compared with the unperturbed run's.
Reported per eps: the correlation of the gains, and the gain of playing on the nudged run the member that was best
on the original one (an oracle that knows a run eps away). If that gain falls to zero at small eps, the per-run
optimum is chaotic in the noise and no causal feature can predict it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

from morca_env.cli import experiment_parser, positive_int, show_library_messages
from morca_env.utils.io import atomic_write_text
from morca_env.utils.threads import configure_threads

def nudged_psnrs(env, job) -> tuple[int, float, list[float]]:
    """PSNR of each member on (prompt, seed) with the noise nudged by eps, against that run's own reference."""
    from morca_env.diffusion.metrics import to_uint8, video_metrics

    index, prompt, seed, eps, members = job
    env = env.unwrapped  # one env per worker process (`morca_env.parallel.workers`)
    den = env.side_run()
    try:
        noise = den.start(prompt=prompt, seed=seed).clone()
        z = torch.randn(noise.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=noise.dtype)
        latents = (noise + eps * z) / float(np.sqrt(1 + eps ** 2))
        reference = to_uint8(den.generate(None, prompt=prompt, seed=seed, latents=latents))
        psnrs = []
        for schedule in members:
            video = to_uint8(den.generate(schedule, prompt=prompt, seed=seed, latents=latents))
            psnrs.append(env.terminal_reward(float(video_metrics(video, reference, None)["psnr"])))
    finally:
        den.close()
    return index, eps, psnrs


def plot(path: Path, grid: dict, best_on_base: np.ndarray, budget: int) -> None:
    """Oracle and carried-over choice (mean, 95% CI) against the nudge, on a log axis past the reference run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    eps = [e for e in grid if e > 0]
    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    for label, value in (("oracle choice on the nudged run", lambda g: g.max(axis=1) - g[:, 0]),
                         ("the reference run's best member, played on the nudged run",
                          lambda g: g[np.arange(len(g)), best_on_base] - g[:, 0])):
        means = [value(grid[e]).mean() for e in eps]
        errors = [1.96 * value(grid[e]).std(ddof=1) / np.sqrt(len(grid[e])) for e in eps]
        ax.errorbar(eps, means, yerr=errors, marker="o", capsize=3, label=label)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("nudge eps of the initial noise (new seed: no gain)")
    ax.set_ylabel("gain over the best fixed schedule (dB)")
    ax.set_title(f"is the per-run best schedule smooth in the noise? (K {budget})", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(argv=None) -> int:
    show_library_messages()
    p = experiment_parser(__doc__)
    p.add_argument("--library", type=Path, required=True, help="selector.json of research/headroom/headroom_selector.py")
    p.add_argument("--members", type=positive_int, default=5, help="first library members compared")
    p.add_argument("--runs", type=positive_int, default=40, help="first label runs replayed")
    p.add_argument("--eps", type=float, nargs="+", default=[0.0, 0.02, 0.1, 0.3])
    args = p.parse_args(argv)
    if any(e < 0 for e in args.eps):
        p.error(f"--eps {args.eps}: every eps must be >= 0")
    args.threads = configure_threads(args.threads, workers=args.workers)
    data = json.loads(args.library.read_text())
    members = [data["library"][m] for m in data["members"][:args.members]]
    pairs = data["label"]["pairs"][:args.runs]
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "psnr.jsonl"
    done = {}
    if log.exists():
        for line in log.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            done[row["run"], row["eps"]] = row["psnr"]
    jobs = [(b, prompt, int(seed), float(eps), members) for b, (prompt, seed) in enumerate(pairs)
            for eps in args.eps if (b, float(eps)) not in done]
    from tqdm import tqdm

    from morca_env.parallel.workers import map_on_envs

    kwargs = {"lpips": False, "latent_features": False, **args.env_kwargs}
    with open(log, "a") as f:
        results = map_on_envs(nudged_psnrs, jobs, args.env, kwargs, args.workers, args.threads)
        for b, eps, psnrs in tqdm(results, total=len(jobs), desc="nudged runs"):
            done[b, eps] = psnrs
            f.write(json.dumps({"run": b, "eps": eps, "psnr": psnrs}) + "\n")
            f.flush()
    grid = {eps: np.array([done[b, float(eps)] for b in range(len(pairs))]) for eps in args.eps}
    base = grid[args.eps[0]]
    base_gain = base[:, 1:] - base[:, :1]
    best_on_base = base.argmax(axis=1)
    lines = [f"{len(pairs)} runs, members {data['members'][:args.members]} (K {data['budget']}); gains over member 0 "
             f"in dB; the first eps ({args.eps[0]}) is the reference run", "",
             "| eps | correlation of gains with the reference run's | oracle on this run | member best on the "
             "reference run, played here |", "|---|---|---|---|"]
    for eps, psnr in grid.items():
        gain = psnr[:, 1:] - psnr[:, :1]
        corr = float(np.corrcoef(gain.ravel(), base_gain.ravel())[0, 1])
        oracle = psnr.max(axis=1) - psnr[:, 0]
        carried = psnr[np.arange(len(psnr)), best_on_base] - psnr[:, 0]
        ci = lambda v: f"{v.mean():+.2f} ± {1.96 * v.std(ddof=1) / np.sqrt(len(v)):.2f}"
        lines.append(f"| {eps} | {corr:.2f} | {ci(oracle)} | {ci(carried)} |")
    text = "\n".join(lines) + "\n"
    atomic_write_text(args.out / "sensitivity.md", text)
    plot(args.out / "sensitivity.png", grid, best_on_base, data["budget"])
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
