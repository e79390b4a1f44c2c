"""MorcaVectorEnv: N MorcaEnv episodes in lockstep, one batched transformer call per CFG branch and step."""

from __future__ import annotations

import time
from typing import Any, Sequence

import gymnasium as gym
import numpy as np
import torch
from gymnasium.utils import seeding
from gymnasium.vector.utils import batch_space

from .diffusion.denoiser import check_batch_memory
from .env import MorcaEnv, episode_info
from .diffusion.metrics import to_uint8
from .observation import BatchObservationBuilder, present
from .diffusion.reference_videos import reference_key
from .diffusion.signals import signal_input_for_step

try:  # gymnasium >= 1.1 names the modes; 1.0 vector envs all autoreset on the next step
    from gymnasium.vector import AutoresetMode
except ImportError:  # pragma: no cover - gymnasium 1.0
    AutoresetMode = None

AUTORESET_MODES = ("next_step", "same_step", "disabled")
# constructor arguments a sub-env cannot set apart: its episodes run through one batch, step by step
_SHARED_SETTINGS = ("num_inference_steps", "height", "width", "num_frames", "guidance_scale", "guidance_scale_2",
                    "negative_prompt", "model", "pipeline", "device", "dtype")


def _mode(value) -> str:
    """One of AUTORESET_MODES from ours, gymnasium's `AutoresetMode` or its values ("NextStep", ...)."""
    name = getattr(value, "name", value)
    key = name.replace("_", "").lower() if isinstance(name, str) else None
    found = {mode.replace("_", ""): mode for mode in AUTORESET_MODES}.get(key)
    if found is None:
        raise ValueError(f"autoreset_mode={value!r}; valid: {', '.join(AUTORESET_MODES)}")
    return found


class MorcaVectorEnv(gym.vector.VectorEnv):
    """N episodes of a MorcaEnv, denoised together: every step is one transformer call per CFG branch for the batch.

    ## Description

    Sub-env i plays the episode a `MorcaEnv` with the same arguments would play, each with its own prompt,
    generation seed, budget K and reference video. Every episode of an env has the same number of steps, so the
    sub-envs run in lockstep: at each step the samples that recompute go through the transformer blocks as one
    sub-batch and the samples that reuse add their own cached residual (`ResidualCache.decide`). Observations,
    masks and rewards are the single env's, batched along a first axis.

    ## Seeds

    `reset(seed=s)` resets sub-env i with seed s + i (gymnasium's convention): it then plays exactly the episode of
    `MorcaEnv.reset(seed=s + i)` with the same options, up to float32 rounding: the batched transformer, SEA
    filter and reductions sum in another order, so latents differ by ~1e-6, which flips a few uint8 levels of a
    video: rewards differ by < 0.01 dB (measured at most 1.3e-3 dB; its tests check it).

    ## Options

    `reset(options=...)` takes the single env's keys (prompt, seed, speedup, budget, scheduler_cost_s) either as
    one dict whose values are shared (a scalar) or per sub-env (a list, tuple or array of length N), or as a list
    of N dicts. gymnasium's `reset_mask` is accepted when it resets every sub-env.

    ## Autoreset

    `autoreset_mode`: "next_step" (the default, gymnasium's): the step after the one that ended the episodes
    resets them all, ignores its actions and returns the new first observations with reward 0; "same_step": the
    ending step returns the new first observations, the last ones in `info["final_obs"]` and their infos in
    `info["final_info"]`; "disabled": `reset()` must be called. All sub-envs end on the same step.

    ## Timing

    Latencies are the batch's: `latency_s` is the batch's wall time for its episodes divided by N, and
    `reference_latency_s` the same for a stock (no-reuse) batch of N timed once per env, so `speedup` is the
    batch's own.

    ## Arguments

    ```python
    envs = gym.make_vec("MorcaTiny-v0", num_envs=8, speedup=3.0)   # vectorization_mode="vector_entry_point"
    ```

    `num_envs` (>= 1), `autoreset_mode`, and every `MorcaEnv` argument (shared by all sub-envs). Run-time rules
    that read the live run (`run_view`: TeaCache-style probes, FirstBlockCache, ...) need the single env.
    """

    metadata = {"render_modes": [], "autoreset_mode": AutoresetMode.NEXT_STEP if AutoresetMode else "next_step"}

    def __init__(self, num_envs: int = 1, model: str = "tiny", *, autoreset_mode: Any = "next_step",
                 **env_kwargs):
        self.closed = True  # until built: gymnasium's __del__ closes what is not closed
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
            raise ValueError(f"num_envs={num_envs!r} must be an integer >= 1")
        self.autoreset_mode = _mode(autoreset_mode)
        for key in _SHARED_SETTINGS:
            value = env_kwargs.get(key)
            if isinstance(value, (list, tuple, np.ndarray)):
                raise ValueError(f"{key}={value!r}: every sub-env of a MorcaVectorEnv runs the same {key} (their "
                                 "episodes run in lockstep); pass one value, or one vector env per setting. What "
                                 "may differ per sub-env goes in reset options: prompt, seed, speedup, budget")
        if env_kwargs.pop("render_mode", None) is not None:
            raise ValueError("render_mode: a MorcaVectorEnv does not render; valid: None (render a single MorcaEnv, "
                             "or read info['schedule'] and the videos of `accelerate`)")
        self.num_envs = int(num_envs)
        self.env = MorcaEnv(model, **env_kwargs)  # the settings, checks, references and scoring of every sub-env
        try:
            self._setup()
        except BaseException:
            self.env.close()
            raise

    def _setup(self) -> None:
        env = self.env
        self.metadata = {**type(self).metadata, "autoreset_mode": (AutoresetMode[self.autoreset_mode.upper()]
                                                                   if AutoresetMode else self.autoreset_mode)}
        self.denoiser = env.side_run()
        check_batch_memory(self.denoiser, self.num_envs)  # before the batched spaces, which grow with num_envs too
        self.single_observation_space = env.observation_space
        self.single_action_space = env.action_space
        self.observation_space = batch_space(env.observation_space, self.num_envs)
        self.action_space = batch_space(env.action_space, self.num_envs)
        self.num_steps, self.budget_spec = env.num_steps, env.budget_spec
        self.observer = BatchObservationBuilder(env.budget_spec, env.signal_kind, latent_features=env.latent_features,
                                                feature_dtype=env.feature_dtype, mask_dtype=env.mask_dtype)
        self._rngs: list[np.random.Generator | None] = [None] * self.num_envs
        self._stock_latency_s: float | None = None
        self._starts: list = []
        self._state = "idle"  # idle (no reset yet) | running | ended (autoreset or reset due)
        self.closed = False

    # ----------------------------------------------------------------- reset
    def reset(self, *, seed: int | Sequence[int | None] | None = None, options: dict | Sequence[dict] | None = None):
        """Start N new episodes (see the class docstring for `seed` and `options`)."""
        seeds = self._sub_seeds(seed)
        per_env = self._sub_options(options)
        for i, sub_seed in enumerate(seeds):
            if sub_seed is not None or self._rngs[i] is None:
                self._rngs[i], _ = seeding.np_random(sub_seed)
        return self._start([self.env.plan_episode(rng, o) for rng, o in zip(self._rngs, per_env)])

    def _sub_seeds(self, seed) -> list[int | None]:
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, (int, np.integer)) and not isinstance(seed, (bool, np.bool_)):
            return [int(seed) + i for i in range(self.num_envs)]
        if isinstance(seed, (list, tuple, np.ndarray)) and len(seed) == self.num_envs:
            return [None if s is None else int(s) for s in seed]
        raise ValueError(f"seed={seed!r}; valid: None, an integer (sub-env i gets seed + i) or a list of "
                         f"{self.num_envs} seeds")

    def _sub_options(self, options) -> list[dict | None]:
        n = self.num_envs
        if options is None:
            return [None] * n
        if isinstance(options, (list, tuple)):
            if len(options) != n:
                raise ValueError(f"options is a list of {len(options)} dicts for {n} sub-envs; valid: one dict "
                                 f"per sub-env ({n}), or one dict for all")
            return list(options)
        if not isinstance(options, dict):
            raise TypeError(f"options={options!r} must be a dict, a list of {n} dicts, or None")
        options = dict(options)
        mask = options.pop("reset_mask", None)
        if mask is not None and not (np.shape(mask) == (n,) and np.all(mask)):
            raise ValueError(f"options['reset_mask']={mask!r}: the sub-envs of a MorcaVectorEnv run in lockstep and "
                             f"reset together; valid: None or {n} True values")
        per_env = [{} for _ in range(n)]
        for key, value in options.items():
            if isinstance(value, (list, tuple, np.ndarray)):
                if len(value) != n:
                    raise ValueError(f"options[{key!r}] has {len(value)} values for {n} sub-envs; valid: one value "
                                     f"for all, or exactly {n}")
                for entry, item in zip(per_env, value):
                    entry[key] = item.item() if isinstance(item, np.generic) else item
            else:
                for entry in per_env:
                    entry[key] = value
        return per_env

    def _start(self, starts: list):
        self._state = "idle"  # until this reset succeeds
        generated = self._ensure_references(starts)
        if self._stock_latency_s is None:
            runs = 1 if any(generated) else 2  # as MorcaEnv: without fresh references the model is still cold
            self._stock_latency_s = min(self._timed_stock_batch(starts) for _ in range(runs))
        self._starts = starts
        self.denoiser.start_batch([s.prompt for s in starts], [s.seed for s in starts])
        self.observer.reset([s.budget for s in starts], self.env.enforce_budget)
        self._schedules = [[] for _ in starts]
        self._projected = np.zeros(self.num_envs, dtype=np.int64)
        self._overhead_s = 0.0
        self._state = "running"
        obs = self._observe()
        infos: dict = {}
        for i in range(self.num_envs):
            infos = self._add_info(infos, self._sub_info(i, reference_generated=bool(generated[i])), i)
        return obs, infos

    def _ensure_references(self, starts) -> list[bool]:
        """Every sub-env's reference video, loaded, or generated in one stock batch of the missing ones (each
        (prompt, seed) once); -> which sub-envs' references this call generated."""
        references = self.env.references
        fields = [self.env.reference_fields(s.prompt, s.seed) for s in starts]
        keys = [reference_key(f) for f in fields]
        videos: dict[str, torch.Tensor | None] = {}
        for key, entry in zip(keys, fields):
            if key not in videos:
                found = references.load(entry)
                videos[key] = None if found is None else found.video
        missing = [keys.index(key) for key, video in videos.items() if video is None]  # first sub-env of each
        if missing:
            made = self._stock_videos([starts[i] for i in missing])
            for i, video in zip(missing, made):
                references.generated += 1
                try:
                    references.store(fields[i], video, self.denoiser.elapsed_s / len(missing))
                except OSError:  # read-only or full disk (MorcaEnv warned at construction): used for this reset only
                    pass
                videos[keys[i]] = video
        self._references = [videos[key] for key in keys]
        return [i in missing for i in range(len(starts))]

    def _stock_videos(self, starts) -> list[torch.Tensor]:
        self.denoiser.start_batch([s.prompt for s in starts], [s.seed for s in starts])
        while not self.denoiser.done:
            self.denoiser.step(reuse=False)
        return [to_uint8(video) for video in self.denoiser.decode_batch()]

    def _timed_stock_batch(self, starts) -> float:
        """Seconds per video of a stock batch of N (this env's own batch size), timed in this process."""
        self._stock_videos(starts)
        return self.denoiser.elapsed_s / self.num_envs

    # ----------------------------------------------------------------- step
    def _observe(self) -> dict[str, np.ndarray]:
        t0 = time.perf_counter()
        den, i = self.denoiser, self.denoiser.step_index
        model_s = den.elapsed_s
        if den.done:
            obs = self.observer.observe(None, den.latents)
        else:
            obs = self.observer.observe(i, den.latents, signal_input_for_step(self.env.signal_kind, den), den.sigma(i),
                                        den.cache_valid(i))
        self._overhead_s += time.perf_counter() - t0 - (den.elapsed_s - model_s)
        return present(obs, self.env.observation, self.env.flat, batched=True)

    def action_masks(self) -> np.ndarray:
        """The current feasible-action masks, (N, 2) booleans (sb3-contrib's MaskablePPO convention)."""
        return self.observer.mask.astype(bool)

    def _parse_actions(self, actions) -> np.ndarray:
        values = np.asarray(actions)
        if values.shape != (self.num_envs,) or values.dtype.kind not in "iu" or not np.isin(values, (0, 1)).all():
            raise ValueError(f"actions={actions!r} is invalid; valid: {self.num_envs} integers, each 0 (recompute) "
                             "or 1 (reuse)")
        return values.astype(np.int64)

    def step(self, actions):
        if self._state == "ended":
            if self.autoreset_mode == "next_step":
                obs, infos = self._start([self.env.plan_episode(rng, None) for rng in self._rngs])
                zeros = np.zeros(self.num_envs, dtype=bool)
                return obs, np.zeros(self.num_envs), zeros, zeros.copy(), infos
            raise RuntimeError(f"step() called after the episodes ended ({self.num_steps} of {self.num_steps} steps "
                               "done) with autoreset_mode='disabled'; call reset() to start new episodes")
        if self._state != "running":
            raise RuntimeError("step() called without running episodes (no reset() yet, or the last one failed); "
                               "call reset() first")
        requested = self._parse_actions(actions)
        den, i = self.denoiser, self.denoiser.step_index
        executed, projected = self.observer.project(requested, i, den.cache_valid(i))
        self.observer.record(i, executed)
        den.step(reuse=executed.astype(bool).tolist())
        for schedule, action in zip(self._schedules, executed):
            schedule.append(int(action))
        self._projected += projected
        rewards = np.zeros(self.num_envs)
        finals: list[dict | None] = [None] * self.num_envs
        ended = den.done
        if ended:
            latency = (den.elapsed_s + self._overhead_s) / self.num_envs
            for n, video in enumerate(den.decode_batch()):
                final = self.env.score_video(to_uint8(video), self._references[n])
                rewards[n] = self.env.terminal_reward(final["psnr"])
                final.update(latency_s=latency, speedup=self._stock_latency_s / latency,
                             overhead_s=self._overhead_s / self.num_envs)
                finals[n] = final
            self._state = "ended"
        obs = self._observe()
        infos: dict = {}
        for n in range(self.num_envs):
            infos = self._add_info(infos, self._sub_info(n, i, int(executed[n]), int(requested[n]),
                                                         bool(projected[n]), finals[n]), n)
        terminated = np.full(self.num_envs, ended)
        if ended and self.autoreset_mode == "same_step":
            final_obs = [obs[n] if self.env.flat else {k: v[n] for k, v in obs.items()} for n in range(self.num_envs)]
            final_infos = [sub_env_info(infos, n) for n in range(self.num_envs)]  # plain values, as MorcaEnv's
            obs, infos = self._start([self.env.plan_episode(rng, None) for rng in self._rngs])
            for n in range(self.num_envs):
                infos = self._add_info(infos, {"final_obs": final_obs[n], "final_info": final_infos[n]}, n)
        return obs, rewards, terminated, np.zeros(self.num_envs, dtype=bool), infos

    def _sub_info(self, n: int, step: int = -1, action: int = -1, requested: int = -1, projected: bool = False,
                  final: dict | None = None, reference_generated: bool = False) -> dict:
        return episode_info(self._starts[n], self.budget_spec, self._schedules[n], int(self.observer.used[n]),
                            int(self._projected[n]), self._stock_latency_s, self.env.scores_lpips, step, action,
                            requested, projected, final, reference_generated)

    def close(self, **kwargs):
        if self.closed:
            return
        self.closed = True
        self.denoiser.close()
        self.env.close()


def final_observation(infos: dict, n: int) -> dict:
    """Sub-env n's last observation out of a `same_step` autoreset's infos, in either of gymnasium's layouts (1.0:
    a dict of batched arrays; >= 1.1: an object array of per-sub-env observations)."""
    last = infos["final_obs"]
    return {k: v[n] for k, v in last.items()} if isinstance(last, dict) else last[n]


def sub_env_info(infos: dict, n: int) -> dict:
    """Sub-env n's info out of a vector env's batched infos, as the single env gives it (plain Python values; the
    `_key` masks dropped)."""
    out = {}
    for key, values in infos.items():
        if key.startswith("_"):
            continue
        value = sub_env_info(values, n) if isinstance(values, dict) else values[n]
        out[key] = value.item() if isinstance(value, np.generic) else value
    return out


def single_env(env) -> MorcaEnv:
    """The `MorcaEnv` behind `env`: the env itself (unwrapped), or the one whose settings every sub-env of a
    `MorcaVectorEnv` runs with (its suite, calibration, step count, preset)."""
    base = env.unwrapped
    return base.env if isinstance(base, MorcaVectorEnv) else base
