"""MORCA's default recipe, "anchored": discrete IQL on the residual of the best fixed schedule, and a critic-gated
switch that leaves that schedule only where validation runs showed a gain.

    state  z'_t = (z_t, b_t)          b_t: the baseline's action in this state (`schedulers.anchored`)
    action a'_t = 1[a_t != b_t]       0: follow the baseline, 1: leave it
    return R'   = PSNR - mean PSNR of the episodes that shared its prompt, seed and K (one of them the baseline)
    act:   leave iff min_i Q_i(z', 1) - min_i Q_i(z', 0) > margin      (margin chosen on validation runs)

Why this form, of the three the literature offers (the MorcaTiny scheduler results have the numbers):
* SPIBB (follow the baseline where a state-action count is low) needs counts, and the state is continuous.
* A residual policy trained with IQL's advantage weighting alone still leaves the baseline wherever its actor
  leans that way, and on MorcaTiny the learnable per-run gain is small against the noise (the headroom page:
  a schedule searched for one noise sample is level with the best fixed schedule on another seed): a plain
  actor has nothing to tell it how sure it must be.
* The critic-gated switch has one knob with a unit, the predicted gain in dB, and margin = inf *is* the baseline,
  bit for bit, with no network call. The margin is chosen on validation pairs among the critic's own quantiles
  and kept only if the paired gain over the baseline has a 95% lower bound above zero; otherwise the scheduler
  is the baseline. So with little data it falls back to the baseline rather than below it, by construction.
The algorithm stays d3rlpy's (our `DiscreteIQL`): the baseline enters the state (b_t) and the target (the
group-relative return, which removes the prompt's and noise sample's PSNR, +-10 dB, from a signal of tenths).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from d3rlpy.dataset import Episode

from morca_env.budget import BudgetSpec
from morca_env.observation import MASK_INDEX, NUM_SCALARS, as_tuple, check_observation_shapes
from morca_env.schedulers.anchored import FollowBaseline, baseline_actions
from morca_env.schedulers.base import feasible, step_index
from morca_env.schedulers.fixed import StaticSchedule

FOLLOW, LEAVE = 0, 1
NEVER = math.inf  # the margin that never leaves the baseline
ANCHOR = "anchor"  # the key of a checkpoint's training record that says it is anchored
GROUP_SIZE = 4  # online rollouts: one baseline episode and three of the scheduler per prompt, seed and K


# ----------------------------------------------------------------- the residual state, action and return
def anchored_arrays(observations: list[np.ndarray], baseline: np.ndarray) -> list[np.ndarray]:
    """Tuple observations (N rows) with the baseline's action appended to the scalars and the mask in residual form
    [follow ok, leave ok]."""
    pooled, temporal, scalars, mask = observations
    baseline = np.asarray(baseline, dtype=np.int64).reshape(-1)
    rows = np.arange(len(baseline))
    scalars = np.concatenate([scalars, baseline[:, None].astype(np.float32)], axis=1)
    residual = np.stack([mask[rows, baseline], mask[rows, 1 - baseline]], axis=1).astype(np.float32)
    return [pooled, temporal, scalars, residual]


def forced_steps_of(episodes: list[Episode]) -> frozenset[int]:
    """The forced steps of recorded episodes: those where no episode's mask ever allowed a reuse (the first, the
    last and an expert switch; on data of a few dozen episodes every free step has allowed one)."""
    masks = np.stack([np.asarray(e.observations[MASK_INDEX])[:, 1] for e in episodes])
    return frozenset(int(t) for t in np.flatnonzero(masks.max(axis=0) < 0.5))


def group_relative(returns, keys) -> np.ndarray:
    """Each return minus the mean return of its group (episodes with the same key: prompt, seed, K)."""
    returns = np.asarray(returns, dtype=np.float64)
    out = np.empty_like(returns)
    groups: dict = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    for members in groups.values():
        out[members] = returns[members] - returns[members].mean()
    return out


def episode_key(meta: dict) -> tuple:
    return meta["prompt"], int(meta["seed"]), int(meta["budget"])


def anchored_episodes(episodes: list[Episode], keys: list[tuple], baseline: StaticSchedule,
                      spec: BudgetSpec | None = None) -> list[Episode]:
    """Recorded episodes (tuple observations, terminal-only reward) in the anchored form: residual state and
    action, and the group-relative return as the terminal reward."""
    if len(episodes) != len(keys):
        raise ValueError(f"{len(episodes)} episodes and {len(keys)} keys")
    if not episodes:
        return []
    steps = {len(e.actions) for e in episodes}
    if len(steps) != 1:
        raise ValueError(f"episodes of different step counts {sorted(steps)} cannot share a baseline")
    spec = spec or BudgetSpec(steps.pop(), forced_steps_of(episodes))
    returns = [float(np.asarray(e.rewards).sum()) for e in episodes]
    relative = group_relative(returns, keys)
    out = []
    for episode, value in zip(episodes, relative):
        actions = np.asarray(episode.actions).reshape(-1).astype(np.int64)
        proposed = baseline_actions(baseline.plan(spec, int(actions.sum())), spec, actions)
        rewards = np.zeros((len(actions), 1), dtype=np.float32)
        rewards[-1, 0] = value
        out.append(Episode(observations=anchored_arrays([np.asarray(x) for x in episode.observations], proposed),
                           actions=(actions != proposed).astype(np.int64).reshape(-1, 1), rewards=rewards,
                           terminated=True))
    return out


def check_led_by(episodes: list[Episode], leaders: list[bool], baseline: StaticSchedule, names=()) -> None:
    """Refuse grouped data that was not collected around `baseline`: each group's leader (`leaders`: its first
    episode) played it action for action, so a leader that leaves it was following another schedule (data collected
    before the best fixed schedule was refitted, or around a user's own). Its labels would be wrong, silently.
    (Only leaders are checked: a group's members may land on different K, seed rounding, so not every (prompt, seed,
    K) subgroup holds a baseline episode.)"""
    strayed = [i for i, (episode, leader) in enumerate(zip(episodes, leaders))
               if leader and np.asarray(episode.actions).any()]
    if strayed:
        raise ValueError(f"{len(strayed)} of {sum(leaders)} group leaders in {', '.join(names) or 'the data'} do not "
                         f"play the baseline ({baseline.source}), e.g. episode {strayed[0]}: the data was collected "
                         "around another schedule. Recollect it, or pass the schedules file it was collected with "
                         "(morca train --baseline PATH)")


def group_leaders(dataset, indices) -> list[bool]:
    """Which of a grouped dataset's episodes `indices` lead their group: every `group_size`-th of the recipe's
    behaviour (`best-fixed-deviations` numbers its episodes in collection order); none for other behaviours."""
    try:
        behavior = json.loads(dataset.storage.metadata.get("morca_recipe") or "{}").get("behavior")
    except (ValueError, AttributeError):
        behavior = None
    if not isinstance(behavior, dict) or behavior.get("name") != "best-fixed-deviations":
        return [False] * len(indices)
    size = int(behavior.get("group_size", 4))
    return [int(j) % size == 0 for j in indices]


def departure_share(episodes: list[Episode]) -> float:
    """The share of anchored episodes' free steps that left the baseline (for logs and notes)."""
    free = sum(int((np.asarray(e.observations[MASK_INDEX]).min(axis=1) > 0.5).sum()) for e in episodes)
    return sum(int(np.asarray(e.actions).sum()) for e in episodes) / max(free, 1)


