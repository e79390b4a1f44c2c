"""MORCA gym quickstart: the whole pipeline on a CPU testbed, sized for a 2-core CPU (~10 min, plus ~2 min of setup).

    morca quickstart                      # the default (anchored) recipe at quick sizes (the README's main command)
    morca quickstart --env MorcaScenes-v0 # the same on the testbed whose videos differ in motion and complexity
    morca quickstart --recipe paper       # the paper's recipe (mixture data, plain IQL) at quick sizes
    morca quickstart --scale paper        # the paper's recipe at the paper's sizes (hours on a CPU)
    morca quickstart --episodes 300 --offline-epochs 10 ...   # anything in between

Runs the same commands you would run at full scale, one after the other (the data recipes ship with the
package, named by their dataset id):
  1. morca collect               offline trajectories -> Minari dataset: groups of episodes on and around the best
                                 fixed schedule (anchored), the mixture recipe (--recipe paper), or the paper's
                                 random threshold curves (--scale paper)
  2. morca train                 offline discrete IQL (anchored: on the residual of the best fixed schedule)
  3. morca finetune              online fine-tuning rounds
  4. morca anchor                (anchored) the online scheduler's margin, chosen on the model's validation prompts
                                 (MorcaTiny: tiny-train[7::44])
  5. morca evaluate              measures this machine's speedup calibration, then MORCA (anchored: online and the
                                 shipped scheduler, at the rules' K per prompt (--same-k), so paired with the best
                                 fixed schedule; paper: offline and online, speedups held by feedback) vs SeaCache
                                 (global threshold), uniform spacing and the best fixed schedule at 2x / 2.5x / 3x
                                 on held-out prompts (tiny-eval, scenes-eval): table, Pareto plot, schedule plot, videos
Everything (datasets, caches, checkpoints, results) goes under --out (default runs/quickstart);
re-running resumes where it stopped.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from morca_env.cli import nonnegative_int, output_directory, positive_int, speedup
from morca_env.commands import resume_flag, run_step as run
from morca_env.data.recipe import find_recipe
from morca_env.models.presets import preset_for_env

# sizes where 0 means something (no cap on the updates, no warm-up, the installed calibration); every other
# count must be positive (--episodes 0 / --workers 0 used to pass here and fail later inside a child step)
ZERO_ALLOWED = {"max_steps_per_epoch", "online_steps_per_epoch", "warmup_epochs", "calibration_rounds"}
QUICK = dict(episodes=400, workers=2, offline_epochs=60, max_steps_per_epoch=80, rounds=2, trajectories=16,
             warmup_epochs=1, joint_epochs=2, online_steps_per_epoch=25, eval_prompts=8, calibration_rounds=6,
             timing_repeats=2, features="", n_step=50, validation_pairs=16)
SCALES = {  # MorcaTiny-v0's recipes and prompts; `for_env` gives another testbed's
    # quick, anchored (the default): scalar state features and Monte-Carlo returns, the variant that learns at CPU
    # scale (docs/results/ablation_tiny.md), on groups around the best fixed schedule (agents.anchored)
    ("quick", "anchored"): dict(data="morca/tiny/anchored-v2", prompts="tiny-train[5::22]", **QUICK),
    # quick, paper: the same sizes on the mixture data (threshold curves alone: -0.2 / -0.4 dB against the best
    # fixed schedule at 2.5x / 3x; the mixture: +0.7 / +0.1, docs/results/scheduler_tiny.md)
    ("quick", "paper"): dict(data="morca/tiny/mixture-v0", prompts="tiny-train:250", **QUICK),
    # paper: the paper's data, network (latent features) and one-step TD
    # (96 episodes x 2400 updates collapsed to "reuse until the budget runs out"; 400 x 4800 does not)
    ("paper", "paper"): dict(data="morca/tiny/random-v0", prompts="tiny-train:250", episodes=1000,
                             workers=2, offline_epochs=200, max_steps_per_epoch=0, rounds=16, trajectories=100,
                             warmup_epochs=5, joint_epochs=20, online_steps_per_epoch=0, eval_prompts=200,
                             calibration_rounds=10, timing_repeats=3, features="p3,mean,var", n_step=1,
                             validation_pairs=16),
}


TESTBEDS = ("MorcaTiny-v0", "MorcaScenes-v0")  # the CPU testbeds with packaged recipes (morca/<model>/<name>)


def for_env(sizes: dict, env_id: str) -> dict:
    """`sizes` with the data recipe and training prompts of `env_id`'s model (same recipe file names and slices)."""
    preset = preset_for_env(env_id)
    tiny = preset_for_env("MorcaTiny-v0")
    return {**sizes, "data": sizes["data"].replace(f"/{tiny.name}/", f"/{preset.name}/"),
            "prompts": sizes["prompts"].replace(tiny.train_suite, preset.train_suite)}


