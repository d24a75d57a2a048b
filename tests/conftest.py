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
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
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
def study(tmp_path: Path) -> Path:
    """An initialised surrogate study (``tests/fixtures/stages/surrogate_small.yaml``) with two
    editable knobs (``micro_batch_size``, ``zero_stage``), a 4-trial budget and no bank: what the
    proposal protocol's tests (CLI, Python API, MCP server) start from. A test module may define
    its own ``study`` instead."""
    from infrarsi.stages.init import init_stage

    d = tmp_path / "study"
    init_stage(
        TESTS_DIR / "fixtures" / "stages" / "surrogate_small.yaml",
        d,
        editable_knobs=["micro_batch_size", "zero_stage"],
        trials=4,
        bank="off",
    )
    return d


@pytest.fixture(scope="session")
def doctored_honest_study(tmp_path_factory: pytest.TempPathFactory, ray_local: str) -> Path:
    """A study of the honest twin of the cheat fixtures (``tests/fixtures/cheats/honest.yaml``:
    dense debug, 2 ranks, 4-step trials, ZeRO-0 micro-batch 8), initialised and doctored (2
    baseline repeats and the honest changes) once per session, for the integration tests that
    need a calibrated study (the executor's cheats, the long check). Tests add rows to its log;
    none may rely on the log holding only its own."""
    from infrarsi.stages.doctor import doctor_stage
    from infrarsi.stages.init import init_stage

    d = tmp_path_factory.mktemp("honest") / "study"
    init_stage(TESTS_DIR / "fixtures" / "cheats" / "honest.yaml", d)
    doctor_stage(d, repeats=2)
    return d


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


_CLUSTER_SCRIPT = """
import sys
from ray.cluster_utils import Cluster
c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0}, connect=False)
for _ in range(2):
    c.add_node(num_cpus=2)
c.wait_for_nodes()
print(c.address, flush=True)
try:
    sys.stdin.read()  # until the test session closes our stdin
finally:
    c.shutdown()
"""


@pytest.fixture(scope="session")
def two_node_cluster() -> Iterator[str]:
    """A separate Ray cluster of two raylets with 2 CPUs each (and a head with none), run by a
    ``ray.cluster_utils.Cluster`` in a child process; yields its address for ``--address``."""
    import subprocess

    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.Popen(
        [sys.executable, "-c", _CLUSTER_SCRIPT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().strip()
        if not address:
            pytest.fail("the 2-raylet test cluster did not start")
        yield address
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
