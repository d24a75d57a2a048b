"""The prepared GPU check: its inputs load, and without CUDA it runs to the end, skipping each CUDA step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infrarsi.execution.knobs import check_handlers
from infrarsi.search import SearchSpace
from infrarsi.workload import Workload

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


@pytest.mark.parametrize("name", ["dense_1gpu", "dense_1gpu_fast", "hf_llama_1b_gpu"])
def test_the_checked_workloads_and_their_space_load(name: str) -> None:
    wl = Workload.from_yaml(ROOT / "workloads" / f"{name}.yaml")
    assert (wl.resources.device, wl.resources.workers, wl.tokens_per_step, wl.data.seq_len) == (
        "cuda",
        1,
        32768,
        2048,
    )
    space = SearchSpace.from_yaml(wl.search_space_path())
    check_handlers([k.name for k in space.knobs], source=str(wl.search_space_path()))
    assert set(wl.baseline) <= {k.name for k in space.knobs}
    space.validate(dict(wl.baseline), where=name)


def test_without_cuda_every_cuda_step_is_skipped(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "GPU_CHECK_CUDA": "0",
        "RUN_DIR": str(tmp_path / "run"),
        "PY": sys.executable,
        "PYTHONPATH": str(ROOT),
    }
    out = subprocess.run(
        ["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    for s in (
        "S1 plain-PyTorch reference",
        "S2 baseline trial",
        "S3 fast trial",
        "S4 OOM trial",
        "S5 tune",
        "S7 study from the plain loop's config",
        "S8 HF Llama 1B trials",
    ):
        assert f"{s}: SKIPPED (no CUDA)" in out.stdout, out.stdout
    assert "SUMMARY" in out.stdout and "no trials ran" in out.stdout
    # S0 needs no GPU: the space's code patches (workloads/patches/, alone and in sets) apply to HEAD
    assert "apply: rc=0" in out.stdout and "workloads/patches/compile_block.diff" in out.stdout, (
        out.stdout
    )
    assert (tmp_path / "run" / "gpu_check.log").is_file()


def test_gpu_check_steps_picks_the_steps(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "GPU_CHECK_CUDA": "1",
        "GPU_CHECK_STEPS": "",
        "RUN_DIR": str(tmp_path / "run"),
        "PY": sys.executable,
        "PYTHONPATH": str(ROOT),
    }
    out = subprocess.run(
        ["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    for s in ("S1", "S2", "S3", "S4", "S5", "S6", "S7", "S8"):
        assert f"{s}: SKIPPED (not in GPU_CHECK_STEPS)" in out.stdout, out.stdout