# ----------------------------------------------------------------- the scheduler
@dataclass
class EpisodeRecord:
    """What one anchored episode did: the steps where it left the baseline, the steps where it could (both actions
    feasible), and the critic's gain at each of those it read."""

    departures: list[int] = field(default_factory=list)
    free_steps: int = 0
    gains: list[float] = field(default_factory=list)


class AnchoredPolicy:
    """The best fixed schedule, left where the critic predicts a gain above `margin` dB (see the module docstring).

    `deterministic=False` samples leave/follow from the actor instead (online rollouts). Actions are always
    feasible. `record` holds the last episode's departures and gains; `gains_only=True` plays the baseline while
    recording the critic's gain at every free step (what margin selection reads).
    """

    learned = True

    def __init__(self, algo, baseline: StaticSchedule, margin: float = NEVER, deterministic: bool = True,
                 gains_only: bool = False):
        if not margin >= 0:
            raise ValueError(f"margin={margin!r} must be >= 0 dB (inf: never leave the baseline)")
        impl = getattr(algo, "impl", None)
        if impl is None:
            raise ValueError(f"{type(algo).__name__} has no networks yet: fit it (or load a checkpoint) first")
        shape = impl.observation_shape
        if not isinstance(shape[0], (list, tuple)) or shape[2][0] != NUM_SCALARS + 1:
            raise ValueError(f"an anchored scheduler needs a network trained on the anchored state ({NUM_SCALARS} + 1 "
                             f"scalars, tuple form); this one reads {shape!r}")
        self.algo, self.baseline, self.margin = algo, baseline, float(margin)
        self.deterministic, self.gains_only = deterministic, gains_only
        factory = getattr(algo.config, "actor_encoder_factory", None)
        self.reads_latents = bool(getattr(factory, "features", "p3"))
        self._device = getattr(impl, "device", "cpu")
        self._record, self._budget, self._plays_baseline = EpisodeRecord(), None, False

    def reset(self, obs, info) -> None:
        self.follow = FollowBaseline(self.baseline)
        self.follow.reset(obs, info)
        self._record, self._budget = EpisodeRecord(), int(info["budget"])
        # margin "never", deterministic: the baseline itself, acting through its own lookup (see __call__)
        self._plays_baseline = self.margin == NEVER and self.deterministic and not self.gains_only
        self._schedule, self._num_steps = self.baseline.schedule, self.baseline.num_steps
        if not self._plays_baseline:  # the baseline itself reads no network, so it needs no latent features
            if self.reads_latents and not np.any(obs["pooled"]):
                raise ValueError("this scheduler reads latent features (pooled/temporal) but the observation has "
                                 "none: the env was made with latent_features=False; use latent_features=True")
            check_observation_shapes(self.algo.impl.observation_shape, obs, getattr(self, "source", "this scheduler"),
                                     extra_scalars=1, reads_latents=self.reads_latents)

    @property
    def record(self) -> EpisodeRecord:
        """The last episode's departures, free steps and gains. Playing the baseline, its free steps are counted
        from the baseline's schedule when read, not at each step: what a step costs is charged in K."""
        if self._plays_baseline and self._budget is not None:
            self._record.free_steps = self.baseline.spec.choices_along(self.baseline.schedule, self._budget)
        return self._record

    def _inputs(self, obs, proposed: int) -> list:
        # every part, latent features too (zeros in a lean env): d3rlpy's Q ensemble reads the batch size off the first
        parts = anchored_arrays([x[None] for x in as_tuple(obs)], np.array([proposed]))
        return [torch.from_numpy(np.ascontiguousarray(x)).to(self._device) for x in parts]

    @torch.no_grad()
    def gain(self, obs, proposed: int) -> float:
        """The critic's predicted gain (dB) of leaving the baseline here: min-Q(leave) - min-Q(follow)."""
        q = self.algo.impl.q_values(self._inputs(obs, proposed))[0]
        return float(q[LEAVE] - q[FOLLOW])

    def __call__(self, obs) -> int:
        # no torch.no_grad() around this call: entering it costs ~10 us a step right after a transformer call, which
        # at margin "never" (no network call) was a third of what the evaluation charges in K (33 us a step)
        if self._plays_baseline:
            # the baseline itself, at the baseline's cost: its lookup inlined (the re-planning below is for
            # departures; free steps are counted when the record is read). At equal measured speedup every
            # step's microseconds count in K (benchmarks/bench_step_cost.py, median of 5: calling the baseline
            # and counting here cost 18.0 us a step against its 15.3; inlined, 17.3 against 17.1)
            return feasible(self._schedule[step_index(obs, self._num_steps)], obs)
        mask = obs["action_mask"]
        proposed = self.follow.baseline_action(obs)
        if not (mask[0] and mask[1]):
            return feasible(proposed, obs)
        self._record.free_steps += 1
        if self.deterministic:
            gain = self.gain(obs, proposed)
            self._record.gains.append(gain)
            leave = gain > self.margin and not self.gains_only
        else:
            with torch.no_grad():
                logits = self.algo.impl.policy(self._inputs(obs, proposed))[0]
            leave = int(torch.distributions.Categorical(logits=logits).sample()) == LEAVE
        if leave:
            self._record.departures.append(self.follow.step)
        return feasible(1 - proposed if leave else proposed, obs)


