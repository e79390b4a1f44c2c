"""Reading datasets back: the options that replay their episodes, and Minari -> d3rlpy replay buffers."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..observation import TRACK_KEYS, as_flat, as_tuple, check_observation
from ..utils.quiet import quiet_d3rlpy

from . import integrity



def episode_options(dataset) -> list[dict]:
    """Per-episode metadata recorded at collection (prompt, seed, budget, psnr, ...)."""
    import h5py

    out = []
    path = Path(dataset.storage.data_path) / "main_data.hdf5"
    with h5py.File(path, "r") as f:
        for key in sorted(f.keys(), key=lambda k: int(k.split("_")[1])):
            attrs = f[key].attrs
            out.append({k.split("/", 1)[1]: (v.item() if hasattr(v, "item") else v)
                        for k, v in attrs.items() if k.startswith("options/")})
    return out


flatten_observation = as_flat  # kept names; the layout lives in morca_env.observation
tuple_observation = as_tuple


def first_episodes(dataset, count: int | None) -> list[int] | None:
    """Indices of a Minari dataset's first `count` episodes (None: all), for training on a prefix."""
    if count is None:
        return None
    if not 1 <= count <= dataset.total_episodes:
        raise ValueError(f"episodes={count} is outside [1, {dataset.total_episodes}] for {dataset.spec.dataset_id}")
    return list(range(count))


def transition_picker(n_step: int = 1):
    """d3rlpy's picker for `n_step`-step returns (gamma = 1): with the terminal-only PSNR reward,
    one-step TD needs ~N hops of slow target updates to carry the reward back to the first step;
    n_step = N makes every target the episode's own return (Monte-Carlo), which converges in a
    CPU-sized number of updates."""
    quiet_d3rlpy("transition_picker (d3rlpy's n-step picker)")
    from d3rlpy.dataset import BasicTransitionPicker, MultiStepTransitionPicker

    if isinstance(n_step, bool) or not isinstance(n_step, int) or n_step < 1:
        raise ValueError(f"n_step={n_step!r} must be an integer >= 1 (1: one-step TD as in the paper)")
    return BasicTransitionPicker() if n_step == 1 else MultiStepTransitionPicker(n_steps=n_step, gamma=1.0)


def to_replay_buffer(dataset, observation: str = "flat", episode_indices=None, n_step: int = 1,
                     track: str | None = None):
    """A d3rlpy `ReplayBuffer` from a MORCA Minari dataset, or from several (a list: their episodes in order;
    `episode_indices` then applies to the first only, e.g. a prefix of a mixture plus all of a searched dataset).

    Each episode of N steps gives N transitions: observations[0..N-1] with the
    action taken there; the final (terminal) observation is the next observation
    of the last transition, which is `terminated`. `observation="flat"` (the
    default) concatenates the parts in the flat layout's order (`morca_env.observation.FLAT_KEYS`; row t equals
    `gymnasium.spaces.flatten(env.observation_space, obs_t)`, so `FlattenObservation`
    feeds a policy trained on it), which every d3rlpy algorithm's default encoder takes; `"tuple"` keeps the four
    arrays, which our `agents.DiscreteIQL` (`agents.networks`) asks for. A scalars-track dataset flattens to
    [action_mask, scalars] (9 values) and has no tuple form; a flat dataset is taken as it is stored.
    `track="scalars"` reads a full-track dataset as the scalars track (its mask and scalars, 9 values flat), so
    one dataset serves both observation tracks. `n_step > 1` samples n-step returns (`transition_picker`).
    """
    quiet_d3rlpy("to_replay_buffer (a d3rlpy ReplayBuffer)")
    from d3rlpy.constants import ActionSpace
    from d3rlpy.dataset import Episode, InfiniteBuffer, ReplayBuffer

    if observation not in ("tuple", "flat"):
        raise ValueError(f"observation={observation!r}; valid: 'tuple', 'flat'")
    if track is not None:
        check_observation(track)
        if track == "scalars" and observation == "tuple":
            raise ValueError("track='scalars' has no tuple form (no latent features): use observation='flat'")
    convert = tuple_observation if observation == "tuple" else flatten_observation
    datasets = list(dataset) if isinstance(dataset, (list, tuple)) else [dataset]
    if not datasets:
        raise ValueError("to_replay_buffer needs at least one dataset")
    datasets = [integrity.load_dataset(d) if isinstance(d, str) else d for d in datasets]  # ids are fine too
    for d in datasets:
        if not hasattr(d, "iterate_episodes"):
            raise TypeError(f"dataset={d!r}: give a minari.MinariDataset, a dataset id, or a list of them")
    if episode_indices is not None:
        indices = [int(i) for i in episode_indices]
        total = datasets[0].total_episodes
        bad = [i for i in indices if not 0 <= i < total]
        if bad or len(set(indices)) != len(indices):
            raise ValueError(f"episode_indices: {bad or sorted({i for i in indices if indices.count(i) > 1})} "
                             f"{'out of range' if bad else 'repeated'}; valid: distinct indices in [0, {total - 1}] "
                             f"of {datasets[0].spec.dataset_id!r}")
        episode_indices = indices
    steps = {d.spec.dataset_id: len(next(iter(d.iterate_episodes([0]))).actions) for d in datasets if d.total_episodes}
    if len(set(steps.values())) > 1:
        raise ValueError(f"datasets of different step counts cannot share a buffer (the state's t, u_t and K are "
                         f"fractions of N): {steps}")
    episodes = []
    for ep in (e for i, d in enumerate(datasets)
               for e in integrity.iterate_checked(d, episode_indices if i == 0 else None)):
        stored_flat = not isinstance(ep.observations, dict)
        obs = {"flat": np.asarray(ep.observations)} if stored_flat else {k: np.asarray(v)
                                                                         for k, v in ep.observations.items()}
        n = len(ep.actions)
        if any(len(v) != n + 1 for v in obs.values()):
            raise ValueError(f"episode {ep.id}: expected {n + 1} observations for {n} actions")
        if not ep.terminations[-1]:
            raise ValueError(f"episode {ep.id} does not end in a terminal step")
        if observation == "tuple" and (stored_flat or "pooled" not in obs):
            raise ValueError(f"observation='tuple' needs the full track's Dict observations; "
                             f"episode {ep.id} holds {'flat vectors' if stored_flat else 'the scalars track'}: "
                             "use observation='flat'")
        if track is not None and not stored_flat:
            missing = set(TRACK_KEYS[track]) - set(obs)
            if missing:
                raise ValueError(f"track={track!r} needs {sorted(missing)}, which episode {ep.id} does not hold "
                                 "(a scalars-track dataset has no latent features)")
            obs = {k: obs[k] for k in TRACK_KEYS[track]}
        converted = (obs["flat"][:n].astype(np.float32) if stored_flat else
                     convert({k: v[:n] for k, v in obs.items()}))
        episodes.append(Episode(observations=converted, actions=np.asarray(ep.actions, dtype=np.int64).reshape(n, 1),
                                rewards=np.asarray(ep.rewards, dtype=np.float32).reshape(n, 1), terminated=True))
    return ReplayBuffer(InfiniteBuffer(), episodes=episodes, action_space=ActionSpace.DISCRETE, action_size=2,
                        transition_picker=transition_picker(n_step))
