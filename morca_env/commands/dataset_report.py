"""Summarise a MORCA Minari dataset: size, coverage of K and speedup, PSNR, and a histogram plot.

    morca dataset-report morca/tiny/random-v0                  # prints a markdown summary
    morca dataset-report morca/tiny/random-v0 --plot k_hist.png

The numbers of the datasets' documentation come from this command.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from matplotlib.backend_bases import FigureCanvasBase  # noqa: E402

from morca_env.data import episode_options  # noqa: E402
from morca_env.data.integrity import load_dataset  # noqa: E402
from morca_env.utils.io import atomic_path  # noqa: E402


def directory_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def summarise(dataset_id: str) -> tuple[str, dict]:
    dataset = load_dataset(dataset_id)
    meta = episode_options(dataset)
    budget = np.array([m["budget"] for m in meta])
    target = np.array([m.get("target_speedup") or np.nan for m in meta], dtype=float)
    realised = np.array([m.get("speedup", np.nan) for m in meta], dtype=float)
    psnr = np.array([m.get("psnr", np.nan) for m in meta], dtype=float)
    latency = np.array([m.get("latency_s", np.nan) for m in meta], dtype=float)
    prompts = {m.get("prompt") for m in meta}
    size = directory_size(Path(dataset.storage.data_path))
    stats = {"budget": budget, "target": target, "psnr": psnr}
    lines = [
        f"`{dataset_id}`: {dataset.total_episodes} episodes, {dataset.total_steps} steps, "
        f"{len(prompts)} prompts, {size / 2**20:.1f} MiB on disk ({size / dataset.total_episodes / 2**10:.0f} KiB "
        "per episode)",
        f"- realised K: min {budget.min()}, median {np.median(budget):.0f}, max {budget.max()}",
        f"- target speedup (behaviour policy): {np.nanmin(target):.2f}x - {np.nanmax(target):.2f}x; "
        f"measured speedup 5-95% {np.nanpercentile(realised, 5):.2f}x - {np.nanpercentile(realised, 95):.2f}x",
        f"- terminal PSNR: mean {np.nanmean(psnr):.2f} dB, 5-95% {np.nanpercentile(psnr, 5):.2f} - "
        f"{np.nanpercentile(psnr, 95):.2f} dB",
        f"- episode latency: median {np.nanmedian(latency):.2f} s",
    ]
    return "\n".join(lines), stats


def plot(dataset_id: str, stats: dict, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    budget = stats["budget"]
    axes[0].hist(budget, bins=np.arange(budget.min(), budget.max() + 2) - 0.5, color="tab:blue")
    axes[0].set_xlabel("realised reuse count K")
    axes[0].set_ylabel("episodes")
    axes[1].scatter(budget, stats["psnr"], s=4, alpha=0.4, color="tab:orange")
    axes[1].set_xlabel("realised reuse count K")
    axes[1].set_ylabel("terminal PSNR (dB)")
    fig.suptitle(dataset_id, fontsize=10)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format=path.suffix.lstrip("."))
    plt.close(fig)


def plot_path(dataset_id: str, asked: Path) -> Path:
    """Where --plot writes: into a directory as `<dataset>_k.png`; a name without a suffix gets `.png` (matplotlib
    would add it anyway, and the path printed must be the one written)."""
    if asked.is_dir():
        return asked / f"{dataset_id.replace('/', '_')}_k.png"
    return asked if asked.suffix else asked.with_suffix(".png")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="morca dataset-report", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset_id")
    p.add_argument("--plot", type=Path, help="write the K histogram and K-vs-PSNR scatter here")
    args = p.parse_args(argv)
    if args.plot is not None:
        args.plot = plot_path(args.dataset_id, args.plot)
        formats = FigureCanvasBase.get_supported_filetypes()
        if args.plot.suffix.lstrip(".").lower() not in formats:
            p.error(f"--plot {args.plot}: {args.plot.suffix!r} is not an image format; valid: "
                    f"{', '.join(sorted(formats))}")
    text, stats = summarise(args.dataset_id)
    print(text)
    if args.plot is not None:
        plot(args.dataset_id, stats, args.plot)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
