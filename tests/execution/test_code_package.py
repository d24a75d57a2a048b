"""Shipping a code folder to ranks on other nodes: what is packed, its identity, unpacking."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from infrarsi.errors import JobError
from infrarsi.execution.code_package import list_files, materialize, pack


def _job(folder: Path) -> Path:
    (folder / "my_job").mkdir(parents=True)
    (folder / "my_job" / "__init__.py").write_text("def make_job(ctx):\n    return 1\n")
    (folder / "my_job" / "vocab.txt").write_text("a b c\n")
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "x.pyc").write_bytes(b"\0")
    (folder / ".hidden").mkdir()
    (folder / ".hidden" / "secret").write_text("no")
    return folder


def test_outside_git_every_file_ships_but_hidden_folders_and_caches(tmp_path: Path) -> None:
    root = _job(tmp_path / "job")
    assert list_files(root) == ["my_job/__init__.py", "my_job/vocab.txt"]


def test_in_git_what_git_would_commit_ships_and_include_narrows_it(tmp_path: Path) -> None:
    root = _job(tmp_path / "repo")
    (root / ".gitignore").write_text("big.bin\n")
    (root / "big.bin").write_bytes(b"x" * 10)
    (root / "workloads").mkdir()
    (root / "workloads" / "m.py").write_text("x = 1\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    names = list_files(root)
    assert "big.bin" not in names and ".gitignore" in names and "workloads/m.py" in names
    assert list_files(root, include=("workloads",)) == ["workloads/m.py"]


def test_the_digest_is_the_content_and_unpacking_gives_the_same_files(tmp_path: Path) -> None:
    root = _job(tmp_path / "job")
    a, b = pack(root), pack(root)
    assert a.digest == b.digest and a.files == 2
    (root / "my_job" / "vocab.txt").write_text("a b c d\n")
    assert pack(root).digest != a.digest
    here = materialize(a.digest, a.data, tmp_path / "cache")
    assert (here / "my_job" / "__init__.py").read_text().startswith("def make_job")
    assert (here / "my_job" / "vocab.txt").read_text() == "a b c\n"
    assert (
        materialize(a.digest, b"not read again", tmp_path / "cache") == here
    )  # unpacked once per node


def test_a_folder_too_large_to_ship_is_a_job_error_naming_it(tmp_path: Path) -> None:
    root = _job(tmp_path / "job")
    with pytest.raises(JobError, match=r"data\.path"):
        pack(root, max_bytes=4)
