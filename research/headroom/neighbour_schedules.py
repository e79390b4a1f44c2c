"""Does a K's best fixed schedule lose to a neighbour's, moved by one reuse? Validation only, no fitting.

    python research/headroom/neighbour_schedules.py --budgets 26 27 28 ... 42
    python research/headroom/neighbour_schedules.py --schedules my_fixed.json --env MorcaTinyRandom-v0 \
        --env-kwargs '{"num_inference_steps": 10}' --budgets 3 4 --select-on 'tiny-train[11:2651:132]'

Each K of the schedules file (default: the packaged one) is played on the validation prompts the packaged
fit chose on, beside uniform spacing and the schedules of K - 1 and K + 1 moved to K (`StaticSchedule.plan`).
Prints one line per K (JSON) with each candidate's mean validation PSNR and which scores best; writes nothing
else, so the packaged file changes only through `morca fit-fixed`. It checks the one thing a fit per K cannot
see: that the schedules are consistent across neighbouring K.
"""

from __future__ import annotations

import argparse
import json

import gymnasium as gym
from tqdm import tqdm

import morca_env  # noqa: F401
from morca_env.cli import json_dict, nonnegative_int
from morca_env.prompts import get_suite
from morca_env.schedulers.fixed import StaticSchedule
from morca_env.evaluation.search import validated_schedule
from morca_env.utils.threads import configure_threads


def neighbour_scores(env, schedules: StaticSchedule, budget: int, pairs) -> dict:
    """{candidate: mean validation PSNR, ..., "kept": best} for one K: its own schedule, uniform, K +- 1 moved."""
    spec = env.unwrapped.budget_spec
    if budget not in schedules.schedules:
        raise ValueError(f"K={budget} has no schedule in the file (it has {sorted(schedules.schedules)})")
    moved = {f"K={n} moved": StaticSchedule({n: schedules.schedules[n]}).plan(spec, budget)
             for n in (budget - 1, budget + 1) if n in schedules.schedules}
    _, scores = validated_schedule(env, schedules.schedules[budget], pairs, None, moved)
    return scores


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="MorcaTiny-v0")
    p.add_argument("--env-kwargs", type=json_dict, default={})
    p.add_argument("--schedules", default=None, help="a StaticSchedule file (default: the env's packaged one)")
    p.add_argument("--budgets", type=nonnegative_int, nargs="+", required=True)
    p.add_argument("--select-on", default="tiny-train[11:2651:132]", help="validation prompts (training suite)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    if args.select_on.startswith(("tiny-eval", "vbench-eval")):
        p.error(f"--select-on {args.select_on!r} is an evaluation suite; validate on training prompts")
    configure_threads(args.threads)
    env = gym.make(args.env, lpips=False, latent_features=False, **args.env_kwargs)
    schedules = StaticSchedule.for_env(env, args.schedules)
    pairs = tuple(get_suite(args.select_on).pairs())
    for budget in tqdm(args.budgets, desc="K", unit="K"):
        scores = neighbour_scores(env, schedules, budget, pairs)
        tqdm.write(json.dumps({"K": budget, **{k: round(v, 3) if isinstance(v, float) else v
                                               for k, v in scores.items()}}))
    env.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
