"""The leaderboard page from finished runs: rliable's IQM and 95% stratified-bootstrap CIs, a performance profile."""

from __future__ import annotations

import contextlib
from collections import Counter
from pathlib import Path

import numpy as np

# rules that draw from a seed, run once per training seed (the others are deterministic: one run)
SEEDED_RULES = ("random", "coin-flip")
REPS = 2000  # bootstrap resamples (rliable's examples use 50000; 2000 keeps the page a few seconds to remake)


def label_of(run: dict) -> str:
    """'method on dataset', and the observation track of a learned run read on the scalars track."""
    label = run["method"] if run["dataset"] == "-" else f"{run['method']} on {run['dataset']}"
    return label + (" [scalars]" if run.get("track") == "scalars" else "")


def track_of(job: dict) -> str:
    """The observation track a run's policy reads ("-" for a rule: both; runs from before tracks: "full")."""
    return job.get("track", "full")


@contextlib.contextmanager
def seeded_numpy(seed: int = 0):
    """numpy's global generator seeded for the block, then restored: rliable's bootstraps draw from it (its
    `random_state` argument reaches arch, which no longer uses it), so the page's intervals repeat."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def by_method(results: list[dict], seeds: int) -> dict[str, list[dict]]:
    """Complete methods only (every seed of a learned one finished), keyed by `label_of`."""
    groups: dict[str, list[dict]] = {}
    for r in results:
        groups.setdefault(label_of(r), []).append(r)
    needed = {label: (seeds if g[0]["family"] != "rule" or g[0]["rule"] in SEEDED_RULES else 1)
              for label, g in groups.items()}
    return {label: g for label, g in groups.items() if len(g) >= needed[label]}


def learning_curve(runs: list[dict]) -> tuple[list[int], np.ndarray, np.ndarray] | None:
    """(x, mean, 95% t half-width) over a method's runs at the checkpoints every run has; None without curves."""
    from scipy import stats

    curves = [{point["x"]: point["normalized"] for point in r.get("curve") or []} for r in runs]
    xs = sorted(set.intersection(*(set(c) for c in curves))) if curves and all(curves) else []
    if not xs:
        return None
    values = np.array([[c[x] for x in xs] for c in curves])
    half = (stats.t.ppf(0.975, len(values) - 1) * values.std(axis=0, ddof=1) / np.sqrt(len(values))
            if len(values) > 1 else np.zeros(len(xs)))
    return xs, values.mean(axis=0), half


def plateau(curve) -> str:
    """"yes" when the last two checkpoints' 95% intervals overlap (the curve stopped rising or falling within its
    noise); "no, rising" or "no, falling" when they do not (the run ended at the board's budget, still moving);
    "-" without two checkpoints."""
    if curve is None or len(curve[0]) < 2:
        return "-"
    _, mean, half = curve
    if abs(mean[-1] - mean[-2]) <= half[-1] + half[-2]:
        return "yes"
    return "no, rising" if mean[-1] > mean[-2] else "no, falling"


SAME_PSNR_DB = 1e-3  # a learned entry within this of a rule at every run and target plays that rule's schedule


def plays(runs: list[dict], rules: dict[str, list[dict]]) -> str:
    """The deterministic rule (one run) whose mean PSNR every run matches at every target, or "-": a collapsed agent
    lands exactly on a constant policy's score, and the reader should not have to spot the equal digits."""
    for label, (rule,) in ((k, g) for k, g in rules.items() if len(g) == 1):
        if all(set(r["scores"]) == set(rule["scores"])
               and all(abs(r["scores"][t]["psnr"] - s["psnr"]) <= SAME_PSNR_DB for t, s in rule["scores"].items())
               for r in runs):
            return label
    return "-"


def score_matrix(runs: list[dict], targets: list[str]) -> np.ndarray:
    """(runs, targets) normalized scores: rliable's (num_runs, num_tasks)."""
    return np.array([[r["scores"][t]["normalized"] for t in targets] for r in runs])


