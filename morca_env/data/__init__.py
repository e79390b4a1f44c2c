"""Offline trajectories: crash-safe collection into Minari datasets, and Minari -> d3rlpy conversion.

Split as Minari splits it: `recipe` (what to collect), `collect` (running the behaviour policy, one episode at
a time, on workers), `staging` (each finished episode as its own file), `build` (the Minari dataset and its card),
`replay` (reading back: replay options and d3rlpy buffers) and `integrity` (checksums, verified loading).

Collection runs the env in budget-free mode (`enforce_budget=False`) with a
behaviour policy (the paper's random threshold curves by default), then relabels
every episode with its realised reuse count K, so that each recorded `K`, `u_t`
and `action_mask` is consistent with the recorded actions (paper App. B.3).

Crash safety: each finished episode is committed as its own file in a staging
directory (atomic write), keyed by episode index; `resume=True` skips the
indices already there. Only when all episodes exist is the Minari dataset built,
in a hidden directory that is then renamed into place. A `kill -9` therefore
loses at most the episodes in flight, and a finished dataset is replaced only
with `overwrite=True`. Episode i always uses env seed `seed + i` and the same
behaviour RNG, so the data do not depend on the number of workers, nor on where
they run: this process, local worker processes or Ray actors (`morca_env.parallel.workers.map_on_envs`;
`executor=RayExecutor(...)`), which send each finished episode back to be written here.
"""

from .build import build_minari_dataset, dataset_card, recover_leftovers
from .collect import collect_dataset, collected_episode, collected_episodes, episode_record, relabel, record_episode
from .recipe import CollectionRecipe, check_dataset_id, make_behavior, minari_root, staging_root
from .replay import episode_options, first_episodes, to_replay_buffer, transition_picker
from .staging import completed_indices, drop_damaged_episodes, episode_path, read_episode, write_episode

__all__ = ["CollectionRecipe", "build_minari_dataset", "check_dataset_id", "collect_dataset", "collected_episode",
           "collected_episodes", "completed_indices", "dataset_card", "drop_damaged_episodes", "episode_options",
           "episode_path", "episode_record", "first_episodes", "make_behavior", "minari_root", "read_episode",
           "recover_leftovers", "relabel", "record_episode", "staging_root", "to_replay_buffer", "transition_picker",
           "write_episode"]


def __getattr__(name: str):
    """`run_episode` was also the evaluation's name for another job: collecting one episode is `record_episode`."""
    if name == "run_episode":
        import warnings

        warnings.warn("morca_env.data.run_episode is now record_episode; the old name goes in the next release",
                      DeprecationWarning, stacklevel=2)
        return record_episode
    raise AttributeError(f"module 'morca_env.data' has no attribute {name!r}")
