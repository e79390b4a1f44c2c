import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from morca_env.budget import BudgetSpec, forced_recompute_steps
from morca_env.data import collect_dataset, completed_indices, episode_options, first_episodes, relabel, to_replay_buffer

ROOT = Path(__file__).resolve().parents[2]
ENV_KWARGS = {"speedup": [1.5, 3.0], "lpips": False, "num_inference_steps": 10}


@pytest.fixture
def roots(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    monkeypatch.setenv("MORCA_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def collect(dataset_id, n, **kwargs):
    return collect_dataset(dataset_id, "MorcaTinyRandom-v0", n, env_kwargs=ENV_KWARGS,
                           behavior={"name": "threshold-curve"}, progress=False, **kwargs)


def check_episode_invariants(dataset):
    for ep in dataset.iterate_episodes():
        obs, actions = ep.observations, np.asarray(ep.actions)
        n = len(actions)
        assert all(len(v) == n + 1 for v in obs.values())
        budget = int(round(obs["scalars"][0, 5] * n))
        assert actions.sum() == budget
        assert np.allclose(obs["scalars"][:, 5], budget / n)  # one K per episode, everywhere
        assert np.allclose(obs["scalars"][:, 4], np.concatenate([[0], np.cumsum(actions)]) / n)  # u_t
        assert all(obs["action_mask"][t][actions[t]] for t in range(n))  # feasible under the recorded mask
        assert np.all(ep.rewards[:-1] == 0) and ep.rewards[-1] > 0
        assert ep.terminations[-1] and not ep.terminations[:-1].any() and not ep.truncations.any()


def test_relabel_makes_masks_consistent():
    spec = BudgetSpec(6, forced_recompute_steps(6))
    actions = np.array([0, 1, 1, 0, 1, 0])
    obs = {"scalars": np.zeros((7, 7), np.float32), "action_mask": np.zeros((7, 2), np.int8)}
    obs["scalars"][1:, 6] = 1  # cache valid after step 0
    out = relabel(obs, actions, spec)
    assert np.allclose(out["scalars"][:, 5], 3 / 6)
    assert out["action_mask"][:6].tolist() == [[1, 0], [1, 1], [1, 1], [1, 1], [0, 1], [1, 0]]


def test_collect_load_invariants_and_cql(roots):
    pytest.importorskip("d3rlpy")  # an extra (`[agents]`): skipped in the core CI venv
    import d3rlpy
    import minari

    collect("test/tiny/random-v0", 5)
    dataset = minari.load_dataset("test/tiny/random-v0")
    assert dataset.total_episodes == 5 and dataset.total_steps == 50
    check_episode_invariants(dataset)
    meta = episode_options(dataset)
    assert len(meta) == 5 and all(m["budget"] == int(round(np.sum(ep.actions)))
                                  for m, ep in zip(meta, dataset.iterate_episodes()))
    assert dataset.storage.metadata["algorithm_name"].startswith("threshold-curve")
    assert dataset.observation_space["pooled"].dtype == np.float16

    buffer = to_replay_buffer(dataset, "tuple")
    assert buffer.transition_count == 50 and len(buffer.episodes) == 5
    episode = buffer.episodes[0]
    assert [o.shape for o in episode.observations] == [(10, 9, 4, 8, 8), (10, 18, 8, 8), (10, 7), (10, 2)]
    assert episode.terminated and episode.actions.shape == (10, 1)
    prefix = to_replay_buffer(dataset, "tuple", episode_indices=first_episodes(dataset, 2))
    assert len(prefix.episodes) == 2 and np.array_equal(prefix.episodes[1].actions, buffer.episodes[1].actions)
    with pytest.raises(ValueError, match=r"episodes=6 is outside \[1, 5\]"):
        first_episodes(dataset, 6)
    # several datasets: the prefix applies to the first, the others come whole, in order
    both = to_replay_buffer([dataset, dataset], "tuple", episode_indices=[1, 2])
    assert len(both.episodes) == 2 + 5 and both.transition_count == 70
    assert np.array_equal(both.episodes[0].actions, buffer.episodes[1].actions)
    assert np.array_equal(both.episodes[2].actions, buffer.episodes[0].actions)
    # n-step returns over the whole horizon: every transition's target is its episode's terminal reward
    monte_carlo = to_replay_buffer(dataset, "tuple", n_step=10)
    batch = monte_carlo.sample_transition_batch(64)
    finals = {float(ep.rewards[-1, 0]) for ep in monte_carlo.episodes}
    assert all(float(r) in finals for r in batch.rewards[:, 0]) and batch.terminals.all()
    with pytest.raises(ValueError, match="n_step=0 must be an integer >= 1"):
        to_replay_buffer(dataset, "tuple", n_step=0)

    flat = to_replay_buffer(dataset, "flat")
    cql = d3rlpy.algos.DiscreteCQLConfig(batch_size=16).create(device="cpu")
    cql.fit(flat, n_steps=100, n_steps_per_epoch=100, show_progress=False, save_interval=10**6,
            logger_adapter=d3rlpy.logging.NoopAdapterFactory())
    action = cql.predict(flat.episodes[0].observations[:1])
    assert action.shape == (1,) and action[0] in (0, 1)


@pytest.mark.slow  # about 21 s on one core: kept out of the default suite (about 13 min)
def test_recover_environment_in_a_fresh_process(roots):
    collect("test/tiny/recover-v0", 2)
    code = ("import minari; ds = minari.load_dataset('test/tiny/recover-v0'); env = ds.recover_environment(); "
            "obs, info = env.reset(seed=0); print(env.spec.id, env.unwrapped.enforce_budget, "
            "ds.recover_environment(eval_env=True).unwrapped.enforce_budget)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=roots,
                         env={**os.environ}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["MorcaTinyRandom-v0", "True", "True"]  # both hold agents to their budget

    report = subprocess.run([sys.executable, "-m", "morca_env.commands", "dataset-report", "test/tiny/recover-v0",
                             "--plot", str(roots / "k.png")], capture_output=True, text=True, env={**os.environ},
                            timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "2 episodes, 20 steps" in report.stdout and (roots / "k.png").stat().st_size > 1000
    # a directory gets a file named after the dataset, and the path printed is the one written
    (roots / "plots").mkdir()
    report = subprocess.run([sys.executable, "-m", "morca_env.commands", "dataset-report", "test/tiny/recover-v0",
                             "--plot", str(roots / "plots")], capture_output=True, text=True, env={**os.environ},
                            timeout=300)
    written = roots / "plots" / "test_tiny_recover-v0_k.png"
    assert report.returncode == 0 and f"plot: {written}" in report.stdout, report.stderr[-2000:]
    assert written.stat().st_size > 1000 and not (roots / "plots.png").exists()


def test_finished_dataset_is_not_overwritten(roots):
    collect("test/tiny/keep-v0", 2)
    assert collect("test/tiny/keep-v0", 2).total_episodes == 2  # same recipe: just loads it
    with pytest.raises(FileExistsError, match="overwrite=True"):
        collect("test/tiny/keep-v0", 3)
    assert collect("test/tiny/keep-v0", 3, overwrite=True).total_episodes == 3


def test_a_relative_datasets_path_builds_and_loads(roots, monkeypatch):
    """`export MINARI_DATASETS_PATH=runs/minari` (the docs' commands): minari joined a relative root twice when
    it sized the new dataset's files, and the build failed after every episode was collected."""
    import minari

    monkeypatch.chdir(roots)
    monkeypatch.setenv("MINARI_DATASETS_PATH", "runs/minari")
    assert collect("test/tiny/relative-v0", 2).total_episodes == 2
    assert minari.load_dataset("test/tiny/relative-v0").total_episodes == 2
    assert (roots / "runs/minari/test/tiny/relative-v0/data/main_data.hdf5").is_file()


def test_two_workers_give_the_same_episodes(roots):
    one = collect("test/tiny/w1-v0", 4)
    two = collect("test/tiny/w2-v0", 4, workers=2)
    for a, b in zip(one.iterate_episodes(), two.iterate_episodes()):
        assert np.array_equal(a.actions, b.actions) and np.array_equal(a.rewards, b.rewards)


def test_batched_collection_gives_the_unbatched_episodes(roots):
    """num_envs > 1 plays each episode in a MorcaVectorEnv with the seed and behaviour it has unbatched: the same
    actions, rewards within float32 rounding (a short last batch is padded and its extra episode dropped)."""
    kwargs = dict(env_kwargs=ENV_KWARGS, behavior={"name": "random"}, progress=False)
    one = collect_dataset("test/tiny/b1-v0", "MorcaTinyRandom-v0", 5, **kwargs)
    batched = collect_dataset("test/tiny/b3-v0", "MorcaTinyRandom-v0", 5, num_envs=2, workers=2, **kwargs)
    assert batched.total_episodes == 5
    for a, b in zip(one.iterate_episodes(), batched.iterate_episodes()):
        assert np.array_equal(a.actions, b.actions) and a.id == b.id
        assert np.allclose(a.rewards, b.rewards, atol=1e-3)
        for key in a.observations:
            assert np.allclose(a.observations[key].astype(np.float32), b.observations[key].astype(np.float32),
                               rtol=2e-3, atol=1e-3), key
    check_episode_invariants(collect("test/tiny/b-curve-v0", 3, num_envs=3))
    with pytest.raises(ValueError, match=r"num_envs=0 must be a positive integer"):
        collect("test/tiny/b0-v0", 3, num_envs=0)


KILL_DURING_WRITE = """
import os, runpy, signal, sys
import morca_env.data.collect as collecting
from morca_env.data.staging import episode_path
from morca_env.utils.io import atomic_path

real_write = collecting.write_episode

def write_or_die(staging, index, episode):
    if index == {kill_at}:  # SIGKILL half-way through writing this episode: a partial temp file is left behind
        with atomic_path(episode_path(staging, index)) as tmp:
            tmp.write_bytes(b"half an episode")
            os.kill(os.getpid(), signal.SIGKILL)
    real_write(staging, index, episode)

collecting.write_episode = write_or_die
sys.argv = ["morca"] + {argv!r}[2:]  # `python -m morca_env.commands collect ...`, in this process
runpy.run_module("morca_env.commands", run_name="__main__")
"""


def test_sigkill_then_resume_gives_exact_episodes_without_duplicates(roots):
    """A collection killed while writing episode 3 resumes to the same data as an uninterrupted run.

    The kill is raised by the collector itself at a fixed point (not by a timer), so the
    test does not depend on how fast the machine is.
    """
    episodes, kill_at = 6, 3
    recipe = roots / "recipe.json"
    recipe.write_text(json.dumps({"dataset_id": "test/tiny/kill-v0", "env_id": "MorcaTinyRandom-v0",
                                  "num_episodes": episodes, "env_kwargs": ENV_KWARGS,
                                  "behavior": {"name": "threshold-curve"}}))
    from morca_env.data import staging_root

    staging = staging_root() / "test/tiny/kill-v0" / "episodes"  # this test's MINARI_DATASETS_PATH and cache
    command = ["-m", "morca_env.commands", "collect", str(recipe), "--num-envs", "1"]  # bitwise: unbatched
    killed = subprocess.run([sys.executable, "-c", KILL_DURING_WRITE.format(kill_at=kill_at, argv=command)],
                            cwd=roots, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert sorted(p.name for p in staging.glob("ep_*.npz")) == [f"ep_{i:06d}.npz" for i in range(kill_at)]
    assert len(list(staging.glob(".*.tmp*"))) == 1  # the interrupted write
    assert not (roots / "minari" / "test/tiny/kill-v0" / "data").exists()
    out = subprocess.run([sys.executable] + command + ["--resume"], cwd=roots, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert not list(staging.glob(".*.tmp*"))
    import minari

    resumed = minari.load_dataset("test/tiny/kill-v0")
    assert resumed.total_episodes == episodes
    assert sorted(ep.id for ep in resumed.iterate_episodes()) == list(range(episodes))
    check_episode_invariants(resumed)
    reference = collect("test/tiny/nokill-v0", episodes)  # uninterrupted run of the same recipe
    for a, b in zip(resumed.iterate_episodes(), reference.iterate_episodes(), strict=True):
        assert np.array_equal(a.actions, b.actions) and np.array_equal(a.rewards, b.rewards)
        assert a.observations.keys() == b.observations.keys()
        for key in a.observations:
            assert np.array_equal(a.observations[key], b.observations[key]), (a.id, key)


def test_a_dataset_at_one_target_carries_its_reference_scores_and_card(roots, monkeypatch):
    """minari.get_normalized_score works (0 = random feasible, 1 = best fixed, at the dataset's K) and `minari show`
    prints the card (recipe, behaviour, env kwargs, K histogram, mean PSNR)."""
    import minari

    from morca_env.evaluation import benchmark
    from morca_env import schedulers

    suite = benchmark.suite_of("MorcaTinyRandom-v0")
    env = benchmark.make_env("MorcaTinyRandom-v0")
    refs = benchmark.measure_references("MorcaTinyRandom-v0", env=env, best_fixed=schedulers.make("uniform", env),
                                        progress=False)
    env.close()
    monkeypatch.setattr(benchmark, "packaged_references", lambda: {"MorcaTinyRandom-v0": refs})
    kwargs = {**suite.kwargs, "speedup": 3.0, "prompts": suite.train_prompts}
    ds = collect_dataset("test/tiny/refs-v0", "MorcaTinyRandom-v0", 3, env_kwargs=kwargs, behavior="random",
                         progress=False)
    low, high = (float(np.mean(np.minimum(refs["targets"]["3"][m]["psnr"], 50.0))) for m in ("random", "best-fixed"))
    assert minari.get_normalized_score(ds, np.array([low, high])) == pytest.approx([0.0, 1.0])
    metadata = ds.storage.metadata  # what a Minari remote lists (minari upload sends the directory as it is)
    for key in ("dataset_id", "minari_version", "total_episodes", "total_steps", "env_spec", "eval_env_spec",
                "observation_space", "action_space", "author", "algorithm_name", "code_permalink", "description",
                "dataset_size", "ref_min_score", "ref_max_score"):
        assert metadata.get(key) not in (None, ""), key
    on_disk = json.loads((Path(os.environ["MINARI_DATASETS_PATH"]) / "test/tiny/refs-v0/data/metadata.json").read_text())
    assert on_disk["ref_min_score"] == metadata["ref_min_score"] and on_disk["description"] == metadata["description"]
    card = metadata["description"]
    ks = sorted(int(m["budget"]) for m in episode_options(ds))
    assert f"K histogram (K: episodes): {ks[0]}: " in card and '"name": "random"' in card and '"speedup": 3.0' in card
    assert f"PSNR: mean {np.mean([m['psnr'] for m in episode_options(ds)]):.2f} dB" in card
    assert "on no Minari remote (the `minari download` row of `minari show` does not apply)" in card
    shown = subprocess.run([str(Path(sys.executable).with_name("minari")), "show", "test/tiny/refs-v0"], capture_output=True,
                           text=True, timeout=120, env={**os.environ, "COLUMNS": "300"})
    assert shown.returncode == 0 and "K histogram" in shown.stdout, shown.stdout[-2000:] + shown.stderr[-2000:]
    ranged = collect_dataset("test/tiny/range-v0", "MorcaTinyRandom-v0", 2, behavior="random", progress=False,
                             env_kwargs={**kwargs, "speedup": [2.0, 3.0]})
    assert ranged.storage.metadata.get("ref_min_score") is None  # a range has no one reference
    assert "reference scores: none" in ranged.storage.metadata["description"]


def test_staging_is_per_dataset_root(roots, monkeypatch):
    """A collection into another MINARI_DATASETS_PATH "finished" in 30 s on episodes another root had staged."""
    from morca_env.data import staging_root

    collect("test/tiny/root-v0", 2)
    first = staging_root() / "test/tiny/root-v0"
    assert completed_indices(first, 2) == {0, 1}
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(roots / "other-root"))
    second = staging_root() / "test/tiny/root-v0"
    assert second != first and not completed_indices(second, 2)  # the other root collects its own episodes


def test_packaged_recipes_load_by_id_from_anywhere_and_read_their_files_beside_them(tmp_path, monkeypatch):
    """The published recipes ship with the package: a pip install collects them by dataset id, from any folder,
    and a relative schedules file in a behaviour is read beside its recipe."""
    from pathlib import Path

    from morca_env.data import CollectionRecipe
    from morca_env.data.recipe import find_recipe, packaged_recipes

    monkeypatch.chdir(tmp_path)  # not the checkout
    recipes = packaged_recipes()
    assert {"morca/tiny/random-v0", "morca/tiny/anchored-v2", "morca/scenes/anchored-v2", "morca/wan21/random-v0",
            "morca/wan22/random-v0", "morca/tiny/searched-v0"} <= set(recipes)
    for dataset_id, path in recipes.items():
        recipe = CollectionRecipe.from_file(dataset_id)
        assert recipe.dataset_id == dataset_id and find_recipe(dataset_id) == path
    searched = CollectionRecipe.from_file("morca/tiny/searched-v0").behavior["path"]
    assert Path(searched).is_absolute() and Path(searched).is_file()
    assert Path(searched) == recipes["morca/tiny/searched-v0"].parent / "searched-v0.schedules.json"
    own = tmp_path / "own.json"  # a user's recipe: its relative paths are its own folder's
    own.write_text('{"dataset_id": "test/own-v0", "env_id": "MorcaTiny-v0", "num_episodes": 1, '
                   '"behavior": {"name": "replay", "path": "schedules.json"}}')
    assert CollectionRecipe.from_file(own).behavior["path"] == str(tmp_path / "schedules.json")
    with pytest.raises(FileNotFoundError, match=r"recipe 'morca/tiny/nope-v0' is neither a file nor a packaged "
                                                r"recipe; valid: a JSON recipe file or one of morca/scenes/"):
        find_recipe("morca/tiny/nope-v0")
