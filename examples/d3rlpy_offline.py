"""d3rlpy's discrete offline algorithms on a MORCA dataset, with their defaults, then the benchmark.

    pip install 'morca-gym[agents]'
    make quickstart                                     # or any collected dataset: minari list local
    python examples/d3rlpy_offline.py morca/tiny/mixture-v0

`to_replay_buffer(dataset)` gives the flat layout (`morca_env.observation.FLAT_KEYS`),
which every d3rlpy encoder takes and `gymnasium.wrappers.FlattenObservation(env)` repeats
in the env; the benchmark feeds the algorithm the same vector. The project's
`agents.DiscreteIQL` takes the same buffer and, through `agents.MorcaPolicy`, never
chooses an infeasible action (d3rlpy's own algorithms ignore the mask; the env projects).
"""

from __future__ import annotations

import sys

import torch

import morca_env  # noqa: F401  (registers the envs)
from morca_env.evaluation import benchmark
from morca_env.data import to_replay_buffer


def algorithms(batch_size: int = 64) -> dict:
    import d3rlpy

    import agents

    return {"DiscreteCQL": d3rlpy.algos.DiscreteCQLConfig(batch_size=batch_size),
            "DiscreteBCQ": d3rlpy.algos.DiscreteBCQConfig(batch_size=batch_size),
            "DiscreteBC": d3rlpy.algos.DiscreteBCConfig(batch_size=batch_size),
            "DQN": d3rlpy.algos.DQNConfig(batch_size=batch_size),
            "DiscreteIQL (MORCA)": agents.DiscreteIQLConfig(batch_size=batch_size)}


def main(dataset_id: str = "morca/tiny/mixture-v0", steps: int = 500, env_id: str | None = None,
         score: bool = True, names=None) -> dict:
    import d3rlpy
    import minari

    import agents

    torch.set_num_threads(1)
    dataset = minari.load_dataset(dataset_id)
    env_id = env_id or dataset.spec.env_spec.id
    buffer = to_replay_buffer(dataset)  # the defaults: flat observations, one-step TD
    results = {}
    for name, config in algorithms().items():
        if names is not None and name not in names:
            continue
        algo = config.create(device="cpu")
        algo.fit(buffer, n_steps=steps, n_steps_per_epoch=steps, show_progress=False,
                 logger_adapter=d3rlpy.logging.NoopAdapterFactory())
        policy = agents.MorcaPolicy(algo) if isinstance(algo, agents.DiscreteIQL) else algo
        results[name] = benchmark.evaluate(policy, env_id, name=name) if score else algo
        if score:
            print(results[name].table())
    return results


if __name__ == "__main__":
    main(*sys.argv[1:2])
