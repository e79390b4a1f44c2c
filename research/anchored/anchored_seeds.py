"""The anchored recipe over training seeds, measured at the same K on held-out prompts with fresh seeds.

    python research/anchored/anchored_seeds.py --out runs/anchored_seeds --seeds 0 1 2 3 4 --parallel 2
    python research/anchored/anchored_seeds.py --env MorcaScenes-v0 --dataset morca/scenes/anchored-v2 \
        --features p3,mean,var --shared-critic-encoder --out runs/scenes_seeds --eval-pairs 40 --targets 2 2.5 3

Per training seed (resumable: a finished step is skipped): `morca train` (anchored, the quickstart's sizes),
`morca finetune` (on the dataset's own prompts), `morca anchor` on both checkpoints (the margin, on the model's
validation pairs only: tiny-train[7::44], scenes-train[7::44]). Then every scheduler plays the same evaluation
episodes: `--eval-pairs` prompts spread evenly over the model's evaluation suite (every content class of
scenes-eval alike), each with a seed drawn from `--eval-seed` (never used for evaluation before), at each target, K
set by the env's calibration. Reported:
each scheduler's mean paired difference to the best fixed schedule (95% CI), how often it leaves the baseline
(runs, free steps) and what its departures gain on the runs where it leaves. `--validation-only` stops before
the evaluation, with each seed's margin candidates on validation (`validation.md`). Needs the dataset
`--dataset` (`morca collect morca/tiny/anchored-v2`) in $MINARI_DATASETS_PATH. `--features ""` (the default) is
the scalar state; `--features p3,mean,var` lets the state see the content (latent features).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ["--epochs", "60", "--max-steps-per-epoch", "80", "--n-step", "50"]
FINETUNE = ["--n-step", "50", "--rounds", "2", "--trajectories", "16", "--warmup-epochs", "1", "--joint-epochs", "2",
            "--max-steps-per-epoch", "25"]


def morca(args: list[str], log: Path) -> None:
    with open(log, "a") as f:
        subprocess.run([sys.executable, "-m", "morca_env.commands", *args], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                       check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def data_prompts(dataset: str) -> str:
    """The prompts the dataset's recipe collected on (online fine-tuning plays them too)."""
    from morca_env.data.recipe import CollectionRecipe

    return CollectionRecipe.from_file(dataset).env_kwargs["prompts"]


def train_seed(out: Path, seed: int, dataset: str, pairs: int, env_id: str, state: list[str]) -> None:
    """Offline, online and both margins for one training seed (each step skipped once its output exists).
    `state`: the feature arguments of `morca train` (fine-tuning keeps the checkpoint's)."""
    run = out / f"seed{seed}"
    run.mkdir(parents=True, exist_ok=True)
    log = run / "log.txt"
    t0 = time.perf_counter()
    if not (run / "offline" / "final.safetensors").exists():
        morca(["train", "--recipe", "anchored", "--dataset", dataset, *TRAIN, *state, "--run-dir", str(run / "offline"),
               "--seed", str(seed), "--threads", "1"], log)
    if not (run / "online" / "final.safetensors").exists():
        morca(["finetune", "--offline", str(run / "offline" / "final.safetensors"), "--dataset", dataset, *FINETUNE,
               "--env", env_id, "--prompts", data_prompts(dataset),
               "--run-dir", str(run / "online"), "--seed", str(seed), "--threads", "1"], log)
    for stage in ("offline", "online"):
        if not (run / stage / "anchored.safetensors").exists():
            morca(["anchor", str(run / stage / "final.safetensors"), "--out", str(run / stage / "anchored.safetensors"),
                   "--env", env_id, "--pairs", str(pairs), "--threads", "1"], log)
    print(f"seed {seed}: trained and anchored in {time.perf_counter() - t0:.0f} s", flush=True)


