"""The headroom scripts: the transfer report, the trajectory replay and its summary, and their shared parser."""

import gymnasium as gym
import headroom_trajectory
import headroom_transfer
import numpy as np
import pytest
import torch

import morca_env  # noqa: F401
from morca_env.evaluation.search import play_schedule
from morca_env.schedulers.fixed import UniformInterval


@pytest.fixture
def env(tmp_path):
    # r_max 200: on the random tiny model PSNRs are 40-60 dB, above the default cap of 50
    return gym.make("MorcaTinyRandom-v0", budget=8, num_inference_steps=20, lpips=False, latent_features=False,
                    r_max=200, reference_cache_dir=str(tmp_path / "refs"))


def test_transfer_report_groups_gains_by_how_the_pairs_relate():
    module = headroom_transfer
    pairs = [("p", 1), ("p", 2), ("q", 1)]
    # searched for pair a, played on pair b: 10 on its own pair, 4 on the same prompt, 1 on the other prompt
    rewards = {f"s{a}": [10.0 if a == b else 4.0 if pairs[a][0] == pairs[b][0] else 1.0 for b in range(3)]
               for a in range(3)}
    rewards["base"] = [0.0, 0.0, 0.0]
    gains = module.gains_by_relation(rewards, pairs, ["s0", "s1", "s2"], "base")
    assert gains == {"own": [10.0, 10.0, 10.0], "same prompt, other seed": [4.0, 4.0], "other prompts": [1.0, 1.0, 1.0]}
    chosen = module.library_choice({**rewards, "base": [5.0, 0.0, 0.0]}, pairs, ["s0", "s1", "s2"], ["base"])
    assert chosen == [5.0, 1.0, 1.0]  # pair 0: the baseline beats the other prompt's schedule; pair 2: q's own is excluded


def test_trajectory_replay_matches_the_env_and_branches_from_the_right_step(env):
    """headroom_trajectory: the replayed run is the env's episode, its errors start at the first reuse, and a run
    finished without cache from step b is the schedule with every reuse from b on removed."""
    from morca_env.diffusion.denoiser import StepwiseDenoiser
    from morca_env.diffusion.metrics import to_uint8, video_metrics

    module = headroom_trajectory
    env = env.unwrapped
    spec = env.budget_spec
    schedule = UniformInterval().plan(spec, 8)
    first_reuse = schedule.index(1)
    branch = next(i for i in range(10, 20) if schedule[i])  # a reuse at the branch step: "from b on" includes b
    den = StepwiseDenoiser(env.pipe, env.config, device=env.device)
    try:
        ref_latents, ref_clean, ref_video, none = module.run_states(den, [0] * 20, "a red circle", 3)
        latents, clean, video, continued = module.run_states(den, schedule, "a red circle", 3, [branch])
        truncated = den.generate(schedule[:branch] + [0] * (20 - branch), prompt="a red circle", seed=3)
    finally:
        den.close()
    assert none == {} and set(continued) == {branch}
    assert torch.equal(continued[branch], truncated)
    psnr = float(video_metrics(to_uint8(video), to_uint8(ref_video), None)["psnr"])
    assert psnr == pytest.approx(play_schedule(env, schedule, "a red circle", 3).reward, abs=1e-4)  # r_max 200: no cap
    for space, states, reference in (("latent", latents, ref_latents), ("x0", clean, ref_clean)):
        errors = module.relative_errors(states, reference)
        assert np.all(errors[:first_reuse] == 0), space  # identical runs until the first reuse
        assert errors[first_reuse] > 1e-4, space  # the reused velocity moves both the step's x0 and its latent
    assert np.all(module.relative_errors(ref_latents, ref_latents) == 0)
    # x0 = x_t - sigma_t v_t: at the last step (sigma -> 0 next) the prediction is about the finished latent
    final_move = (ref_latents[-1] - ref_latents[-2]).norm()
    assert (ref_clean[-1] - ref_latents[-1]).norm() < 0.1 * final_move


def test_trajectory_gaps_and_summary():
    module = headroom_trajectory
    errors = {"best-fixed": {"latent": [[0.0, 0.2, 0.4]], "x0": [[0.0, 0.1, 0.1]], "psnr": [20.0], "continued": [[21.0]]},
              "searched": {"latent": [[0.0, 0.1, 0.4]], "x0": [[0.0, 0.2, 0.1]], "psnr": [23.0], "continued": [[22.5]]}}
    np.testing.assert_allclose(module.gap_db(errors, "searched", "best-fixed", "latent"), [[0.0, -6.0206, 0.0]],
                               atol=1e-3)
    np.testing.assert_allclose(module.gap_db(errors, "searched", "best-fixed", "x0"), [[0.0, 6.0206, 0.0]], atol=1e-3)
    schedules = {"best-fixed": [[0, 1, 0]], "searched": [[1, 0, 0]]}
    lines = "\n".join(module.summary_lines(errors, schedules, 1, 3, [2]))
    assert "final PSNR +3.00" in lines and "first differ at step 0" in lines
    assert "| 2 | -6.02 ± 0.00 | +6.02 ± 0.00 | +1.50 ± 0.00 | nan | 0.0 / 0.0 |" in lines  # the state before step 2
    assert "closer to the no-cache run's at 33%" in lines


def test_headroom_experiments_share_one_parser_with_checked_arguments(capsys, tmp_path):
    from morca_env.cli import experiment_parser

    p = experiment_parser("doc")
    args = p.parse_args(["--out", "x", "--env-kwargs", '{"r_max": 60}', "--workers", "2"])
    assert (args.env, args.env_kwargs, args.workers, args.threads, str(args.out)) == ("MorcaTiny-v0", {"r_max": 60}, 2,
                                                                                   None, "x")
    for bad, named in ((["--out", "x", "--workers", "0"], "'0' is not a positive integer"),
                       (["--out", "x", "--env-kwargs", "[1]"], "not a JSON object"), ([], "--out")):
        with pytest.raises(SystemExit):
            p.parse_args(bad)
        assert named in capsys.readouterr().err
    trajectory = headroom_trajectory
    with pytest.raises(SystemExit):
        trajectory.main(["--out", str(tmp_path / "out"), "--branch-at", "0.5", "1.0"])  # refused before any work
    assert "--branch-at [1.0]: each fraction must lie in (0, 1)" in capsys.readouterr().err
