"""The evaluation's tables: per (target, method) means of `episodes.jsonl`, paired differences against the
baselines, the same-K and equal-speedup comparisons (`comparison`), as `table.md` and `table.csv`."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from .comparison import equal_speedup_table, matched_label, paired_difference, same_k_table


def summarise(rows, targets, methods):
    table = []
    for target in targets:
        for name, _ in methods:
            sel = [r for r in rows if r["method"] == name and r["target"] == target]
            if not sel:
                continue
            entry = {"target": target, "method": name, "episodes": len(sel),
                     "latency_s": float(np.mean([r["latency_s"] for r in sel])),
                     "stock_latency_s": float(np.mean([r["stock_latency_s"] for r in sel])),
                     # ratio of mean latencies, as the latency column (the mean of per-episode
                     # ratios is biased upwards by timing noise, Jensen)
                     "speedup": float(np.mean([r["stock_latency_s"] for r in sel])
                                      / np.mean([r["latency_s"] for r in sel])),
                     "K": float(np.mean([r["num_reuse"] for r in sel])),
                     "psnr": float(np.mean([r["psnr"] for r in sel])), "psnr_std": float(np.std([r["psnr"] for r in sel])),
                     "ssim": float(np.mean([r["ssim"] for r in sel]))}
            if all("lpips" in r for r in sel):
                entry["lpips"] = float(np.mean([r["lpips"] for r in sel]))
            table.append(entry)
    return table


def write_tables(out: Path, table, rows, methods, targets, reference_latency,
                 baselines=("seacache-exact", "seacache-global", "best-fixed"), own_k=(), matched=()):
    """table.md / table.csv. `own_k`: the methods that spend their own K, `matched`: the baselines replayed at
    their K (paired lines at the same K); the methods are also compared at equal measured speedup."""
    # each row's speedup is its own stock timings over its own latencies (timed side by side, so a
    # machine's load cancels); the stock column shows them, the reference row is their overall mean
    lines = ["| target | method | K | latency (s) | stock (s) | speedup | PSNR (dB) | SSIM | LPIPS |",
             "|---|---|---|---|---|---|---|---|---|",
             f"| - | no cache (reference) | 0 | {reference_latency:.3f} | {reference_latency:.3f} | 1.00x | - | - | - |"]
    for e in table:
        lpips = f"{e['lpips']:.4f}" if "lpips" in e else "n/a"
        lines.append(f"| {e['target']:.1f}x | {e['method']} | {e['K']:.1f} | {e['latency_s']:.3f} | "
                     f"{e['stock_latency_s']:.3f} | {e['speedup']:.2f}x | "
                     f"{e['psnr']:.2f} ± {e['psnr_std']:.2f} | {e['ssim']:.4f} | {lpips} |")
    notes = []
    names = [m for m, _ in methods]
    for baseline in [b for b in baselines if b in names]:
        for method in [m for m in names if m != baseline]:  # every method against each baseline asked for
            for target in targets:
                d = paired_difference(rows, method, baseline, target)
                if d:
                    notes.append(f"- {method} - {baseline} at {target:.1f}x: {d[0]:+.2f} dB "
                                 f"(std over prompts {d[1]:.2f}, 95% CI ±{d[2]:.2f}, n={d[3]})")
    for method in [m for m in names if m in own_k]:  # a rule on its own K against each baseline at that K
        for baseline in matched:
            for target in targets:
                d = paired_difference(rows, method, matched_label(baseline, method), target)
                if d:
                    notes.append(f"- {method} - {baseline} at {method}'s own K (mean {mean_k(rows, method, target):.1f})"
                                 f" at {target:.1f}x: {d[0]:+.2f} dB (std over prompts {d[1]:.2f}, 95% CI ±{d[2]:.2f}, "
                                 f"n={d[3]})")
    for learned in [m for m in names if m.startswith("morca")]:
        errs = [abs(e["speedup"] - e["target"]) for e in table if e["method"] == learned]
        if errs:
            notes.append(f"- {learned} speedup control: mean |realised - target| = {np.mean(errs):.3f}")
    text = "\n".join(lines) + ("\n\n" + "\n".join(notes) if notes else "") + "\n"
    reference = next((b for b in baselines if b in names and b not in own_k), None)
    if reference is not None and len(names) > 1:
        text += (f"\nAt the same K (mean K / PSNR / difference to {reference}, 95% CI; a method on its own K is "
                 f"compared with {reference} replayed at that K):\n\n"
                 + "\n".join(same_k_table(rows, names, reference, targets, own_k)) + "\n")
    if reference is not None and len(table) > 1:
        text += (f"\nAt equal measured speedup (each method's PSNR interpolated per prompt along its own measured "
                 f"speedup curve; within 0.1x beyond its ends, the end point's; difference to {reference}, 95% CI):\n\n"
                 + "\n".join(equal_speedup_table(rows, names, reference, targets)) + "\n")
    (out / "table.md").write_text(text)
    with open(out / "table.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["target", "method", "episodes", "K", "latency_s", "stock_latency_s",
                                               "speedup", "psnr", "psnr_std", "ssim", "lpips"])
        writer.writeheader()
        for e in table:
            writer.writerow(e)
    return text


def mean_k(rows, method, target) -> float:
    return float(np.mean([r["num_reuse"] for r in rows if r["method"] == method and r["target"] == target]))
