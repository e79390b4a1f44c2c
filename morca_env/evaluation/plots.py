"""The evaluation's figures: PSNR against measured speedup (`pareto.png`) and the methods' schedules for one
prompt (`schedules.png`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def plot_pareto(out: Path, table):
    """PSNR against measured speedup, one line per method (20 distinct colours, markers cycling, the legend beside
    the axes so a table of every baseline stays readable)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(e["method"] for e in table))
    colours = plt.get_cmap("tab20").colors
    markers = "osD^vP*Xh<>p"
    fig, ax = plt.subplots(figsize=(6.5 + (2.0 if len(methods) > 6 else 0.0), 4.2))
    for k, method in enumerate(methods):
        pts = sorted((e["speedup"], e["psnr"], e["psnr_std"]) for e in table if e["method"] == method)
        xs, ys, es = zip(*pts)
        ax.errorbar(xs, ys, yerr=np.array(es) / 2, marker=markers[k % len(markers)], capsize=2, label=method,
                    color=colours[(2 * k) % 20 if k < 10 else (2 * k + 1) % 20], elinewidth=0.8,
                    linewidth=2.5 if method.startswith("morca") else 1.2)
    ax.set_xlabel("measured speedup (x)")
    ax.set_ylabel("PSNR vs no-cache reference (dB)")
    ax.set_title("quality against speed (error bars: ±std/2 over prompts)")
    ax.grid(alpha=0.3)
    if len(methods) > 6:
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    else:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "pareto.png", dpi=130)
    plt.close(fig)


def schedule_rows(rows, target: float, prompt_index: int = 0) -> dict[str, list[int]]:
    """Every method's schedule for one prompt at one target, labelled with the K it executed
    (a learned scheduler may pay its own inference in K, and a threshold rule never holds K)."""
    return {f"{r['method']} (K={sum(r['schedule'])})": r["schedule"] for r in rows
            if r["prompt_index"] == prompt_index and r["target"] == target}


def plot_schedules(out: Path, schedules: dict[str, list[int]], title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(schedules)
    grid = np.array([schedules[n] for n in names])
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(names) + 1.2))
    ax.imshow(grid, aspect="auto", cmap="Greys", vmin=0, vmax=1.4, interpolation="nearest")
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("denoising step (dark = reuse, light = recompute)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "schedules.png", dpi=130)
    plt.close(fig)
