"""`morca quickstart --env`: every step runs on the chosen testbed, with its own recipe, prompts and scheduler."""

import pytest

from agents.commands import quickstart


@pytest.fixture
def steps(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(quickstart, "run", lambda name, argv, env: calls.append(argv))
    monkeypatch.chdir(quickstart.Path(quickstart.__file__).resolve().parents[2])  # the checkout: recipes in datasets/
    return calls, tmp_path


def test_scenes_quickstart_uses_the_scenes_recipe_prompts_and_env_in_every_step(steps):
    calls, tmp = steps
    assert quickstart.main(["--env", "MorcaScenes-v0", "--out", str(tmp / "qs")]) == 0
    collect, train, finetune, anchor, evaluate = calls
    assert collect[1] == "morca/scenes/anchored-v2"
    assert collect[collect.index("--dataset-id") + 1] == "morca/scenes/quickstart-anchored-v2"
    assert finetune[finetune.index("--prompts") + 1] == "scenes-train[5::22]"
    for argv in (finetune, anchor, evaluate):
        assert argv[argv.index("--env") + 1] == "MorcaScenes-v0", argv
    methods = evaluate[evaluate.index("--methods") + 1:]
    shipped = [m for m in methods if m.startswith("morca-shipped=")]  # MorcaScenes' own shipped scheduler
    assert len(shipped) == 1 and shipped[0].endswith("morca-scenes-v0.safetensors")
    assert not any("tiny" in str(a) for argv in calls for a in argv)


def test_tiny_quickstart_is_unchanged_by_the_env_option(steps):
    calls, tmp = steps
    assert quickstart.main(["--recipe", "paper", "--out", str(tmp / "qs")]) == 0
    collect, train, finetune, evaluate = calls
    assert collect[1] == "morca/tiny/mixture-v0"
    assert finetune[finetune.index("--prompts") + 1] == "tiny-train:250"
    assert evaluate[evaluate.index("--env") + 1] == "MorcaTiny-v0"


def test_every_testbed_has_every_quickstart_recipe():
    from morca_env.data.recipe import packaged_recipes

    for env_id in quickstart.TESTBEDS:
        for sizes in quickstart.SCALES.values():
            assert quickstart.for_env(sizes, env_id)["data"] in packaged_recipes(), (env_id, sizes["data"])
