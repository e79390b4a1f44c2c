"""research/anchored/anchored_seeds.py: the validation table it prints before (or instead of) the evaluation."""

import agents.anchored
from anchored_seeds import validation_table


def test_the_validation_table_gives_every_candidate_and_the_chosen_margin(tmp_path, monkeypatch):
    candidate = {"margin": 0.05, "gain_db": 0.21, "ci95_db": 0.1, "runs_leaving": 0.5, "steps_leaving": 0.02}
    records = {("0", "offline"): {"candidates": [candidate], "chosen": 0.05},
               ("0", "online"): {"candidates": [{**candidate, "gain_db": -0.4}], "chosen": None},
               ("1", "offline"): {"candidates": [], "chosen": None},
               ("1", "online"): {"candidates": [], "chosen": None}}
    monkeypatch.setattr(agents.anchored, "anchor_of",
                        lambda path: {"selection": records[path.parent.parent.name[4:], path.parent.name]})
    rows = validation_table(tmp_path, [0, 1]).splitlines()[2:]
    assert rows[0] == "| 0 | offline | 0.050: +0.21 ± 0.10 (50% / 2.0%) | 0.050 |"
    assert rows[1] == "| 0 | online | 0.050: -0.40 ± 0.10 (50% / 2.0%) | never |"
    assert rows[2] == "| 1 | offline | - | never |" and len(rows) == 4


def test_the_evaluation_spreads_its_pairs_over_every_content_class_with_fresh_seeds():
    from collections import Counter

    from anchored_seeds import evaluation_options

    from morca_env.models.scenes_data import parse_prompt
    from morca_env.prompts import get_suite

    options = evaluation_options(40, 36, [2.0, 3.0], "MorcaScenes-v0")
    assert len(options) == 80 and {o["speedup"] for o in options} == {2.0, 3.0}
    classes = Counter(parse_prompt(o["prompt"]).content_class for o in options if o["speedup"] == 2.0)
    assert len(classes) == 8 and set(classes.values()) == {5}  # scenes-eval lists 30 per class, class after class
    suite_seeds = {seed for _, seed in get_suite("scenes-eval").pairs()}
    assert not suite_seeds & {o["seed"] for o in options}  # seeds drawn from --eval-seed, not the suite's own
