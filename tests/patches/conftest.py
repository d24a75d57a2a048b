"""The ``repo`` fixture of the ``infrarsi.patches`` tests: a fresh git repository per test."""

from __future__ import annotations

from pathlib import Path

import git
import pytest

from tests.patches.repo_helpers import make_repo


@pytest.fixture
def repo(tmp_path: Path) -> git.Repo:
    return make_repo(tmp_path / "repo")
