"""The package's shape, read from the source (`ast`), so it stays true: no import cycle among the modules of
`morca_env` and `agents` (lazy imports inside functions included), no private name imported from another
module, and `morca_env` never imports `agents` (learned schedulers join its registry through an entry point)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("morca_env", "agents")


def module_files() -> dict[str, Path]:
    files = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


MODULES = module_files()


def imports_of(name: str) -> list[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every import statement in module `name`, anywhere."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.append((submodule, None, node.lineno) if submodule in MODULES
                             else (source, alias.name, node.lineno))
    return found


def project_module(imported: str) -> str | None:
    """The project module an import resolves to, or None for other packages."""
    if imported.split(".")[0] not in PACKAGES:
        return None
    if imported not in MODULES:
        raise AssertionError(f"import of {imported!r}, which is not a module of this project")
    return imported


def graph() -> dict[str, set[str]]:
    edges = {name: set() for name in MODULES}
    for name in MODULES:
        for imported, _, _ in imports_of(name):
            target = project_module(imported)
            if target is not None and target != name:
                edges[name].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_the_checks_see_what_they_check():
    """The checker on a hand-made graph, and on imports it must resolve (relative, lazy, `from . import x`)."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    env_imports = {m for m, _, _ in imports_of("morca_env.env")}
    assert "morca_env.budget" in env_imports and "morca_env.diffusion.signals" in env_imports
    assert "morca_env.schedulers.rules.runtime" in {m for m, _, _ in imports_of("morca_env.accelerate")}  # lazy
    assert "morca_env.data" in graph()["morca_env"]  # a lazy import in a module __getattr__
    with pytest.raises(AssertionError, match="not a module of this project"):
        project_module("morca_env.policies")  # a stale path


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_no_private_name_crosses_a_module():
    crossing = [f"{name}:{line} imports {imported}.{symbol}" for name in MODULES
                for imported, symbol, line in imports_of(name)
                if symbol and symbol.startswith("_") and not symbol.startswith("__")
                and project_module(imported) not in (None, name)]
    assert crossing == []


def test_morca_env_never_imports_agents():
    reaching = [f"{name}:{line} imports {imported}" for name in MODULES if name.startswith("morca_env")
                for imported, _, line in imports_of(name) if imported.split(".")[0] == "agents"]
    assert reaching == []


OUTSIDE = ("research", "benchmarks", "examples")  # studies, timing tools and examples: not installed


def test_code_outside_the_package_uses_only_its_public_names():
    """Studies, timing tools and examples import the packages' public names only (no `_x`, no module
    that does not exist), read no private attribute of another object, and nothing installed imports them."""
    misuse = []
    for folder in OUTSIDE:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom) and not node.level and node.module.split(".")[0] in PACKAGES:
                    project_module(node.module)
                    misuse += [f"{path.relative_to(ROOT)}:{node.lineno} imports {node.module}.{a.name}"
                               for a in node.names if a.name.startswith("_")]
                elif (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                      and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                    misuse.append(f"{path.relative_to(ROOT)}:{node.lineno} reads the private .{node.attr}")
    assert misuse == []
    installed = {m for name in MODULES for m, _, _ in imports_of(name)}
    local = {p.stem for folder in OUTSIDE for p in (ROOT / folder).rglob("*.py")}
    assert not installed & local, installed & local


def test_tests_are_organised_by_package_and_load_no_script_by_path():
    tests = ROOT / "tests"
    assert sorted(p.name for p in tests.glob("*.py")) == ["conftest.py"]  # every test lives in its package's folder
    assert {p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))} == {
        "envs", "diffusion", "speedup", "data", "utils", "models", "schedulers", "evaluation", "agents", "cli",
        "project"}
    by_path = [f"{p.relative_to(ROOT)}" for p in tests.rglob("*.py") if p != Path(__file__)
               and any(s in p.read_text() for s in ("spec_from_file_location", "run_path(", "SourceFileLoader"))]
    assert by_path == []  # scripts are run as commands or imported by name


def test_the_package_top_level_shows_its_families():
    """The env's own modules at the top, everything else in a family folder: at most 12 top-level modules."""
    top = sorted(p.stem for p in (ROOT / "morca_env").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 12, top
    families = {p.name for p in (ROOT / "morca_env").iterdir() if (p / "__init__.py").exists()}
    assert {"diffusion", "speedup", "data", "evaluation", "parallel", "utils", "schedulers", "models",
            "commands"} <= families


def test_studies_are_folders_with_a_write_up_and_need_no_pythonpath():
    import tomllib

    studies = [p for p in (ROOT / "research").iterdir() if p.is_dir() and not p.name.startswith((".", "_"))]
    assert studies and all((p / "README.md").exists() for p in studies), [p.name for p in studies]
    assert not list((ROOT / "research").glob("*.py"))  # every script belongs to a study
    pytest_options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert pytest_options["pythonpath"] == ["."]
    assert "research" in pytest_options["testpaths"]
    assert not (ROOT / "scripts").exists()  # `morca <subcommand>` is the only entry
