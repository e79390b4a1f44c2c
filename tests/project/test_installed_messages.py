"""What the installed package says to its users (docstrings, error and warning messages, help texts) names
commands and package modules, never a path of the repository that a pip install does not have."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = re.compile(r"(?<![\w/.])(scripts|benchmarks|perf|docs|research|examples|tests|datasets)/[\w*]")


def _said(tree: ast.AST):
    """(line, text) of every docstring and of every string in a raise, a warning, a print or a help text."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                yield getattr(node, "lineno", 1), doc
        if isinstance(node, ast.Raise) and node.exc is not None:
            yield from ((n.lineno, n.value) for n in ast.walk(node.exc) if isinstance(n, ast.Constant)
                        and isinstance(n.value, str))
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if name in ("warn", "print", "error", "add_argument", "ArgumentTypeError", "info", "warning"):
                yield from ((n.lineno, n.value) for n in ast.walk(node) if isinstance(n, ast.Constant)
                            and isinstance(n.value, str))


def test_no_message_or_docstring_names_a_path_outside_the_package():
    found = []
    for package in ("morca_env", "agents"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, text in _said(ast.parse(path.read_text())):
                match = OUTSIDE.search(text)
                if match:
                    found.append(f"{path.relative_to(ROOT)}:{line}: ...{text[max(0, match.start() - 30):match.end() + 30]}...")
    assert not found, "paths a pip install lacks:\n" + "\n".join(found)
