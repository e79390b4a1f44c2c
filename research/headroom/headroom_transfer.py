"""Where the searched headroom lives: does a schedule searched for one (prompt, seed) help the same prompt under
other seeds, or other prompts?

    python research/headroom/headroom_transfer.py --prompts 'tiny-train[7::1100]' --seeds 3 --budget 35 --evaluations 60 \
        --workers 2 --out runs/transfer

Searches every (prompt, seed) pair at one K (`morca_env.evaluation.search`, resumable, parallel), then plays every found
schedule, uniform spacing and the best fixed schedule on every pair (`search.transfer_matrix`), and reports a
searched schedule's gain over the best fixed schedule on its own pair, on the same prompt under the other seeds,
and on the other prompts. If the gain survives a change of seed, a scheduler that knows the prompt could reach it;
if it survives only on its own pair, it lives in that noise sample and a scheduler must read it off the run
(latent, signal). Seeds: the suite's seed for the prompt, then that + 7919 j. Writes transfer.md, transfer.json
and transfer.png (the matrix) under --out; training prompts only (never the held-out suite).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np

import morca_env  # noqa: F401  (registers the envs)
from morca_env.cli import experiment_parser, positive_int, show_library_messages
from morca_env.schedulers.fixed import StaticSchedule, UniformInterval
from morca_env.prompts import get_suite
from morca_env.evaluation.search import SearchConfig, SearchTask, search_many, transfer_matrix
from morca_env.utils.threads import configure_threads

SEED_STRIDE = 7919


def gains_by_relation(rewards: dict, pairs: list, searched: list[str], baseline: str) -> dict[str, list[float]]:
    """Per evaluated pair, the mean gain over `baseline` of the searched schedules of: that very pair ("own"), the
    same prompt under other seeds ("same prompt"), other prompts ("other prompts")."""
    out = {"own": [], "same prompt, other seed": [], "other prompts": []}
    for b, (prompt_b, _) in enumerate(pairs):
        base = rewards[baseline][b]
        groups = {key: [] for key in out}
        for a, name in enumerate(searched):
            relation = ("own" if a == b else "same prompt, other seed" if pairs[a][0] == prompt_b else "other prompts")
            groups[relation].append(rewards[name][b] - base)
        for key, values in groups.items():
            if values:
                out[key].append(float(np.mean(values)))
    return out


def library_choice(rewards: dict, pairs: list, searched: list[str], baselines: list[str]) -> list[float]:
    """Per pair, the best reward among the other prompts' searched schedules and the baselines: what a scheduler
    that picks the right schedule from that library for each run would reach (an oracle choice; whether the
    choice can be predicted from the run is the open question)."""
    return [max([rewards[name][b] for a, name in enumerate(searched) if pairs[a][0] != pairs[b][0]]
                + [rewards[base][b] for base in baselines]) for b in range(len(pairs))]


def summary_lines(rewards, pairs, searched, baselines) -> list[str]:
    lines = ["| schedules played on a pair | " + " | ".join(f"vs {b}" for b in baselines) + " | n |",
             "|---|" + "---|" * (len(baselines) + 1)]
    relations = {b: gains_by_relation(rewards, pairs, searched, b) for b in baselines}
    for relation in relations[baselines[0]]:
        cells = []
        for b in baselines:
            values = np.array(relations[b][relation])
            cells.append(f"{values.mean():+.2f} ± {1.96 * values.std() / np.sqrt(len(values)):.2f}" if len(values)
                         else "-")
        lines.append(f"| searched for {relation} | " + " | ".join(cells) + f" | {len(relations[baselines[0]][relation])} |")
    chosen = np.array(library_choice(rewards, pairs, searched, baselines))
    cells = []
    for b in baselines:
        gain = chosen - np.array(rewards[b])
        cells.append(f"{gain.mean():+.2f} ± {1.96 * gain.std() / np.sqrt(len(gain)):.2f}")
    lines.append("| the best of the other prompts' searched schedules and the baselines, per pair (oracle choice) | "
                 + " | ".join(cells) + f" | {len(pairs)} |")
    return lines


def plot(out: Path, rewards, pairs, searched, baseline) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = np.array([[rewards[name][b] - rewards[baseline][b] for b in range(len(pairs))] for name in searched])
    limit = float(np.abs(grid).max()) or 1.0
    fig, ax = plt.subplots(figsize=(1.2 + 0.45 * len(pairs), 1.0 + 0.45 * len(searched)))
    image = ax.imshow(grid, cmap="RdBu", vmin=-limit, vmax=limit)
    ax.set_xlabel("played on (prompt, seed)")
    ax.set_ylabel("searched for (prompt, seed)")
    prompts = list(dict.fromkeys(prompt for prompt, _ in pairs))  # p<i>: the suite's i-th prompt, s<j>: its j-th seed
    labels = [f"p{prompts.index(prompt)} s{[q for q, _ in pairs[:b]].count(prompt)}" for b, (prompt, _) in enumerate(pairs)]
    ax.set_xticks(range(len(pairs)), labels, rotation=90, fontsize=7)
    ax.set_yticks(range(len(pairs)), labels, fontsize=7)
    fig.colorbar(image, label=f"PSNR - {baseline} (dB)")
    ax.set_title(f"searched schedules on other pairs, vs {baseline}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "transfer.png", dpi=130)
    plt.close(fig)


def main(argv=None) -> int:
    show_library_messages()
    p = experiment_parser(__doc__)
    p.add_argument("--prompts", default="tiny-train[7::1100]", help="prompt suite (training prompts)")
    p.add_argument("--seeds", type=positive_int, default=3, help="seeds per prompt")
    p.add_argument("--budget", type=positive_int, default=35, help="K, the same for every pair")
    p.add_argument("--evaluations", type=positive_int, default=60, help="schedules evaluated per search")
    args = p.parse_args(argv)
    args.threads = configure_threads(args.threads, workers=args.workers)
    suite = get_suite(args.prompts)
    pairs = [(prompt, seed + SEED_STRIDE * j) for prompt, seed in suite.pairs() for j in range(args.seeds)]
    env = gym.make(args.env, lpips=False, latent_features=False, **args.env_kwargs).unwrapped
    budget = env.budget_spec.check_budget(args.budget)
    tasks = [SearchTask(f"pair{i:03d}_K{budget:03d}", (pair,), budget) for i, pair in enumerate(pairs)]
    results = search_many(tasks, args.env, args.env_kwargs, args.out / "searches",
                          SearchConfig(evaluations=args.evaluations), workers=args.workers, threads=args.threads)
    searched = [task.name for task in tasks]
    schedules = {name: result["schedule"] for name, result in zip(searched, results)}
    schedules["uniform"] = UniformInterval().plan(env.budget_spec, budget)
    schedules["best-fixed"] = StaticSchedule.packaged(env.preset.name).plan(env.budget_spec, budget)
    rewards = transfer_matrix(env, schedules, pairs, args.out / "transfer.jsonl")
    baselines = ["best-fixed", "uniform"]
    lines = [f"{args.env}, K = {budget}, {len(suite)} prompts x {args.seeds} seeds of {args.prompts}, "
             f"{args.evaluations} evaluations per search; PSNR gain in dB, mean over the pairs played on "
             "(95% CI over those pairs)", "",
             f"mean PSNR: uniform {np.mean(rewards['uniform']):.2f}, best fixed {np.mean(rewards['best-fixed']):.2f}",
             "", *summary_lines(rewards, pairs, searched, baselines)]
    (args.out / "transfer.md").write_text("\n".join(lines) + "\n")
    (args.out / "transfer.json").write_text(json.dumps({"pairs": pairs, "budget": budget, "rewards": rewards}) + "\n")
    plot(args.out, rewards, pairs, searched, "best-fixed")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