def baseline_record(baseline: StaticSchedule) -> dict:
    """The baseline as a checkpoint stores it: every fitted K's schedule and where they came from."""
    return {"schedules": {str(k): v for k, v in sorted(baseline.schedules.items())}, "source": baseline.source}


def baseline_of(record: dict) -> StaticSchedule:
    return StaticSchedule({int(k): v for k, v in record["schedules"].items()}, record.get("source", "checkpoint"))


def anchor_of(path) -> dict | None:
    """The anchored record of a safe checkpoint's header (None for a plain MORCA checkpoint)."""
    from .checkpoint import CheckpointError, is_safe_format, read_header

    if not Path(path).is_file() or not is_safe_format(path):
        return None  # a missing file or a legacy pickle: the plain loader says what is wrong with it
    try:
        training = json.loads(read_header(path).get("training") or "null")
    except (CheckpointError, ValueError):
        return None  # a damaged file: the plain loader verifies its checksum and names the damage
    return training.get(ANCHOR) if isinstance(training, dict) else None


def load_anchored(path, margin: float | None = None, device: str = "cpu", deterministic: bool = True,
                  trusted: bool = False) -> AnchoredPolicy:
    """An anchored checkpoint as a scheduler: its own margin (chosen on validation) unless `margin` is given.
    (`trusted` is accepted for the loaders' common signature: anchored checkpoints are always safetensors.)"""
    from .checkpoint import load_learnable

    anchor = anchor_of(path)
    if anchor is None:
        raise ValueError(f"checkpoint {path} is not anchored (its training record has no {ANCHOR!r}): load it with "
                         "MorcaPolicy.load")
    chosen, baseline = _checked_record(path, anchor)
    margin = (NEVER if chosen is None else chosen) if margin is None else float(margin)
    # another step count is refused by the baseline's plan, naming both (StaticSchedule.plan)
    policy = AnchoredPolicy(load_learnable(path, device=device), baseline, margin, deterministic)
    policy.source = f"checkpoint {path}"
    return policy


