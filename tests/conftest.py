"""Shared test set-up: Ray without token auth, the repo root importable, one local Ray per session.

Integration tests (marked ``integration``) run by default; ``-m "not integration"`` skips them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# Tests never write to the user's experience bank (~/.cache/infrarsi/bank): a contract a test
# makes records the bank switch from this default ("off") unless the test names a bank itself.
os.environ.setdefault("INFRARSI_BANK", "off")

REPO_ROOT = Path(__file__).resolve().parents[1]
TESTS_DIR = Path(__file__).resolve().parent
for _p in (REPO_ROOT, TESTS_DIR):  # the repo root, and tests/ for shared helpers (synthetic_study)
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))


@pytest.fixture(scope="session")
def ray_local() -> Iterator[str]:
    """A local Ray (2 CPUs, no dashboard) shared by every integration test; yields its address."""
    import ray

    started = False
    if not ray.is_initialized():
        # address="local": always a fresh local Ray, even when RAY_ADDRESS is set in the environment
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
        started = True
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        if started:
            ray.shutdown()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root (holds ``workloads/`` and ``search_spaces/``)."""
    return REPO_ROOT


@pytest.fixture
def make_unwritable() -> Iterator[Callable[[Path], None]]:
    """``make_unwritable(dir)``: nobody may create files in ``dir`` until the test ends.

    As a regular user: ``chmod 0500``. As root, whom mode bits do not stop: the immutable
    attribute (``chattr +i``), which stops root too; skips when the filesystem has none."""
    import shutil
    import subprocess

    done: list[tuple[Path, int]] = []
    root = os.geteuid() == 0

    def make(d: Path) -> None:
        mode = d.stat().st_mode
        if root:
            chattr = shutil.which("chattr")
            if chattr is None:
                pytest.skip("running as root without chattr: no way to make a directory unwritable")
            proc = subprocess.run([chattr, "+i", str(d)], capture_output=True, text=True)
            if proc.returncode != 0:
                pytest.skip(f"running as root and chattr +i failed here: {proc.stderr.strip()}")
        else:
            d.chmod(0o500)
        done.append((d, mode))

    try:
        yield make
    finally:
        for d, mode in reversed(done):
            if root:
                subprocess.run(["chattr", "-i", str(d)], check=False)
            d.chmod(mode & 0o7777)
