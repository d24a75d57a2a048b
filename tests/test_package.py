"""Whole-package checks: no import cycles, a docstring atop every module, a pure search core,
and tests laid out one to one like the package they test."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "infrarsi"
TESTS = ROOT / "tests"

WHOLE_PACKAGE_TESTS = {"test_package.py"}
"""Test files of the package as a whole (this file), exempt from the one-to-one rule."""
OTHER_TREES = {"workloads": ROOT / "workloads", "benchmarks": ROOT / "benchmarks", "scripts": ROOT / "scripts",
               "examples": ROOT / "examples"}
"""Test folders that mirror a source tree other than the package (``tests/X/...`` mirrors
``infrarsi/X/...`` for every other X). ``scripts/`` holds shell scripts: ``tests/scripts/test_X.py``
tests ``scripts/X.sh``."""


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules of ``known`` that ``name`` imports anywhere (function bodies and TYPE_CHECKING
    blocks included): ``from pkg import sub`` counts as importing ``pkg.sub`` when it is a module."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in known:
                    out.add(sub)
                elif base in known:
                    out.add(base)
    out.discard(name)
    return out


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    mods = package_modules()
    graph = {name: imports_of(name, path, set(mods)) for name, path in mods.items()}
    assert import_cycles(graph) == []


@pytest.mark.parametrize("name", sorted(package_modules()))
def test_every_module_says_what_it_is(name: str) -> None:
    doc = ast.get_docstring(ast.parse(package_modules()[name].read_text()))
    assert doc, f"{name}: add a module docstring whose first line says what the module is"
    first = doc.splitlines()[0].strip()
    assert first and first.endswith((".", ":", "?")), f"{name}: the docstring's first line is a sentence: {first!r}"


def test_files_cited_in_docstrings_exist() -> None:
    """The docs that live outside the repository are never cited as if they were in it."""
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        for outside in ("DESIGN.md", "NOTES.md", "TEAM_BRIEF.md"):
            assert outside not in text, f"{path.relative_to(ROOT)} cites {outside}, which is not in the repository"


def test_the_search_core_never_imports_ray() -> None:
    mods = package_modules()
    for name, path in mods.items():
        if not name.startswith("infrarsi.search"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "ray" or n.startswith("ray.") for n in names), f"{name} imports Ray"


def mirror_target(test_file: Path) -> Path:
    """The source module or package that ``tests/.../test_X.py`` tests."""
    parts = list(test_file.relative_to(TESTS).parts)
    stem = parts[-1].removeprefix("test_").removesuffix(".py")
    if len(parts) > 1 and parts[0] in OTHER_TREES:
        return OTHER_TREES[parts[0]].joinpath(*parts[1:-1], stem)
    return PACKAGE.joinpath(*parts[:-1], stem)


def test_tests_mirror_the_package() -> None:
    unmatched = []
    for test_file in sorted(TESTS.rglob("test_*.py")):
        if test_file.name in WHOLE_PACKAGE_TESTS and test_file.parent == TESTS:
            continue
        target = mirror_target(test_file)
        if not (target.with_suffix(".py").is_file() or (target / "__init__.py").is_file()
                or (target.parent == ROOT / "scripts" and target.with_suffix(".sh").is_file())):
            unmatched.append(f"{test_file.relative_to(ROOT)} (no {target.relative_to(ROOT)}.py)")
    assert unmatched == [], "each test file tests the module of the same path: " + ", ".join(unmatched)
