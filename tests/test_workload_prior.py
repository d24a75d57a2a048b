"""Building a workload's analytic prior."""

from __future__ import annotations

from pathlib import Path

import pytest

from infrarsi.search.priors.transformer import TransformerPrior
from infrarsi.workload import Workload
from infrarsi.workload_prior import prior_for_workload

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "name",
    ["dense_debug", "moe_debug", "surrogate_dense_1node", "surrogate_dense_2node", "dense_1gpu"],
)
def test_bundled_workloads_have_a_prior(name: str) -> None:
    wl = Workload.from_yaml(ROOT / "workloads" / f"{name}.yaml")
    p = prior_for_workload(wl)
    assert isinstance(p, TransformerPrior)
    assert p.shape.world_size == wl.world_size
    assert p.shape.global_batch * wl.data.seq_len == wl.tokens_per_step


def test_dense_debug_param_count_matches_the_model() -> None:
    from workloads.models import build_model

    wl = Workload.from_yaml(ROOT / "workloads" / "dense_debug.yaml")
    p = prior_for_workload(wl)
    assert p is not None
    n = sum(t.numel() for t in build_model("dense", "debug").parameters())
    assert abs(p.shape.num_params - n) / n < 0.02


def test_prior_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFRARSI_PRIOR", "off")
    assert prior_for_workload(Workload.from_yaml(ROOT / "workloads" / "dense_debug.yaml")) is None


def test_unknown_flavour_runs_without_a_prior() -> None:
    wl = Workload.from_yaml(ROOT / "workloads" / "dense_debug.yaml")
    wl = wl.model_copy(update={"model": wl.model.model_copy(update={"size": "no_such_size"})})
    assert prior_for_workload(wl) is None


def test_prior_found_from_outside_the_repository(tmp_path: Path) -> None:
    """The study's driver is a console script: ``workloads`` is not on its path (the demo hit this)."""
    import subprocess
    import sys

    code = (
        "import sys; sys.path = [p for p in sys.path if p not in ('', '.')]\n"
        "from infrarsi.workload import Workload\n"
        "from infrarsi.workload_prior import prior_for_workload\n"
        f"p = prior_for_workload(Workload.from_yaml({str(ROOT / 'workloads' / 'dense_debug.yaml')!r}))\n"
        "print(p is not None and p.shape.num_params > 0)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"},
    )
    assert out.stdout.strip().splitlines()[-1] == "True", out.stderr


def test_cpu_prior_assumes_no_bf16_gain_and_gpu_prior_does() -> None:
    cpu = prior_for_workload(Workload.from_yaml(ROOT / "workloads" / "dense_debug.yaml"))
    gpu = prior_for_workload(Workload.from_yaml(ROOT / "workloads" / "surrogate_dense_1node.yaml"))
    assert cpu is not None and gpu is not None
    for p, ratio in ((cpu, 1.0), (gpu, 2.0)):
        cfg = {"zero_stage": 1, "micro_batch_size": 1}
        T16, _ = p.terms([{**cfg, "dtype": "bf16"}])
        T32, _ = p.terms([{**cfg, "dtype": "fp32"}])
        assert abs(T32[0, 1] / T16[0, 0] - ratio) < 1e-9
