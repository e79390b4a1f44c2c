"""research/headroom/neighbour_schedules.py: each K beside its neighbours' schedules moved to it, on validation."""

import gymnasium as gym
import pytest

import morca_env  # noqa: F401
from morca_env.prompts import get_suite
from morca_env.schedulers.fixed import StaticSchedule, UniformInterval
from morca_env.evaluation.search import play_schedule
from neighbour_schedules import neighbour_scores

KWARGS = {"num_inference_steps": 10}


def test_a_neighbours_schedule_moved_is_scored_and_kept_where_it_wins(tmp_path):
    env = gym.make("MorcaTinyRandom-v0", lpips=False, latent_features=False,
                   reference_cache_dir=str(tmp_path / "refs"), **KWARGS)
    spec = env.unwrapped.budget_spec
    good = UniformInterval().plan(spec, 4)
    bad = [0] * 10
    for i in sorted(set(range(10)) - set(spec.forced))[-3:]:  # three reuses bunched at the end
        bad[i] = 1
    schedules = StaticSchedule({3: bad, 4: good})
    pairs = tuple(get_suite("tiny-train[11:2651:1320]").pairs())
    scores = neighbour_scores(env, schedules, 3, pairs)
    moved = StaticSchedule({4: good}).plan(spec, 3)
    expected = sum(play_schedule(env.unwrapped, moved, p, s).reward for p, s in pairs) / len(pairs)  # full episodes
    assert scores["K=4 moved_validation_psnr"] == pytest.approx(expected)
    assert "K=2 moved_validation_psnr" not in scores  # no K=2 in the file
    candidates = {"fitted": scores["validation_psnr"], "uniform": scores["uniform_validation_psnr"],
                  "K=4 moved": scores["K=4 moved_validation_psnr"]}
    assert scores["kept"] == max(candidates, key=candidates.get)
    with pytest.raises(ValueError, match=r"K=5 has no schedule in the file \(it has \[3, 4\]\)"):
        neighbour_scores(env, schedules, 5, pairs)