def _checked_record(path, anchor) -> tuple[float | None, StaticSchedule]:
    """(margin, baseline) of an anchored record, or an error naming the file and the field: a header is data that
    anyone can edit, and a crafted one must not reach the scheduler as a raw `KeyError` or a NaN margin."""
    from .checkpoint import CheckpointError

    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {path}: its anchored record {what}; train or anchor it again")

    if not isinstance(anchor, dict):
        raise bad(f"is a {type(anchor).__name__}, expected an object with 'baseline' and 'margin'")
    chosen = anchor.get("margin")
    if chosen is not None and (isinstance(chosen, bool) or not isinstance(chosen, (int, float))
                               or not np.isfinite(chosen) or chosen < 0):
        raise bad(f"has margin={chosen!r}; valid: a finite number of dB >= 0, or null (always the baseline)")
    record = anchor.get("baseline")
    schedules = record.get("schedules") if isinstance(record, dict) else None
    if not isinstance(schedules, dict) or not schedules:
        raise bad("has no baseline schedules (expected 'baseline': {'schedules': {K: [0/1 per step]}})")
    try:
        baseline = baseline_of(record)
    except (TypeError, ValueError, AttributeError) as error:
        raise bad(f"has a malformed baseline: {error}") from None
    return (None if chosen is None else float(chosen)), baseline