def write_page(results: list[dict], args, page: Path, expected: list[dict] | None = None,
               settings: list[tuple[str, str]] = ()) -> None:
    """The page; `settings`: (method, what it trains with) rows, as the board's `hyperparameters` reads them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from rliable import library as rly
    from rliable import metrics

    from morca_env.utils.io import atomic_path, atomic_write_text

    groups = by_method(results, args.seeds)
    if not groups:
        print("no complete method yet: nothing to report")
        return
    targets = sorted({t for g in groups.values() for r in g for t in r["scores"]}, key=float)
    scores = {label: score_matrix(g, targets) for label, g in groups.items()}
    iqm = lambda x: np.array([metrics.aggregate_iqm(x)])  # noqa: E731

    def interval(columns) -> tuple[dict, dict]:
        """IQM and its CI per method, each from its own seeded bootstrap: a page remade from the same runs, or with
        other methods added, gives every method the same digits."""
        pairs = {}
        for k, v in scores.items():
            with seeded_numpy():
                pairs[k] = rly.get_interval_estimates({k: v[:, columns]}, iqm, reps=REPS)
        return {k: p[0][k] for k, p in pairs.items()}, {k: p[1][k] for k, p in pairs.items()}

    overall, overall_ci = interval(slice(None))
    per_target = [interval([i]) for i in range(len(targets))]
    ranked = sorted(groups, key=lambda k: -float(overall[k][0]))
    mean_psnr = {k: {t: np.mean([r["scores"][t]["psnr"] for r in g]) for t in targets} for k, g in groups.items()}

    lines = ["# MorcaTiny leaderboard", "",
             "Normalized score at the same K: 100 x (PSNR - random feasible) / (best fixed - random feasible), "
             "per episode pair of the benchmark suite (`morca_env.evaluation.benchmark`, MorcaTiny-v0: held-out tiny-eval "
             f"prompts, targets {', '.join(t + 'x' for t in targets)}; every {args.pair_step}. pair of the 40). "
             "IQM over runs x targets (and per target over runs) with 95% stratified-bootstrap CIs "
             f"(rliable, {REPS} resamples). Best fixed is 100 by construction: the bar a learned scheduler must clear.",
             "", f"Training budgets: offline {args.updates} gradient updates (each algorithm's default batch size) on "
             f"the first {args.episodes} episodes of a dataset; online {args.online_episodes} environment episodes "
             f"({args.online_episodes * 50} steps); {args.seeds} training seeds per learned method; "
             "rules are deterministic except random feasible and the coin flip (one run per seed). Learned methods "
             "run on each observation track: the full state, and \"[scalars]\", the seven scalars and the mask (a "
             "rule reads only those: one row serves both tracks).", "",
             "Settings, read from the configs the board builds (every other setting is the library's default; the "
             "value-based methods' targets are n-step returns, and at n-step 50 each is the episode's own return):",
             "", "| method | settings |", "|---|---|",
             *(f"| {method} | {text} |" for method, text in settings),
             "",
             "| rank | method | runs | IQM (95% CI) | " + " | ".join(f"{t}x IQM" for t in targets) + " | "
             + " | ".join(f"{t}x PSNR" for t in targets) + " | projected / episode | plays | train s / run | plateau |",
             "|---|---|---|---|" + "---|" * (2 * len(targets)) + "---|---|---|---|"]
    curves = {label: learning_curve(groups[label]) for label in ranked if groups[label][0]["family"] != "rule"}
    rules = {label: g for label, g in groups.items() if g[0]["family"] == "rule"}
    for rank, label in enumerate(ranked, 1):
        low, high = overall_ci[label][:, 0]
        cells = [f"{per_target[i][0][label][0]:.1f}" for i in range(len(targets))]
        train = np.mean([r["train_s"] for r in groups[label]])
        projected = np.mean([s["projected"] for r in groups[label] for s in r["scores"].values()])
        lines.append(f"| {rank} | {label} | {len(groups[label])} | {overall[label][0]:.1f} ({low:.1f}, {high:.1f}) | "
                     + " | ".join(cells) + " | " + " | ".join(f"{mean_psnr[label][t]:.2f}" for t in targets)
                     + f" | {projected:.1f} | {'-' if label in rules else plays(groups[label], rules)} | {train:.0f} | "
                     f"{plateau(curves.get(label))} |")
    lines += ["", "\"plays\": the rule whose schedule a learned entry plays, where its PSNR equals that rule's "
              f"(within {SAME_PSNR_DB} dB) at every run and target: an agent that collapsed to a constant policy "
              "lands exactly on it. Its IQM can still differ from the rule's: the IQM trims a quarter of a learned "
              "entry's runs x targets at each end, and nothing of a deterministic rule's one run."]
    top = ranked[0]
    family = groups[top][0]["family"]
    lines += ["", f"Top: **{top}**" + (" — a rule, not a learned scheduler." if family == "rule" else "."), ""]
    learned = [k for k in ranked if groups[k][0]["family"] != "rule"]
    random_iqm = next((float(overall[k][0]) for k in ranked if groups[k][0].get("rule") == "random"), None)
    above = [k for k in learned if random_iqm is not None and float(overall[k][0]) >= random_iqm]
    if above:
        lines += [f"At or above the random feasible schedule ({random_iqm:.1f}): " + ", ".join(above) + ".", ""]
    if learned and random_iqm is not None and all(float(overall[k][0]) < random_iqm for k in learned):
        lines += [f"At these budgets no learned method reaches even the random feasible schedule ({random_iqm:.1f}): "
                  "the vanilla ones also ask for many infeasible actions (the projected column: the env overrides "
                  "them). The board measures algorithms at one common budget (the training budgets above), not at "
                  "their best.", ""]
    made_on = Counter(r.get("machine", "not recorded") for r in results)
    lines += ["Made on (runs per machine; train s / run depend on it): "
              + "; ".join(f"{m}: {n}" for m, n in sorted(made_on.items())) + ".", ""]
    started = {label_of(r) for r in results}
    missing = sorted(started - set(groups))
    if missing:
        lines += ["Not ranked (seeds still running): " + ", ".join(missing), ""]
    unstarted = sorted({label_of(j) for j in expected or []} - started)
    if unstarted:
        lines += ["Not run yet (rerun the command to continue): " + ", ".join(unstarted), ""]

    low = min(-100.0, float(min(v.min() for v in scores.values())) - 10)
    taus = np.linspace(low, 150, 126)
    with seeded_numpy():
        profiles, profile_cis = rly.create_performance_profile({k: scores[k] for k in ranked}, taus, reps=REPS)
    # a method keeps one colour on both plots and every panel, its dataset is the line's style; rules are grey
    methods = list(dict.fromkeys(groups[k][0]["method"] for k in ranked if groups[k][0]["family"] != "rule"))
    dashes = {"anchored": "--", "mixture": ":"}

    def colour(label):
        return plt.get_cmap("tab10").colors[methods.index(groups[label][0]["method"]) % 10]

    def line(label):
        return dashes.get(groups[label][0]["dataset"], "-")

    def track(label):
        return track_of(groups[label][0])

    rule_labels = [k for k in ranked if groups[k][0]["family"] == "rule"]
    # the scale's anchors and floors as references (the other rules are in the table)
    references = {"best-fixed": ("0.1", "-"), "random": ("0.45", "-"), "coin-flip": ("0.45", "-."),
                  "always-recompute": ("0.65", ":")}
    # a panel per observation track, each with the rules (which read both tracks' inputs) as references
    tracks = [t for t in ("full", "scalars") if any(k not in rule_labels and track(k) == t for k in ranked)]
    tracks = tracks or ["full"]
    fig, axes = plt.subplots(1, len(tracks), figsize=(9.5 * len(tracks), 5.2), squeeze=False)
    for ax, shown in zip(axes[0], tracks):
        for label in (k for k in rule_labels if groups[k][0]["rule"] in references):
            grey, dash = references[groups[label][0]["rule"]]
            ax.plot(taus, profiles[label], dash, color=grey, lw=1.2, label=label)
        for label in (k for k in ranked if k not in rule_labels and track(k) == shown):
            ax.plot(taus, profiles[label], line(label), color=colour(label), lw=1.8,
                    label=label.removesuffix(" [scalars]"))
            ax.fill_between(taus, profile_cis[label][0], profile_cis[label][1], color=colour(label), alpha=0.12)
        ax.set_title("full state" if shown == "full" else "scalars track")
        ax.set_xlabel("normalized score tau (0 = random feasible, 100 = best fixed)")
        ax.set_ylabel("fraction of runs x targets with score > tau")
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    plot = page.with_suffix(".png")
    with atomic_path(plot) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    drawn = {label: c for label, c in curves.items() if c is not None}
    if drawn:
        curve_plot = page.with_name(page.stem + "_curves.png")
        # a panel per family and observation track: a dozen curves on one axis are unreadable
        def panel(label):
            return groups[label][0]["family"], track(label)

        families = [f for f in ("offline", "online") if any(panel(k)[0] == f for k in drawn)]
        panel_tracks = [t for t in ("full", "scalars") if any(panel(k)[1] == t for k in drawn)]
        fig, axes = plt.subplots(len(families), len(panel_tracks), figsize=(7 * len(panel_tracks), 4.6 * len(families)),
                                 squeeze=False)
        for (row, family), (column, shown) in ((f, t) for f in enumerate(families) for t in enumerate(panel_tracks)):
            ax = axes[row][column]
            mine = [k for k in drawn if panel(k) == (family, shown)]
            if not mine:
                ax.set_visible(False)
                continue
            for label in mine:
                xs, mean, half = drawn[label]
                ax.plot(xs, mean, "o" + line(label), color=colour(label), label=label.removesuffix(" [scalars]"))
                ax.fill_between(xs, mean - half, mean + half, color=colour(label), alpha=0.12)
            if family == "offline":  # checkpoints twice apart; the online axis starts at the recipe's 0 episodes
                ax.set_xscale("log", base=2)
            ax.axhline(0, color="grey", lw=0.8)
            ax.axhline(100, color="grey", lw=0.8, ls=":")
            ax.set_xlabel("gradient updates" if family == "offline" else "environment episodes")
            ax.set_ylabel("normalized score, validation pairs\n(mean, 95% CI over seeds)")
            ax.set_title(f"{family}, {'full state' if shown == 'full' else 'scalars track'}")
            ax.legend(fontsize=7, loc="best")
        fig.tight_layout()
        with atomic_path(curve_plot) as tmp:
            fig.savefig(tmp, dpi=110, format="png")
        plt.close(fig)
        lines += ["Learning curves: the normalized score on 8 validation pairs of training prompts (no training, fit "
                  "or selection slice uses them) at checkpoints twice apart; \"plateau\" says whether the last two "
                  "checkpoints' 95% intervals overlap, and \"no, rising\" that the method was still improving when "
                  "it reached the training budget above, the compute limit of this board (the MORCA online trainers: a "
                  "point per round of episodes; offline-to-online IQL's first point, at 0 episodes, is its offline "
                  "phase alone).", "",
                  f"![learning curves]({curve_plot.name})", ""]
    command = args.run_command or args.command
    records = f", one JSON record each in `{Path(args.out) / 'runs'}`" if getattr(args, "out", None) else ""
    lines += [f"![performance profile]({plot.name})", "", f"Remake: `{command}` (resumable: a rerun continues; "
              f"`--report` rewrites this page from the runs done{records}).", ""]
    atomic_write_text(page, "\n".join(lines))
    print(f"wrote {page} and {plot}")
