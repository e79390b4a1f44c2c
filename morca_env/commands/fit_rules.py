"""Fit the model-specific constants of the cache rules by their authors' calibration procedures.

    morca fit-rules --env MorcaTiny-v0 --prompts tiny-train:4 --save packaged
    morca fit-rules --rules magcache --env MorcaTinyRandom-v0 --prompts tiny-train:2

MagCache: per-step, per-branch residual-norm ratios of no-cache runs
(`morca_env.schedulers.rules.magcache.fit_ratios`). TeaCache: the degree-4 polynomial from
the time embedding's relative L1 to the model output's, for the plain and the
retention-step signal (`morca_env.schedulers.rules.teacache.fit_coefficients`). Writes
`<model>_magcache.json` / `<model>_teacache.json` (`--save`: 'user', the user
calibration directory; 'packaged', the copy shipped with the package; or a directory).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from datetime import datetime, timezone

import gymnasium as gym

import morca_env  # noqa: F401
from morca_env.cli import env_id, json_dict, show_library_messages, thread_count
from morca_env.utils.io import atomic_write_text
from morca_env.speedup.files import calibration_file
from morca_env.models.presets import preset_for_env
from morca_env.prompts import get_suite, is_evaluation_suite
from morca_env.schedulers.rules import magcache, teacache
from morca_env.utils.threads import configure_threads

RULES = ("magcache", "teacache")


def main(argv=None) -> int:
    show_library_messages()
    p = argparse.ArgumentParser(prog="morca fit-rules", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", type=env_id, default="MorcaTiny-v0")
    p.add_argument("--env-kwargs", type=json_dict, default={}, help="JSON dict of env arguments")
    p.add_argument("--rules", nargs="+", choices=RULES, default=list(RULES))
    p.add_argument("--prompts", help="training prompt suite with fixed seeds (<suite>:<n>; default: the model's, "
                                     "e.g. tiny-train:4)")
    p.add_argument("--threads", type=thread_count, default=1)
    p.add_argument("--save", default="user", help="'user', 'packaged' or a directory")
    args = p.parse_args(argv)
    args.prompts = args.prompts or preset_for_env(args.env).prompts.fit_rules
    if is_evaluation_suite(args.prompts):
        p.error(f"--prompts {args.prompts!r} is an evaluation suite; fit on training prompts")
    configure_threads(args.threads)
    pairs = get_suite(args.prompts).pairs()
    env = gym.make(args.env, **{"lpips": False, "latent_features": False, **args.env_kwargs}).unwrapped
    model = env.preset.name
    command = "morca fit-rules " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    for rule in args.rules:
        t0 = time.perf_counter()
        if rule == "magcache":
            fitted = {"ratios": magcache.fit_ratios(env.denoiser, pairs)}
        else:
            fitted = teacache.fit_coefficients(env.denoiser, pairs)
        record = {"rule": rule, "model": model, "num_steps": env.num_steps, "branches": list(env.denoiser.branches),
                  "pairs": [list(pair) for pair in pairs], **fitted, "command": command,
                  "fitted": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
                  "seconds": round(time.perf_counter() - t0, 1)}
        path = calibration_file(f"{model}_{rule}.json", args.save)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(record, indent=1) + "\n")
        print(f"{rule}: {record['seconds']} s over {len(pairs)} prompts -> {path}")
    env.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
