"""Whole-package checks: no import cycles, a docstring atop every module, a pure search core,
tests laid out one to one like the package they test, and a wheel that runs on its own."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "infrarsi"
TESTS = ROOT / "tests"

WHOLE_PACKAGE_TESTS = {"test_package.py", "test_docs.py"}
"""Test files of the package or the repository as a whole (this file; the README and docs/ links),
exempt from the one-to-one rule."""
OTHER_TREES = {
    "workloads": ROOT / "workloads",
    "benchmarks": ROOT / "benchmarks",
    "scripts": ROOT / "scripts",
    "examples": ROOT / "examples",
}
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
    assert first and first.endswith((".", ":", "?")), (
        f"{name}: the docstring's first line is a sentence: {first!r}"
    )


LONG_MODULE_LINES = 500
"""A module longer than this says in its docstring why it is one concept (``Why one module:``)."""


def test_a_long_module_says_why_it_is_one() -> None:
    long = [
        p
        for p in sorted([*PACKAGE.rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")])
        if len(p.read_text().splitlines()) > LONG_MODULE_LINES
    ]
    silent = [
        str(p.relative_to(ROOT))
        for p in long
        if "Why one module:" not in (ast.get_docstring(ast.parse(p.read_text())) or "")
    ]
    assert silent == [], (
        f"over {LONG_MODULE_LINES} lines: split them, or say in the docstring why each is one "
        f"concept ('Why one module: ...')"
    )


def test_files_cited_in_docstrings_exist() -> None:
    """The docs that live outside the repository are never cited as if they were in it."""
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        for outside in ("DESIGN.md", "NOTES.md", "TEAM_BRIEF.md"):
            assert outside not in text, (
                f"{path.relative_to(ROOT)} cites {outside}, which is not in the repository"
            )


def test_the_search_core_never_imports_ray() -> None:
    mods = package_modules()
    for name, path in mods.items():
        if not name.startswith("infrarsi.search"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            )
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
        if not (
            target.with_suffix(".py").is_file()
            or (target / "__init__.py").is_file()
            or (target.parent == ROOT / "scripts" and target.with_suffix(".sh").is_file())
        ):
            unmatched.append(f"{test_file.relative_to(ROOT)} (no {target.relative_to(ROOT)}.py)")
    assert unmatched == [], "each test file tests the module of the same path: " + ", ".join(
        unmatched
    )


# ----------------------------------------------------------------------------- dependencies
DIST_MODULES = {
    "ray": "ray",
    "torch": "torch",
    "deepspeed": "deepspeed",
    "botorch": "botorch",
    "gpytorch": "gpytorch",
    "scipy": "scipy",
    "pyarrow": "pyarrow",
    "nvidia-ml-py": "pynvml",
    "gitpython": "git",
    "structlog": "structlog",
    "typer": "typer",
    "rich": "rich",
    "pydantic": "pydantic",
    "pyyaml": "yaml",
    "matplotlib": "matplotlib",
    "numpy": "numpy",
    "mcp": "mcp",
    "transformers": "transformers",
    "accelerate": "accelerate",
    "ax-platform": "ax",
    "optuna": "optuna",
    "psutil": "psutil",
    "fsspec": "fsspec",
    "torchao": "torchao",
}
"""Distribution name (as pyproject spells it, lower case) -> the module it installs."""
FIRST_PARTY = {"infrarsi", "workloads"}
"""Top-level modules of this repository that ``infrarsi/`` imports."""
OPTIONAL_WITHOUT_EXTRA = {"fsspec"}
"""Modules imported only under ``try/except ImportError`` with no extra of their own (the bank's
"any fsspec protocol", with a fix naming ``pip install fsspec`` when it is absent)."""


def _guards_import_error(node: ast.Try) -> bool:
    names: list[str] = []
    for h in node.handlers:
        types = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type] if h.type else []
        names += [t.id for t in types if isinstance(t, ast.Name)]
    return bool({"ImportError", "ModuleNotFoundError"} & set(names))


def third_party_imports(files: list[Path]) -> tuple[set[str], set[str]]:
    """(required, optional): the top-level third-party modules ``files`` import anywhere
    (function bodies included); optional ones are imported only inside a ``try`` whose handler
    catches ``ImportError``."""
    import sys

    required: set[str] = set()
    optional: set[str] = set()

    def visit(node: ast.AST, guarded: bool) -> None:
        if isinstance(node, ast.Try):
            inner = guarded or _guards_import_error(node)
            for child in node.body:
                visit(child, inner)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(child, guarded)
            return
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        for n in names:
            top = n.split(".")[0]
            if top not in sys.stdlib_module_names and top not in FIRST_PARTY:
                (optional if guarded else required).add(top)
        for child in ast.iter_child_nodes(node):
            visit(child, guarded)

    for f in files:
        visit(ast.parse(f.read_text()), False)
    return required, optional - required


def _dist_name(requirement: str) -> str:
    import re

    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert m, requirement
    return m.group(1).lower().replace("_", "-")


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _modules_of(requirements: list[str], where: str, *, strict: bool = True) -> set[str]:
    """The modules ``requirements`` install; ``strict``: every one must be in ``DIST_MODULES``
    (extras may hold tools, such as ruff, that install no module infrarsi could import)."""
    dists = {_dist_name(r) for r in requirements}
    unknown = dists - set(DIST_MODULES)
    assert not (strict and unknown), (
        f"{where}: add the module each installs to DIST_MODULES: {sorted(unknown)}"
    )
    return {DIST_MODULES[d] for d in dists - unknown}


def test_runtime_dependencies_are_exactly_what_the_package_imports() -> None:
    """A dependency nothing imports (ax-platform, psutil were) cannot come back, and an import
    without its dependency (scipy was) is caught."""
    project = _pyproject()["project"]
    declared = _modules_of(project["dependencies"], "pyproject.toml [project] dependencies")
    required, optional = third_party_imports(sorted(PACKAGE.rglob("*.py")))
    assert declared - required == set(), (
        f"declared but never imported by infrarsi/: {sorted(declared - required)}"
    )
    assert required - declared == set(), (
        f"imported by infrarsi/ but not declared: {sorted(required - declared)}"
    )
    extras = set().union(
        *(
            _modules_of(reqs, f"extra {name}", strict=False)
            for name, reqs in project["optional-dependencies"].items()
        )
    )
    assert optional <= extras | OPTIONAL_WITHOUT_EXTRA, (
        f"imported under try/except ImportError but in no extra: {sorted(optional - extras - OPTIONAL_WITHOUT_EXTRA)}"
    )


def test_the_import_scan_sees_lazy_and_guarded_imports(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "import os\nimport numpy as np\nfrom infrarsi import units\n"
        "def f():\n    from scipy.stats import binom\n"
        "    try:\n        import fsspec\n    except ImportError:\n        import ray\n"
        "try:\n    import psutil\nexcept ValueError:\n    pass\n"
    )
    required, optional = third_party_imports([src])
    assert required == {"numpy", "scipy", "ray", "psutil"} and optional == {"fsspec"}


# ----------------------------------------------------------------------------- the wheel
WHEEL_SOURCES = ("pyproject.toml", "README.md", "infrarsi", "workloads", "search_spaces")
"""What the build reads: the wheel is built from a copy of these (the checkout stays clean)."""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this checkout, built offline with the project's own setuptools."""
    src = tmp_path_factory.mktemp("src")
    for name in WHEEL_SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name,
                src / name,
                symlinks=True,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
            )
        else:
            shutil.copy2(ROOT / name, src / name)
    dist = tmp_path_factory.mktemp("dist")
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(dist),
            str(src),
        ],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (whl,) = dist.glob("infrarsi-*.whl")
    return whl