def with_margin(path, out, margin: float, selection: dict, baseline: StaticSchedule | None = None) -> Path:
    """A copy of anchored checkpoint `path` at `out` whose record holds the chosen margin and how it was chosen: a
    scheduler to play (or ship), so without optimizer state. `baseline` re-anchors it to other fixed schedules (the
    margin must then have been chosen around them); the one it was trained around stays in the record."""
    from .checkpoint import load_learnable, read_header, save_learnable

    training = json.loads(read_header(path)["training"])
    anchor = {**training[ANCHOR], "margin": None if margin == NEVER else float(margin), "selection": selection}
    if baseline is not None and baseline_record(baseline) != anchor["baseline"]:
        anchor["trained_around"] = anchor.get("trained_around", anchor["baseline"])
        anchor["baseline"] = baseline_record(baseline)
    training[ANCHOR] = anchor
    return save_learnable(load_learnable(path), out, training, optimizers=False)


# ----------------------------------------------------------------- choosing the margin on validation runs
LEAVE_RATES = (0.2, 0.1, 0.05, 0.02, 0.01)  # candidate margins: the critic's gains these shares of free steps exceed
PSNR_CAP = 100.0


def paired_interval(diffs) -> tuple[float, float]:
    """Mean and 95% half-width (Student t) of paired differences; (0, 0) for a single or constant sample."""
    from scipy import stats

    diffs = np.asarray(diffs, dtype=np.float64)
    if len(diffs) < 2 or not diffs.std():
        return float(diffs.mean()) if len(diffs) else 0.0, 0.0
    return float(diffs.mean()), float(stats.t.ppf(0.975, len(diffs) - 1) * diffs.std(ddof=1) / np.sqrt(len(diffs)))


def play(env, policies: list, options: list[dict], progress: str | None = None) -> list:
    """Each policy's episode (PSNR capped as in evaluation); one policy object per episode (they keep its state)."""
    from morca_env.rollout import rollout_many

    trajectories = rollout_many(env, policies, options, progress=progress)
    return [min(float(t.info["psnr"]), PSNR_CAP) for t in trajectories]


def choose_margin(env, algo, baseline: StaticSchedule, options: list[dict], rates=LEAVE_RATES,
                  progress: bool = True) -> tuple[float, dict]:
    """The margin for `algo`'s anchored scheduler, chosen on validation episodes `options` ({"prompt", "seed",
    "speedup"} each): the candidate with the highest mean paired gain over the baseline among those whose 95% lower
    bound is above 0, else `NEVER` (the baseline). -> (margin, a record of every candidate for the checkpoint).

    The baseline is played once with the critic reading each free step; a candidate margin is then played only on
    the episodes where some gain along the baseline's own run exceeds it (elsewhere it never leaves, and its run
    is the baseline's: gain 0 without playing)."""
    label = (lambda text: text) if progress else (lambda text: None)
    scouts = [AnchoredPolicy(algo, baseline, gains_only=True) for _ in options]
    base = np.array(play(env, scouts, options, label("margin: baseline and critic")))
    gains = [np.asarray(s.record.gains) for s in scouts]
    pooled = np.concatenate(gains) if gains else np.zeros(0)
    candidates = sorted({round(max(0.0, float(np.quantile(pooled, 1 - r))), 4) for r in rates} if len(pooled) else set())
    rows = []
    for margin in candidates:
        active = [i for i, g in enumerate(gains) if len(g) and g.max() > margin]
        psnr = base.copy()
        steps = np.zeros(len(options))
        if active:
            policies = [AnchoredPolicy(algo, baseline, margin) for _ in active]
            played = play(env, policies, [options[i] for i in active], label(f"margin {margin:.3f} dB"))
            for i, value, policy in zip(active, played, policies):
                psnr[i], steps[i] = value, len(policy.record.departures)
        mean, half = paired_interval(psnr - base)
        free = sum(len(g) for g in gains)
        rows.append({"margin": margin, "gain_db": mean, "ci95_db": half, "runs_leaving": float((steps > 0).mean()),
                     "steps_leaving": float(steps.sum() / max(free, 1)), "episodes_played": len(active)})
    safe = [r for r in rows if r["gain_db"] - r["ci95_db"] > 0]
    best = max(safe, key=lambda r: r["gain_db"]) if safe else None
    chosen = NEVER if best is None else best["margin"]
    record = {"episodes": len(options), "baseline_psnr": float(base.mean()) if len(base) else None,
              "candidates": rows, "chosen": None if chosen == NEVER else chosen,
              "rule": "highest mean paired gain over the baseline whose 95% lower bound is above 0; else never leave"}
    return chosen, record


