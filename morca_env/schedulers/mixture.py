"""A behaviour mixture: each episode plays one registered scheduler, drawn with the given weights."""

from __future__ import annotations

import numpy as np

from .registry import entry, make, refuse_caller_only_options, register


@register("mixture", seeded=True, needs_env=True)
class Mixture:
    """Each episode plays one component, drawn with the given weights.

    `components` are registry specs with a weight, e.g.
    [{"name": "threshold-curve", "weight": 0.5}, {"name": "jittered-uniform", "weight": 0.25}, ...];
    the draw and each component's own randomness come from `seed` (the recipe's per-episode seed).
    """

    def __init__(self, components=(), env=None, seed: int | None = None):
        if not components:
            raise ValueError("a mixture needs at least one component")
        for component in components:
            if not isinstance(component, dict) or not isinstance(component.get("name"), str):
                raise ValueError(f"mixture component {component!r} must be an object with a scheduler \"name\" "
                                 "(and optionally a \"weight\" and the scheduler's options)")
            refuse_caller_only_options(component, f"mixture component {component!r}")
        weights = np.array([float(c.get("weight", 1.0)) for c in components])
        if np.any(weights < 0) or weights.sum() <= 0:
            raise ValueError(f"mixture weights {weights.tolist()} must be >= 0 with a positive sum")
        rng = np.random.default_rng(seed)
        chosen = components[int(rng.choice(len(components), p=weights / weights.sum()))]
        options = {k: v for k, v in chosen.items() if k not in ("name", "weight")}
        if entry(chosen["name"]).seeded:
            options["seed"] = int(rng.integers(2**31))
        self.name = chosen["name"]
        self.policy = make(chosen["name"], env, **options)

    def episode_options(self, index: int):
        getter = getattr(self.policy, "episode_options", None)
        return getter(index) if getter is not None else None

    def reset(self, obs, info) -> None:
        self.policy.reset(obs, info)

    def __call__(self, obs) -> int:
        return self.policy(obs)