def lean_env(features: str) -> list[str]:
    """Scalar-state schedulers (and the rules) never read latent features: evaluate in the cheaper env."""
    return [] if features else ["--env-kwargs", '{"latent_features": false}']


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="morca quickstart", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", choices=TESTBEDS, default="MorcaTiny-v0", help="the CPU testbed")
    p.add_argument("--scale", choices=("quick", "paper"), default="quick")
    p.add_argument("--recipe", choices=("anchored", "paper"), default=None,
                   help="anchored (default at --scale quick): learn to leave the best fixed schedule only where it "
                        "pays (agents.anchored); paper: the paper's recipe (the only one at --scale paper)")
    p.add_argument("--out", type=output_directory, default=Path("runs/quickstart"))
    for name, value in SCALES[("quick", "anchored")].items():  # counts: 0 means "none" / "no cap" only where it can
        count = nonnegative_int if name in ZERO_ALLOWED else positive_int
        p.add_argument(f"--{name.replace('_', '-')}", type=count if isinstance(value, int) else str, default=None)
    p.add_argument("--targets", type=speedup, nargs="+", default=[2.0, 2.5, 3.0])
    args = p.parse_args(argv)
    recipe = args.recipe or ("anchored" if args.scale == "quick" else "paper")
    if (args.scale, recipe) not in SCALES:
        p.error("--scale paper runs the paper's recipe only (the anchored recipe's sizes are --scale quick's)")
    defaults = for_env(SCALES[(args.scale, recipe)], args.env)
    sizes = {k: (getattr(args, k) if getattr(args, k) is not None else v) for k, v in defaults.items()}
    try:
        find_recipe(sizes["data"])
    except FileNotFoundError as error:
        p.error(f"--data: {error}")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MINARI_DATASETS_PATH": str(out / "minari"), "MORCA_CACHE_DIR": str(out / "cache"),
           "PYTHONUNBUFFERED": "1"}
    model = preset_for_env(args.env).name
    dataset = f"morca/{model}/quickstart-{Path(sizes['data']).stem}"  # one dataset per recipe: a rerun never mixes them
    on_env = ["--env", args.env]
    t0 = time.perf_counter()
    cap = lambda n: ["--max-steps-per-epoch", str(n)] if n else []  # noqa: E731
    anchored = recipe == "anchored"
    steps = 5 if anchored else 4

    run(f"1/{steps} collect", ["collect", sizes["data"], "--dataset-id", dataset,
                               "--episodes", str(sizes["episodes"]), "--workers", str(sizes["workers"])], env)
    offline = out / "offline"
    offline_args = ["train", "--recipe", recipe, "--dataset", dataset, "--epochs", str(sizes["offline_epochs"]),
                    "--features", sizes["features"], "--n-step", str(sizes["n_step"]),
                    "--run-dir", str(offline), *cap(sizes["max_steps_per_epoch"]), *resume_flag(offline)]
    run(f"2/{steps} offline IQL", offline_args, env)
    online = out / "online"
    online_args = ["finetune", "--offline", str(offline / "final.safetensors"), "--dataset", dataset,
                   "--n-step", str(sizes["n_step"]), "--prompts", sizes["prompts"], *on_env,
                   "--rounds", str(sizes["rounds"]), "--trajectories", str(sizes["trajectories"]),
                   "--warmup-epochs", str(sizes["warmup_epochs"]), "--joint-epochs", str(sizes["joint_epochs"]),
                   "--run-dir", str(online), *cap(sizes["online_steps_per_epoch"]), *resume_flag(online)]
    run(f"3/{steps} online fine-tuning", online_args, env)
    methods = [f"morca-offline={offline / 'final.safetensors'}", f"morca-online={online / 'final.safetensors'}"]
    comparison = ["--feedback", "--no-matched"]  # equal measured speedup, each method's K steered by feedback
    if anchored:  # the online scheduler's margin on validation pairs; compared with the shipped one at the same K
        chosen = online / "anchored.safetensors"
        if not chosen.exists():  # resumable: a chosen margin is kept
            run(f"4/{steps} margin", ["anchor", str(online / "final.safetensors"), "--out", str(chosen), *on_env,
                                      "--pairs", str(sizes["validation_pairs"]), "--targets", *map(str, args.targets)],
                env)
        from agents.policy import SHIPPED, shipped_checkpoint

        methods = [f"morca-online={chosen}"]
        if model in SHIPPED:
            methods.append(f"morca-shipped={shipped_checkpoint(model)}")
        # every exact-budget method at the calibration's K per prompt (open loop): MORCA paired with the best fixed
        # schedule at the same K, the comparison that ranks schedulers (feedback would give each method its own K)
        comparison = ["--same-k", "--no-matched"]
    run(f"{steps}/{steps} evaluate", ["evaluate", *on_env, "--prompts", str(sizes["eval_prompts"]), "--out", str(out / "eval"),
                                      "--calibrate", str(sizes["calibration_rounds"]),
                                      "--timing-repeats", str(sizes["timing_repeats"]),
                                      *comparison, *lean_env(sizes["features"]),
                                      "--targets", *map(str, args.targets),
                                      "--methods", "uniform", "best-fixed", "seacache-global", *methods], env)
    print(f"\nquickstart finished in {(time.perf_counter() - t0) / 60:.1f} min. Results:")
    for name in ("table.md", "pareto.png", "schedules.png", "video_000.gif"):
        print(f"  {out / 'eval' / name}")
    print(f"  TensorBoard logs: tensorboard --logdir {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