# ----------------------------------------------------------------- buffers from datasets
def model_of_dataset(dataset) -> str:
    """The model preset a Minari dataset was collected on (its env id's), for the baseline fitted to it."""
    from morca_env.models.presets import PRESETS

    env_id = dataset.spec.env_spec.id if dataset.spec.env_spec is not None else None
    for preset in PRESETS.values():
        if preset.env_id == env_id:
            return preset.name
    raise ValueError(f"dataset {dataset.spec.dataset_id!r} was collected on {env_id!r}, not a MORCA env id; "
                     "the anchored recipe needs the best fixed schedule of its model")


def anchored_buffer(datasets: list, buffer, episode_indices=None, n_step: int = 1,
                    baseline: StaticSchedule | None = None):
    """`buffer` (`to_replay_buffer(datasets, "tuple", episode_indices)`) in the anchored form -> (buffer, the
    checkpoint's anchor record). The baseline is the first dataset's model's best fixed schedule unless given."""
    from morca_env.data import episode_options

    from .training import make_buffer

    metas, leaders = [], []
    for i, dataset in enumerate(datasets):
        every = episode_options(dataset)
        indices = list(episode_indices if i == 0 and episode_indices is not None else range(len(every)))
        metas += [every[j] for j in indices]
        leaders += group_leaders(dataset, indices)
    if len(metas) != len(buffer.episodes):
        raise ValueError(f"{len(metas)} episode records for {len(buffer.episodes)} episodes")
    for meta, episode in zip(metas, buffer.episodes):
        if int(meta["budget"]) != int(np.asarray(episode.actions).sum()):
            raise ValueError(f"episode records out of order: K={meta['budget']} recorded, "
                             f"{int(np.asarray(episode.actions).sum())} reuses played")
    keys = [episode_key(m) for m in metas]
    if max(keys.count(k) for k in set(keys)) < 2:
        raise ValueError("the anchored recipe learns from groups of episodes that share a prompt, seed and K (the "
                         "behaviour 'best-fixed-deviations', e.g. the dataset morca/tiny/anchored-v2); these "
                         f"datasets ({', '.join(d.spec.dataset_id for d in datasets)}) have none: collect such data "
                         "or train with --recipe paper")
    baseline = baseline or StaticSchedule.packaged(model_of_dataset(datasets[0]))
    episodes = anchored_episodes(list(buffer.episodes), keys, baseline)
    check_led_by(episodes, leaders, baseline, [d.spec.dataset_id for d in datasets])
    anchor = {"baseline": baseline_record(baseline), "margin": None, "data_departures": departure_share(episodes)}
    return make_buffer(episodes, n_step), anchor