def evaluation_options(pairs: int, eval_seed: int, targets: list[float], env_id: str = "MorcaTiny-v0") -> list[dict]:
    from morca_env.models.presets import preset_for_env
    from morca_env.prompts import get_suite

    every = [p for p, _ in get_suite(preset_for_env(env_id).eval_suite).pairs()]
    prompts = every[::max(1, len(every) // pairs)][:pairs]  # evenly spread: scenes-eval lists class after class
    seeds = np.random.default_rng(eval_seed).integers(0, 2**31 - 1, len(prompts))
    return [{"prompt": p, "seed": int(s), "speedup": t} for p, s in zip(prompts, seeds) for t in targets]


def play_method(name: str, make, options: list[dict], path: Path, env_id: str = "MorcaTiny-v0",
                latent_features: bool = False) -> dict:
    """Every evaluation episode of one scheduler (one object per episode), cached in `path`; in batches of 8, but one
    at a time for SeaCache's exact form, which replays the live run to find its threshold."""
    if path.exists():
        return json.loads(path.read_text())
    import gymnasium as gym

    from morca_env.models.presets import preset_for_env
    from morca_env.rollout import rollout_many

    kwargs = dict(lpips=False, latent_features=latent_features, prompts=preset_for_env(env_id).eval_suite)
    env = (gym.make(env_id, **kwargs) if name == "seacache-exact"
           else gym.make_vec(env_id, num_envs=8, vectorization_mode="vector_entry_point", **kwargs))
    policies = [make(env.unwrapped if name == "seacache-exact" else env.env) for _ in options]
    trajectories = rollout_many(env, policies, options, progress=name)
    rows = [{"psnr": min(float(t.info["psnr"]), 100.0), "budget": int(t.info["budget"]),
             "departures": len(getattr(getattr(p, "record", None), "departures", [])),
             "free_steps": getattr(getattr(p, "record", None), "free_steps", 0)}
            for t, p in zip(trajectories, policies)]
    path.write_text(json.dumps(rows))
    env.close()
    return rows


def summary(results: dict, options: list[dict], targets: list[float]) -> str:
    from agents.anchored import paired_interval

    base = {t: np.array([r["psnr"] for r, o in zip(results["best-fixed"], options) if o["speedup"] == t]) for t in targets}
    lines = ["| scheduler | " + " | ".join(f"{t}x: vs best fixed (dB) | leaves (runs / steps) | gain where it leaves"
                                           for t in targets) + " |",
             "|---" * (1 + 3 * len(targets)) + "|"]
    for name, rows in results.items():
        cells = []
        for t in targets:
            mine = [r for r, o in zip(rows, options) if o["speedup"] == t]
            psnr = np.array([r["psnr"] for r in mine])
            mean, half = paired_interval(psnr - base[t])
            leaving = np.array([r["departures"] > 0 for r in mine])
            steps = sum(r["departures"] for r in mine) / max(1, sum(r["free_steps"] for r in mine))
            where = paired_interval((psnr - base[t])[leaving]) if leaving.any() else (0.0, 0.0)
            cells += [f"{mean:+.2f} ± {half:.2f}", f"{leaving.mean():.0%} / {steps:.1%}",
                      f"{where[0]:+.2f} ± {where[1]:.2f}" if leaving.any() else "-"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def validation_table(out: Path, seeds: list[int]) -> str:
    """Each seed's and stage's margin candidates on its validation pairs, as `morca anchor` recorded them."""
    from agents.anchored import anchor_of

    lines = ["| seed | stage | candidates: margin (dB): gain ± CI (runs / steps leaving) | chosen |", "|---|---|---|---|"]
    for seed in seeds:
        for stage in ("offline", "online"):
            selection = anchor_of(out / f"seed{seed}" / stage / "anchored.safetensors")["selection"]
            cells = "; ".join(f"{r['margin']:.3f}: {r['gain_db']:+.2f} ± {r['ci95_db']:.2f} "
                              f"({r['runs_leaving']:.0%} / {r['steps_leaving']:.1%})" for r in selection["candidates"])
            chosen = "never" if selection["chosen"] is None else f"{selection['chosen']:.3f}"
            lines.append(f"| {seed} | {stage} | {cells or '-'} | {chosen} |")
    return "\n".join(lines)


def ship(out: Path, seeds: list[int], path: Path) -> int:
    """Write the shipped scheduler: the online checkpoint whose chosen margin gains most on its validation pairs (0
    for "never"), the lowest seed on a tie; nothing here reads an evaluation episode. -> the seed shipped."""
    from agents.anchored import NEVER, anchor_of, with_margin

    def validation_gain(seed):
        selection = anchor_of(out / f"seed{seed}" / "online" / "anchored.safetensors")["selection"]
        chosen = [r["gain_db"] for r in selection["candidates"] if r["margin"] == selection["chosen"]]
        return chosen[0] if chosen else 0.0

    seed = max(sorted(seeds), key=validation_gain)  # max keeps the first (lowest) seed among equals
    anchor = anchor_of(out / f"seed{seed}" / "online" / "anchored.safetensors")
    margin = NEVER if anchor["margin"] is None else anchor["margin"]
    selection = {**anchor["selection"], "shipped_seed": seed, "seeds": sorted(seeds),
                 "shipped_by": "highest validation gain of the chosen margin, lowest seed on a tie"}
    with_margin(out / f"seed{seed}" / "online" / "final.safetensors", path, margin, selection)
    path.chmod(0o644)
    print(f"shipped seed {seed}'s online scheduler as {path}")
    return seed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("runs/anchored_seeds"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--parallel", type=int, default=2, help="training seeds run at once (one torch thread each)")
    p.add_argument("--env", default="MorcaTiny-v0")
    p.add_argument("--dataset", default="morca/tiny/anchored-v2")
    p.add_argument("--features", default="", help="latent features in the state ('': the scalar state)")
    p.add_argument("--shared-critic-encoder", action="store_true", help="morca train's option (cheaper updates)")
    p.add_argument("--validation-pairs", type=int, default=24)
    p.add_argument("--eval-pairs", type=int, default=60)
    p.add_argument("--eval-seed", type=int, default=36, help="draws the evaluation episodes' generation seeds")
    p.add_argument("--targets", type=float, nargs="+", default=[2.0, 2.5, 3.0, 3.25],
                   help="3.25x lies in the band the anchored data leaves out (3.1x-3.4x): K it was not trained on")
    p.add_argument("--skip-training", action="store_true")
    p.add_argument("--stages", nargs="+", choices=("offline", "online"), default=["offline", "online"],
                   help="which checkpoints of each seed play the evaluation (online: the recipe's final one)")
    p.add_argument("--baselines", nargs="+", default=["best-fixed", "uniform", "seacache-exact"],
                   help="rules played beside the seeds (best-fixed is the reference of every paired difference)")
    p.add_argument("--probe-seeds", type=int, nargs="*", default=[],
                   help="also play these seeds' online schedulers at --probe-margin on the evaluation episodes: what "
                        "their critics' departures do on held-out runs, whatever margin validation chose")
    p.add_argument("--probe-margin", type=float, default=0.0)
    p.add_argument("--ship", type=Path, help="also write the shipped scheduler here (chosen on validation only)")
    p.add_argument("--validation-only", action="store_true",
                   help="stop after training and margins: print the validation candidates, read no evaluation pair")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    state = ["--features", args.features] + (["--shared-critic-encoder"] if args.shared_critic_encoder else [])
    if not args.skip_training:
        with ThreadPoolExecutor(args.parallel) as pool:
            list(pool.map(lambda s: train_seed(args.out, s, args.dataset, args.validation_pairs, args.env, state),
                          args.seeds))
    validation = validation_table(args.out, args.seeds)
    (args.out / "validation.md").write_text(validation + "\n")
    print(validation, flush=True)
    if args.validation_only:
        return 0

    if args.ship:
        ship(args.out, args.seeds, args.ship)
    import torch

    torch.set_num_threads(1)
    import agents  # noqa: F401  (registers "morca")
    from morca_env import schedulers

    options = evaluation_options(args.eval_pairs, args.eval_seed, args.targets, args.env)
    baselines = ["best-fixed", *(b for b in args.baselines if b != "best-fixed")]
    methods = {name: (lambda env, name=name: schedulers.make(name, env)) for name in baselines}
    for seed in args.seeds:
        for stage in args.stages:
            path = args.out / f"seed{seed}" / stage / "anchored.safetensors"
            make = lambda env, path=path: schedulers.make("morca", env, path=str(path))  # noqa: E731
            make.checkpoint = path
            methods[f"morca-{stage}-seed{seed}"] = make
    from agents.anchored import anchor_of

    for seed in args.probe_seeds:
        path = args.out / f"seed{seed}" / "online" / "anchored.safetensors"
        methods[f"morca-online-seed{seed}@margin{args.probe_margin:g}"] = (
            lambda env, path=path: schedulers.make("morca", env, path=str(path), margin=args.probe_margin))
    results = {}
    for name, make in methods.items():
        path = getattr(make, "checkpoint", None)
        if path is not None and anchor_of(path)["margin"] is None:
            # margin "never": the scheduler is the best fixed schedule action for action, without a network call
            # (tests/agents/test_anchored.py), so its episodes are the best fixed schedule's
            results[name] = [{**row, "departures": 0} for row in results["best-fixed"]]
            continue
        results[name] = play_method(name, make, options, args.out / f"eval_{name}.json", args.env,
                                    latent_features=name.startswith("morca") and bool(args.features))
    table = summary(results, options, args.targets)
    (args.out / "summary.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