def test_the_wheel_ships_the_builtin_spaces_models_and_patches_and_no_test_code(
    wheel: Path,
) -> None:
    """An installed infrarsi runs a built-in workload with nothing copied from the repository:
    every search space (``builtin:NAME``, the very bytes of ``search_spaces/``), the ``workloads``
    package (models, the ``workloads.jobs:builtin_job`` entry point, code patches)."""
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for space in sorted((ROOT / "search_spaces").glob("*.yaml")):
            assert z.read(f"infrarsi/search_spaces/{space.name}") == space.read_bytes(), space.name
        shipped = {
            p.relative_to(ROOT).as_posix()
            for p in (ROOT / "workloads").rglob("*")
            if p.suffix in (".py", ".diff") and "__pycache__" not in p.parts
        }
        assert {"workloads/jobs.py", "workloads/models/moe/expert_parallel.py"} <= shipped <= names
        assert "infrarsi/py.typed" in names and "infrarsi/workload.py" in names
    assert not [
        n
        for n in names
        if n.startswith(("tests/", "search_spaces/", "benchmarks/")) or "cheats" in n
    ]


def _fresh_venv(folder: Path, wheel: Path) -> Path:
    """A new venv holding only the wheel, that sees the project venv's dependencies (torch, Ray,
    DeepSpeed...) through a plain ``.pth`` line: not through its site dir, whose editable-install
    hook would import infrarsi from the checkout. Returns its ``bin`` folder."""
    import site

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    (purelib,) = folder.glob("lib/python*/site-packages")
    deps = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (purelib / "_project_dependencies.pth").write_text("\n".join(deps) + "\n")
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(folder / "bin" / "python"),
            "install",
            "--no-deps",
            "--no-index",
            "-q",
            str(wheel),
        ],
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    return folder / "bin"


