"""Shared helper of the orchestration scripts (quickstart, ablations): run another script, show its output."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(step: str, args: list[str], env: dict) -> None:
    print(f"\n=== {step}: python {' '.join(args)}", flush=True)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *args], cwd=ROOT, env=env, check=True)
    print(f"=== {step} done in {time.perf_counter() - t0:.0f} s", flush=True)


def resume_flag(run_dir: Path) -> list[str]:
    return ["--resume"] if (run_dir / "latest.json").exists() else []
