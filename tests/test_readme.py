"""The README's Python examples run as written (blocks marked `# needs a GPU` are skipped)."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_blocks():
    text = (ROOT / "README.md").read_text()
    return [b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "# needs a GPU" not in b]


def test_readme_has_runnable_examples():
    blocks = readme_blocks()
    assert len(blocks) >= 4
    assert any("MaskablePPO" in b for b in blocks) and any("d3rlpy" in b for b in blocks)
    assert any("accelerate(" in b for b in blocks)


def test_readme_examples_run(tmp_path):
    script = "import torch\ntorch.set_num_threads(1)\n" + "\n\n".join(readme_blocks())
    (tmp_path / "readme_examples.py").write_text(script)
    env = {**os.environ, "MINARI_DATASETS_PATH": str(tmp_path / "minari"), "MORCA_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, str(tmp_path / "readme_examples.py")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
