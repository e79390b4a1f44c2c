"""Build an offline dataset from a recipe file (Minari format).

A recipe is a JSON file naming the dataset id, the env and the behaviour; the published ones ship with the
package and are named by their dataset id (`morca_env.data.recipe.packaged_recipes()` lists them):

    morca collect morca/tiny/random-v0                      # 1000 MorcaTiny episodes
    morca collect morca/tiny/random-v0 --episodes 50 --workers 2
    morca collect morca/tiny/random-v0 --num-envs 1         # unbatched episodes
    morca collect my-recipe.json                            # your own recipe file
    morca collect morca/wan21/random-v0 --reference-cache-dir /data/refs   # GPU
    morca collect morca/tiny/random-v0 --workers 2 --ray    # local Ray runtime
    morca collect morca/wan21/random-v0 --workers 8 --ray --ray-address auto  # cluster

Crash-safe and resumable (`--resume`, the default): finished episodes are kept
in ~/.cache/morca/collect/<dataset_id>/ and the Minari dataset is built only
when all of them exist. Prints throughput in episodes per minute. With `--ray`
the workers are Ray actors (one env each; one GPU each for the Wan envs) that send
finished episodes back here to be written (pip install -e ".[ray]").
Load the result with `minari.load_dataset("<dataset_id>")`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from morca_env.cli import json_dict, positive_int, show_library_messages, thread_count, worker_count
from morca_env.data import CollectionRecipe, collect_dataset
from morca_env.data.recipe import find_recipe
from morca_env.parallel.executors import add_ray_arguments, executor_from_args
from morca_env.parallel.workers import DEFAULT_NUM_ENVS, default_num_envs


def recipe_file(text: str) -> Path:
    try:
        return find_recipe(text)
    except FileNotFoundError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def main(argv=None) -> int:
    show_library_messages()
    p = argparse.ArgumentParser(prog="morca collect", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("recipe", type=recipe_file, help="a JSON recipe file, or a packaged recipe's dataset id")
    p.add_argument("--episodes", type=positive_int, help="override the recipe's episode count")
    p.add_argument("--dataset-id", help="override the dataset id (e.g. for a small test build)")
    p.add_argument("--workers", type=worker_count, default=1,
                   help="parallel processes (with --ray: Ray actors), one episode stream each")
    p.add_argument("--threads", type=thread_count, default=1, help="torch threads per worker")
    p.add_argument("--num-envs", type=positive_int, default=None,
                   help="episodes each worker plays as one batch (a MorcaVectorEnv; 1: the single env). Default "
                        f"{DEFAULT_NUM_ENVS} for MorcaTiny (measured fastest on a CPU), 1 for the Wan models")
    p.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="continue after the last complete episode (default); --no-resume starts over")
    p.add_argument("--overwrite", action="store_true", help="replace a finished dataset with the same id")
    p.add_argument("--reference-cache-dir", help="where no-cache reference videos are kept")
    p.add_argument("--env-kwargs", type=json_dict, default=None, help="JSON dict merged into the recipe's env kwargs")
    add_ray_arguments(p)
    args = p.parse_args(argv)
    executor = executor_from_args(p, args)
    try:
        recipe = CollectionRecipe.from_file(args.recipe)
        changes = {}
        if args.episodes is not None:
            changes["num_episodes"] = args.episodes
        if args.dataset_id:
            changes["dataset_id"] = args.dataset_id
        if args.env_kwargs:
            changes["env_kwargs"] = {**recipe.env_kwargs, **args.env_kwargs}
        recipe = dataclasses.replace(recipe, **changes)
    except (ValueError, TypeError) as error:  # json.JSONDecodeError is a ValueError
        p.error(f"recipe {args.recipe}: {error}")
    overrides = {"reference_cache_dir": args.reference_cache_dir} if args.reference_cache_dir else {}
    dataset = collect_dataset(recipe.dataset_id, recipe.env_id, recipe.num_episodes, recipe=recipe,
                              resume=args.resume, overwrite=args.overwrite, workers=args.workers,
                              threads=args.threads, env_overrides=overrides, executor=executor,
                              num_envs=args.num_envs or default_num_envs(recipe.env_id, recipe.env_kwargs))
    print(f"dataset {recipe.dataset_id}: {dataset.total_episodes} episodes, {dataset.total_steps} steps at "
          f"{Path(dataset.storage.data_path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
