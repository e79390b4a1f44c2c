"""The GPU check prepared: benchmarks/bench_wan_gpu.py at its real config (counted) and at --tiny on the CPU."""

import importlib
import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    return importlib.import_module("benchmarks.bench_wan_gpu")  # the checkout's root is on the tests' pythonpath


def test_the_real_config_is_wan21_t2v_1_3b(bench):
    assert 1.40e9 < bench.count_parameters(bench.WAN21_T2V_1_3B) < 1.45e9  # 1.42B (DESIGN.md, component sizes)


def test_the_latency_line_is_a_least_squares_fit(bench):
    intercept, slope, residual = bench.fit_line([0, 10, 20], [50.0, 40.0, 30.5])
    assert intercept == pytest.approx(49.917, abs=1e-3) and slope == pytest.approx(-0.975)
    assert residual == pytest.approx(0.1667, abs=1e-3)


def test_tiny_run_on_the_cpu_reports_every_number(bench, tmp_path):
    out = tmp_path / "wan.json"
    assert bench.main(["--tiny", "--steps", "6", "--ks", "0", "2", "4", "--out", str(out), "--batches", "1", "3",
                       "--reference-cache-dir", str(tmp_path / "refs")]) == 0
    result = json.loads(out.read_text())
    assert result["tiny"] and result["steps"] == 6 and [r["K"] for r in result["episodes"]] == [0, 2, 4]
    assert result["full_step_s"] > 0 and result["reuse_step_s"] > 0
    assert all(0 < r["overhead_share"] < 1 and r["latency_s"] > 0 for r in result["episodes"])
    assert result["max_budget"] == 4 and result["line"]["intercept_s"] > 0
    assert [b["num_envs"] for b in result["batches"]] == [1, 3] and all(b["videos_per_s"] > 0 for b in result["batches"])


def test_bad_input_and_no_cuda_are_clear(bench, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--tiny", "--steps", "2"])
    assert "--steps 2: valid: an integer >= 3" in capsys.readouterr().err
    with pytest.raises(ValueError, match="budget"):
        bench.main(["--tiny", "--steps", "6", "--ks", "99"])
    if not torch.cuda.is_available():  # `make bench` runs every benchmark: a CPU machine skips this one
        assert bench.main([]) == 0 and "no CUDA device here" in capsys.readouterr().out
