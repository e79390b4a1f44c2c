"""Paired comparisons of evaluated methods, from the rows of `episodes.jsonl`.

Three ways to line two methods up, each per prompt (the same prompt and seed on both sides):
* at the same target: both ran at one requested speedup (the same K for exact-budget methods);
* at the same K, for a method that spends its own K (a rule's native threshold or its global map): the baseline
  replayed at that episode's K (a *matched* episode, labelled `<baseline>@<method>`), so the difference is the
  schedule's, not the budget's;
* at equal measured speedup: each method's PSNR interpolated along its own (measured speedup, PSNR) curve over
  the targets, so a method that pays for a probe or a network per step is charged for it in speed.
"""

from __future__ import annotations

import numpy as np

MATCHED = "@"  # `<baseline>@<method>`: the baseline at each of the method's episodes' own K


def matched_label(baseline: str, method: str) -> str:
    return f"{baseline}{MATCHED}{method}"


def pending_matched(rows, own_k_methods, baselines) -> list[tuple[float, int, tuple[str, str, int, float]]]:
    """Matched episodes still to run, as work items (target, prompt index, (label, baseline, K, stock seconds)):
    one per own-K row and baseline that has none yet (a resumed run finishes what a killed one left). The stock
    latency is the own-K row's: a matched episode is compared in PSNR only, so nothing is timed again for it."""
    done = {(r["method"], r["target"], r["prompt_index"]) for r in rows}
    todo = []
    for row in rows:
        if row["method"] not in own_k_methods:
            continue
        for baseline in baselines:
            label = matched_label(baseline, row["method"])
            if (label, row["target"], row["prompt_index"]) not in done:
                todo.append((row["target"], row["prompt_index"],
                             (label, baseline, int(row["num_reuse"]), float(row["stock_latency_s"]))))
                done.add((label, row["target"], row["prompt_index"]))
    return todo


def _stats(diff: np.ndarray) -> tuple[float, float, float, int]:
    return float(diff.mean()), float(diff.std()), float(1.96 * diff.std() / np.sqrt(len(diff))), len(diff)


def paired_difference(rows, method, baseline, target):
    """(mean, std, 95% CI half-width, n) of method - baseline over the prompts both ran at `target`, or None."""
    a = {r["prompt_index"]: r["psnr"] for r in rows if r["method"] == method and r["target"] == target}
    b = {r["prompt_index"]: r["psnr"] for r in rows if r["method"] == baseline and r["target"] == target}
    common = sorted(set(a) & set(b))
    if not common:
        return None
    return _stats(np.array([a[i] - b[i] for i in common]))


def speedup_curve(rows, method) -> list[tuple[float, dict[int, float]]]:
    """The method's points, one per target, as (measured speedup, {prompt index: PSNR}), by increasing speedup.
    The speedup is the ratio of mean latencies over the target's episodes (as the table's column)."""
    points = []
    for target in sorted({r["target"] for r in rows if r["method"] == method}):
        sel = [r for r in rows if r["method"] == method and r["target"] == target]
        speed = float(np.mean([r["stock_latency_s"] for r in sel]) / np.mean([r["latency_s"] for r in sel]))
        points.append((speed, {r["prompt_index"]: r["psnr"] for r in sel}))
    return sorted(points, key=lambda p: p[0])


def at_speedup(curve, speedup: float, tolerance: float = 0.1) -> dict[int, float] | None:
    """Per-prompt PSNR at `speedup`, linear in speedup between the curve's neighbouring points; within
    `tolerance` beyond its ends, the end point's PSNR (extrapolating a steep end segment invents numbers: a rule
    falling 9 dB between its last two points was put 4 dB lower 0.05x further); None if the method does not come
    that close (it cannot run that fast, or that slow, on this machine)."""
    if not curve or not curve[0][0] - tolerance <= speedup <= curve[-1][0] + tolerance:
        return None
    if speedup <= curve[0][0]:
        return dict(curve[0][1])
    if speedup >= curve[-1][0]:
        return dict(curve[-1][1])
    xs = [x for x, _ in curve]
    k = int(np.searchsorted(xs, speedup)) - 1  # the segment that holds it
    (x0, y0), (x1, y1) = curve[k], curve[k + 1]
    w = (speedup - x0) / (x1 - x0) if x1 > x0 else 0.5
    return {i: (1 - w) * y0[i] + w * y1[i] for i in sorted(set(y0) & set(y1))}


def equal_speedup_difference(rows, method, baseline, speedup, tolerance=0.1):
    """(method's mean PSNR, (mean, std, 95% CI, n) of method - baseline) at one measured speedup, both
    interpolated along their own curves; None where either does not reach it."""
    a = at_speedup(speedup_curve(rows, method), speedup, tolerance)
    b = at_speedup(speedup_curve(rows, baseline), speedup, tolerance)
    if a is None or b is None:
        return None
    common = sorted(set(a) & set(b))
    if not common:
        return None
    return float(np.mean([a[i] for i in common])), _stats(np.array([a[i] - b[i] for i in common]))


def equal_speedup_table(rows, methods, baseline, speedups, tolerance=0.1) -> list[str]:
    """Markdown: every method's PSNR and its difference to `baseline` at each measured speedup."""
    lines = ["| method | " + " | ".join(f"{s:.1f}x: PSNR / vs {baseline}" for s in speedups) + " |",
             "|---|" + "---|" * len(speedups)]
    for method in methods:
        curve = speedup_curve(rows, method)
        if not curve:
            continue
        cells = []
        for s in speedups:
            found = equal_speedup_difference(rows, method, baseline, s, tolerance)
            if found is None:
                reach = at_speedup(curve, s, tolerance) is None
                cells.append(f"not reached ({curve[0][0]:.2f}-{curve[-1][0]:.2f}x)" if reach else "-")
            elif method == baseline:
                cells.append(f"{found[0]:.2f} / -")
            else:
                d = found[1]
                cells.append(f"{found[0]:.2f} / {d[0]:+.2f} ± {d[2]:.2f}")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


def same_k_table(rows, methods, baseline, targets, own_k=()) -> list[str]:
    """Markdown: per method and target, mean K / PSNR / the paired difference to `baseline` at the same K (for a
    method in `own_k`, against the baseline's matched episodes at its own K, marked "own K")."""
    lines = ["| method | " + " | ".join(f"{t:.1f}x: K / PSNR / vs {baseline}" for t in targets) + " |",
             "|---|" + "---|" * len(targets)]
    for method in methods:
        cells = []
        for target in targets:
            sel = [r for r in rows if r["method"] == method and r["target"] == target]
            if not sel:
                cells.append("-")
                continue
            reference = matched_label(baseline, method) if method in own_k else baseline
            d = None if method == baseline else paired_difference(rows, method, reference, target)
            cells.append(f"{np.mean([r['num_reuse'] for r in sel]):.1f} / {np.mean([r['psnr'] for r in sel]):.2f} / "
                         + ("-" if d is None else f"{d[0]:+.2f} ± {d[2]:.2f}") + (" (own K)" if method in own_k else ""))
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines
