"""What the env and the learned scheduler cost next to MorcaTiny's own work, measured in one run.

    python benchmarks/bench_env_overhead.py [--prompts 6] [--timing-repeats 3] [--threads 1]

For each held-out prompt: one stock no-cache generation, then uniform-schedule episodes
at K = 0, the K of 2x / 2.5x / 3x (the packaged calibration) and K_max, once with latent
features on (the paper's state) and once off (the state rule and scalar-state schedulers
read), interleaved so that machine noise hits all alike; every timing is the fastest of
`--timing-repeats` back-to-back runs. Printed:

* env overhead = the env's own seconds (SeaCache signal, SEA distance, latent features,
  observation assembly: everything `MorcaEnv._observe` does but the step's patch embedding,
  which the signal computes for the step's transformer calls) as a share of the episode's
  latency, and a per-part breakdown from one more run with timers wrapped around each part
  (~1 us each, so that run's share is a little higher; "rest" is its share less the parts);
* the learned scheduler's cost: `MorcaPolicy` called on every observation of a real
  episode (so with the caches the transformer just used), for the scalar-state network
  (the quickstart's default) and the paper's latent-feature network, random weights (the
  cost does not depend on them), as a share of a stock step and of the episode's average step;
* the speedup ceiling (stock / latency at K_max), without and with each scheduler's cost.

Goals: env overhead <= 5% of an episode with latent features on; scheduler
<= 1.5% of a step.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import gymnasium as gym
import numpy as np
from tqdm import tqdm

import morca_env  # noqa: F401
from morca_env import env as env_module
from morca_env import observation as observation_module
from morca_env.speedup.measure import fastest, run_uniform_episode, stock_seconds
from morca_env.observation import feature_shapes
from morca_env.schedulers.fixed import UniformInterval
from morca_env.rollout import rollout
from morca_env.diffusion.signals import StepDistanceTracker
from morca_env.utils.threads import configure_threads
from morca_env.cli import show_library_messages

TARGETS = (2.0, 2.5, 3.0)
PARTS = ("signal input", "SEA distance", "latent features", "feature stacking")


class PartTimers:
    """Wall-clock timers around the parts of an observation (module functions patched while active), less the
    denoiser's own work done inside them (the step's patch embedding, which the signal computes for the step),
    as the env counts its overhead."""

    def __init__(self, denoiser):
        self.denoiser = denoiser
        self.seconds = defaultdict(float)
        self._patches = [(env_module, "signal_input_for_step", "signal input"),
                         (StepDistanceTracker, "observe_no_grad", "SEA distance"),
                         (observation_module, "latent_features_no_grad", "latent features"),
                         (observation_module, "stack_features", "feature stacking")]
        self._originals = []

    def __enter__(self):
        for owner, name, label in self._patches:
            original = getattr(owner, name)
            self._originals.append((owner, name, original))
            setattr(owner, name, self._timed(original, label))
        return self

    def _timed(self, function, label):
        def timed(*args, **kwargs):
            t0, model_s = time.perf_counter(), self.denoiser.elapsed_s
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - t0 - (self.denoiser.elapsed_s - model_s)
        return timed

    def __exit__(self, *exc):
        for owner, name, original in reversed(self._originals):
            setattr(owner, name, original)


def random_policy(channels: int, features: str):
    """A `MorcaPolicy` around a freshly built discrete IQL (the per-step cost does not depend on the weights)."""
    from agents import DiscreteIQLConfig, MorcaEncoderFactory
    from agents.policy import MorcaPolicy

    factory = MorcaEncoderFactory(features)
    algo = DiscreteIQLConfig(actor_encoder_factory=factory, critic_encoder_factory=factory,
                             value_encoder_factory=factory).create(device="cpu")
    shapes = feature_shapes(channels)
    algo.create_impl([shapes["pooled"], shapes["temporal"], (7,), (2,)], 2)
    return MorcaPolicy(algo)


class TimedObserver:
    """Uniform schedule, but a learned policy is also called on every observation and timed (its action unused)."""

    def __init__(self, policy):
        self.inner, self.policy, self.seconds, self.calls = UniformInterval(), policy, 0.0, 0

    def reset(self, obs, info):
        self.inner.reset(obs, info)

    def __call__(self, obs):
        t0 = time.perf_counter()
        self.policy(obs)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return self.inner(obs)


def main() -> None:
    show_library_messages()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=6)
    p.add_argument("--timing-repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    configure_threads(args.threads)
    full = gym.make("MorcaTiny-v0", budget=0, lpips=False, prompts="tiny-eval").unwrapped
    lean = gym.make("MorcaTiny-v0", budget=0, lpips=False, prompts="tiny-eval", latent_features=False).unwrapped
    calibration = full.calibration
    budgets = {"K=0": 0, **{f"{t:g}x": calibration.budget_for_speedup(t) for t in TARGETS},
               "K_max": full.budget_spec.max_budget}
    policies = {"scalar-state": random_policy(3, ""), "latent-feature": random_policy(3, "p3,mean,var")}
    stock, latency = [], defaultdict(list)  # latency[(state, budget name)]
    overhead, parts, timed_overhead = defaultdict(list), defaultdict(lambda: defaultdict(float)), defaultdict(list)
    policy_seconds, policy_calls = defaultdict(float), defaultdict(int)
    pairs = full.suite.pairs()[: args.prompts]
    full.denoiser.generate(prompt=pairs[0][0], seed=pairs[0][1])  # warm-up
    for prompt, seed in tqdm(pairs, desc="bench_env_overhead", unit="prompt"):
        stock.append(fastest(lambda: stock_seconds(full, prompt, seed), args.timing_repeats))
        for name, k in budgets.items():
            options = {"prompt": prompt, "seed": seed, "budget": k}
            for state, env in (("features on", full), ("features off", lean)):
                best = min((run_uniform_episode(env, options) for _ in range(args.timing_repeats)),
                           key=lambda info: info["latency_s"])
                latency[state, name].append(best["latency_s"])
                overhead[state, name].append(best["overhead_s"] / best["latency_s"])
            # the breakdown from one more run with timers around the parts, kept out of the headline share
            with PartTimers(full.denoiser) as timers:
                info = run_uniform_episode(full, options)
            timed_overhead[name].append(info["overhead_s"] / info["latency_s"])
            for part, seconds in timers.seconds.items():
                parts[name][part] += seconds / info["latency_s"] / len(pairs)
        for label, policy in policies.items():  # in a real episode at 2.5x, features on (what both would see)
            observer = TimedObserver(policy)
            rollout(full, observer, {"prompt": prompt, "seed": seed, "budget": budgets["2.5x"]})
            policy_seconds[label] += observer.seconds
            policy_calls[label] += observer.calls

    stock_s = float(np.mean(stock))
    steps = full.num_steps
    print(f"MorcaTiny-v0, {len(pairs)} held-out prompts, {args.threads} thread(s), fastest of {args.timing_repeats}; "
          f"stock generation {stock_s:.3f} s = {1e3 * stock_s / steps:.2f} ms per step")
    print("\nenv overhead (signal + features + observation) as a share of the episode's latency:")
    print(f"{'':>8} {'K':>3} {'latency s':>10} {'speedup':>8} {'features on':>12} {'features off':>13}   "
          f"breakdown with features on ({', '.join(PARTS)}; rest = assembly), from an instrumented run")
    for name, k in budgets.items():
        lat = float(np.mean(latency["features on", name]))
        on, off = (100 * float(np.mean(overhead[s, name])) for s in ("features on", "features off"))
        breakdown = [100 * parts[name][part] for part in PARTS]
        rest = 100 * float(np.mean(timed_overhead[name])) - sum(breakdown)
        print(f"{name:>8} {k:>3} {lat:>10.3f} {stock_s / lat:>7.2f}x {on:>11.2f}% {off:>12.2f}%   "
              + " + ".join(f"{b:.2f}" for b in breakdown) + f" + {rest:.2f}")
    print("\nlearned scheduler's cost per step (MorcaPolicy in a real episode, random weights):")
    average_step = {name: float(np.mean(latency["features on", name])) / steps for name in budgets}
    for label in policies:
        per_step = policy_seconds[label] / policy_calls[label]
        shares = ", ".join(f"{100 * per_step / average_step[f'{t:g}x']:.2f}% at {t:g}x" for t in TARGETS)
        print(f"{label:>15}: {1e3 * per_step:.3f} ms = {100 * per_step * steps / stock_s:.2f}% of a stock step; "
              f"of the episode's average step: {shares}")
    print("\nspeedup ceiling (stock / latency at K_max):")
    ceilings = {state: stock_s / float(np.mean(latency[state, "K_max"])) for state in ("features on", "features off")}
    line = f"  features on {ceilings['features on']:.2f}x, features off {ceilings['features off']:.2f}x"
    for label, state in (("scalar-state", "features off"), ("latent-feature", "features on")):
        per_step = policy_seconds[label] / policy_calls[label]
        line += (f"; with the {label} scheduler ({state}) "
                 f"{stock_s / (float(np.mean(latency[state, 'K_max'])) + steps * per_step):.2f}x")
    print(line)
    print("\ngoals:")
    for t in TARGETS:
        share = 100 * float(np.mean(overhead["features on", f"{t:g}x"]))
        print(f"  env overhead at {t:g}x, features on: {share:.2f}% (goal <= 5%): {'met' if share <= 5 else 'not met'}")
    share = 100 * policy_seconds["scalar-state"] / policy_calls["scalar-state"] * steps / stock_s
    print(f"  scalar-state scheduler: {share:.2f}% of a stock step (goal <= 1.5%): {'met' if share <= 1.5 else 'not met'}")


if __name__ == "__main__":
    main()
