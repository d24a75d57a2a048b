"""``scripts/bootstrap.sh``: installs held to ``constraints.txt``, idempotent on a stamp that
includes the constraints, and a torch other than the default keeps its own dependencies' pins.

The script's logic runs in a scratch copy of the repository's bootstrap inputs, against a stand-in
``.venv/bin/python`` that records its calls (pip is never run; the constraint filter runs in the
real interpreter). A fresh clone in CI runs the script for real."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

STAND_IN = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
case "$1" in
  -c) case "$2" in *__version__*) exit "${TORCH_IS_DEFAULT_RC:-0}" ;; *) exit 0 ;; esac ;;
  -) exec "$REAL_PYTHON" "$@" ;;
esac
exit 0
"""
"""``python -c`` (import checks: pass; the torch-version check: ``TORCH_IS_DEFAULT_RC``), ``python -``
(the constraint filter: the real interpreter) and ``python -m pip`` (recorded only)."""


def _scratch(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in ("pyproject.toml", "constraints.txt", "scripts/bootstrap.sh"):
        shutil.copy2(ROOT / name, repo / name)
    python = repo / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(STAND_IN)
    python.chmod(0o755)
    return repo


def _bootstrap(repo: Path, **env: str) -> list[str]:
    calls = repo / "calls.log"
    calls.unlink(missing_ok=True)
    full = {k: v for k, v in os.environ.items() if k not in ("INFRARSI_TORCH", "INFRARSI_EXTRAS")}
    full.update(CALLS=str(calls), REAL_PYTHON=sys.executable, **env)
    out = subprocess.run(
        ["bash", str(repo / "scripts" / "bootstrap.sh")], env=full, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return calls.read_text().splitlines() if calls.exists() else []


def _pip_installs(calls: list[str]) -> list[str]:
    return [c for c in calls if c.startswith("-m pip install") and "--upgrade pip" not in c]


def test_installs_are_held_to_the_constraints_and_a_second_run_does_nothing(tmp_path: Path) -> None:
    repo = _scratch(tmp_path)
    assert _pip_installs(_bootstrap(repo)) == [
        "-m pip install -q -c constraints.txt -e .[dev,hf,agents]"
    ]
    assert _pip_installs(_bootstrap(repo)) == []  # the stamp matches and everything imports
    with (repo / "constraints.txt").open("a") as f:
        f.write("# a deliberate upgrade\n")
    assert _pip_installs(_bootstrap(repo)) == [
        "-m pip install -q -c constraints.txt -e .[dev,hf,agents]"
    ]


def test_another_torch_keeps_its_own_dependencies_pins(tmp_path: Path) -> None:
    repo = _scratch(tmp_path)
    installs = _pip_installs(
        _bootstrap(repo, INFRARSI_TORCH="torch==2.11.0", TORCH_IS_DEFAULT_RC="1")
    )
    assert installs == [
        "-m pip install -q torch==2.11.0",
        "-m pip install -q -c .venv/.infrarsi-constraints.txt -e .[dev,hf,agents]",
    ]
    pins = (repo / ".venv" / ".infrarsi-constraints.txt").read_text()
    names = {line.split("==")[0].lower() for line in pins.splitlines() if "==" in line}
    assert "sympy" not in names and "networkx" not in names  # torch's own dependencies
    assert {"ray", "deepspeed", "botorch", "pyarrow"} <= names


def test_the_constraints_pin_every_dependency_but_torch_and_infrarsi() -> None:
    lines = [
        x
        for x in (ROOT / "constraints.txt").read_text().splitlines()
        if x and not x.startswith("#")
    ]
    assert all("==" in x for x in lines), [x for x in lines if "==" not in x]
    names = {x.split("==")[0].lower().replace("_", "-") for x in lines}
    assert not names & {"torch", "infrarsi"}
    assert {
        "ray",
        "deepspeed",
        "botorch",
        "gpytorch",
        "pyarrow",
        "pydantic",
        "pytest",
        "hypothesis",
        "ruff",
        "mypy",
        "transformers",
        "mcp",
    } <= names