@pytest.mark.integration
def test_the_installed_wheel_alone_runs_a_builtin_family_and_inits_a_users_job(
    wheel: Path, tmp_path: Path
) -> None:
    """From a folder outside the repository, with no PYTHONPATH: ``infrarsi trial`` trains the
    built-in dense family with its family's default space; ``infrarsi init`` takes a user's job
    with ``search_space: builtin:deepspeed_dense``; an unknown ``builtin:`` name exits 2."""
    import yaml

    from tests.outside_job import write_tiny_workload

    bin_dir = _fresh_venv(tmp_path / "venv", wheel)
    work = tmp_path / "user"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        RAY_AUTH_MODE="disabled",
        INFRARSI_BANK="off",
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
    )

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), cwd=work, env=env, capture_output=True, text=True)

    where = run(
        str(bin_dir / "python"),
        "-c",
        "import infrarsi, workloads; print(infrarsi.__file__, workloads.__file__)",
    )
    assert where.returncode == 0, where.stderr
    assert all(Path(f).is_relative_to(tmp_path / "venv") for f in where.stdout.split()), (
        where.stdout
    )

    (work / "dense.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "dense_from_wheel",
                "model": {"family": "dense", "overrides": {"n_layers": 1}},
                "data": {"seq_len": 32},
                "tokens_per_step": 256,
                "steps": {"warmup": 0, "measured": 2},
                "resources": {"workers": 1},
                "baseline": {"zero_stage": 0, "micro_batch_size": 8},
            }
        )
    )
    trial = run(str(bin_dir / "infrarsi"), "trial", "dense.yaml")
    assert trial.returncode == 0, trial.stdout[-3000:] + trial.stderr[-3000:]
    assert re.search(r"status\s*│\s*ok", trial.stdout), trial.stdout[-3000:]

    job = write_tiny_workload(work)
    data = yaml.safe_load(job.read_text())
    job.write_text(yaml.safe_dump({**data, "search_space": "builtin:deepspeed_dense"}))
    init = run(str(bin_dir / "infrarsi"), "init", str(job), "--study", "study")
    assert init.returncode == 0, init.stdout[-3000:] + init.stderr[-3000:]
    contract = yaml.safe_load((work / "study" / "contract.yaml").read_text())
    assert Path(contract["search_space_path"]).is_relative_to(tmp_path / "venv")

    job.write_text(yaml.safe_dump({**data, "search_space": "builtin:no_such_space"}))
    bad = run(str(bin_dir / "infrarsi"), "init", str(job), "--study", "bad")
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert (
        "builtin:no_such_space" in bad.stdout + bad.stderr
        and "builtin:deepspeed_moe" in bad.stdout + bad.stderr
    )
