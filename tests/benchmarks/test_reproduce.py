"""benchmarks/reproduce.py: the reference workloads pass every pre-trial check, and a results row is
read correctly from a study directory (synthetic studies; one quick real study, integration)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from synthetic_study import BASE, BEST, ROOT, make_study, row, write_rows

from benchmarks.reproduce import (
    MD_HEADER,
    REFERENCE,
    append_row,
    check_workload,
    local_cluster_plan,
    markdown_row,
    resolve_workload,
    study_row,
)
from infrarsi.errors import KnobError, WorkloadError
from infrarsi.search import SearchSpace
from infrarsi.study.contract import Contract
from infrarsi.workload import Workload
from infrarsi.workload_prior import prior_for_workload

GPU = {
    "dense_1node": (8, 1),
    "dense_multinode": (16, 2),
    "moe_1node": (8, 1),
    "moe_multinode": (16, 2),
}
"""Each GPU reference workload's (GPUs, nodes)."""


@pytest.mark.parametrize("name", sorted(GPU))
def test_each_gpu_reference_workload_passes_the_checks(name: str) -> None:
    ref = next(r for r in REFERENCE if r.name == name)
    got = check_workload(resolve_workload(name))
    wl = Workload.from_yaml(resolve_workload(name))
    assert (got["device"], got["world_size"], got["nodes"]) == ("cuda", *GPU[name])
    assert wl.baseline["dtype"] == "bf16" and wl.baseline["zero_stage"] == 3
    assert wl.global_batch_size // wl.world_size == 8  # 8 sequences of 8192 per GPU on all four
    assert wl.data.seq_len == 8192
    space = SearchSpace.from_yaml(wl.search_space_path())
    assert next(k for k in space.knobs if k.name == "dtype").values == ("bf16",)
    assert ("expert_parallel" in space.names) == name.startswith("moe")
    assert prior_for_workload(wl, enabled=True) is not None  # the analytic prior knows the shape
    # the parameter counts the YAML comments state (8.03e9 dense, 8.97e9 MoE)
    assert round(got["num_params"] / 1e7) == (803 if name.startswith("dense") else 897)
    debug = check_workload(resolve_workload(ref.debug))
    assert (debug["device"], debug["world_size"], debug["nodes"]) == ("cpu", 2, GPU[name][1])


def test_the_checks_catch_a_micro_batch_or_an_expert_count_that_cannot_run(tmp_path: Path) -> None:
    raw = yaml.safe_load(resolve_workload("moe_multinode").read_text())
    raw["search_space"] = str(ROOT / "search_spaces" / "gpu_moe.yaml")
    bad_experts = {**raw, "model": {**raw["model"], "overrides": {"n_layers": 1, "num_experts": 8}}}
    (tmp_path / "experts.yaml").write_text(yaml.safe_dump(bad_experts))
    with pytest.raises(WorkloadError, match="8 experts"):
        check_workload(tmp_path / "experts.yaml")
    # 64 sequences over 16 ranks: 4 each, so the space's micro-batch 8 cannot build
    small = {
        **raw,
        "tokens_per_step": 64 * 8192,
        "model": {**raw["model"], "overrides": {"n_layers": 1}},
    }
    (tmp_path / "batch.yaml").write_text(yaml.safe_dump(small))
    with pytest.raises(KnobError, match="micro_batch_size"):
        check_workload(tmp_path / "batch.yaml")


def test_study_row_takes_the_figures_from_the_study(tmp_path: Path) -> None:
    r = study_row(make_study(tmp_path))
    assert r["workload"] == "dense_debug" and r["device"] == "cpu" and r["debug_flavour"]
    assert r["hardware"] == "CPU (debug flavour): 2 ranks on 1 node" and r["device_name"] is None
    # verify's rows measure both sides: baseline 2.00/2.02/2.04 s, best 0.66/0.67/0.68 s
    assert r["baseline_source"] == r["best_source"] == "verify"
    assert r["baseline_step_time_s"] == pytest.approx(2.02) and r[
        "best_step_time_s"
    ] == pytest.approx(0.67)
    assert r["baseline_tokens_per_s"] == pytest.approx(2048 / 2.02)
    assert r["best_mfu"] == pytest.approx(0.01 / 0.67)
    # the speed-up and CI are verify.json's, not recomputed
    assert (r["best_verified"], r["speedup"], r["speedup_ci_low"], r["speedup_ci_high"]) == (
        True,
        3.03,
        2.9,
        3.1,
    )
    assert r["best_config_diff"] == {k: [BASE[k], v] for k, v in BEST.items() if BASE[k] != v}
    # 3 doctor + 6 run + 6 verify trials of 40 device-seconds each; 3 run trials not ok
    assert (r["trials_run"], r["trials_all"]) == (6, 15)
    assert r["trial_statuses"] == {"ok": 12, "oom": 1, "invariant_violation": 1, "failed": 1}
    assert r["device_hours"] == pytest.approx(15 * 40 / 3600)
    assert r["failed_device_hours"] == pytest.approx(3 * 40 / 3600)


def test_an_unverified_study_has_no_speedup_and_says_so(tmp_path: Path) -> None:
    r = study_row(make_study(tmp_path, verified=False))
    assert (r["best_verified"], r["speedup"], r["speedup_ci_low"]) == (False, None, None)
    assert "not accepted" in markdown_row({**r, "date_utc": "d", "wall_s": 1.0})


def test_a_gpu_study_names_the_gpu_devices_and_nodes(tmp_path: Path) -> None:
    d = tmp_path / "gpu"
    Contract.create(ROOT / "workloads" / "dense_multinode.yaml", study_dir=d)
    hw = {"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3"}
    rows = [
        row("doctor-0", "doctor", BASE, 100.0, step=10.0),
        row("run-0", "run", BEST, 200.0, step=5.0),
        row("run-1", "run", BEST, 300.0, status="timeout"),
    ]
    for r in rows:
        r.hardware, r.world_size, r.nodes, r.device_seconds = hw, 16, 2, 16 * 360.0
    write_rows(d, rows)
    got = study_row(d)
    assert got["hardware"] == "NVIDIA H100 80GB HBM3 x 16, 2 nodes" and not got["debug_flavour"]
    assert (got["baseline_source"], got["best_source"], got["best_verified"]) == (
        "doctor",
        "run",
        False,
    )
    assert (got["device_hours"], got["failed_device_hours"]) == (
        pytest.approx(4.8),
        pytest.approx(1.6),
    )


def test_append_row_writes_the_heading_once_then_one_line_per_run(tmp_path: Path) -> None:
    r = {
        **study_row(make_study(tmp_path)),
        "date_utc": "2026-12-04 12:00",
        "wall_s": 600.4,
        "commit": "abc",
        "dirty": False,
        "notes": "ran on CPU",
    }
    jl, md = append_row(r, tmp_path / "res")
    append_row({**r, "notes": "again"}, tmp_path / "res")
    text = md.read_text()
    assert text.startswith(MD_HEADER) and text.count("| date (UTC) |") == 1
    lines = text[len(MD_HEADER) :].splitlines()
    assert lines == [markdown_row(r), markdown_row({**r, "notes": "again"})]
    assert (
        "| 2.02 → 0.67 |" in lines[0]
        and "3.03x (2.90-3.10x)" in lines[0]
        and "0.167 (0.033)" in lines[0]
    )
    assert [json.loads(x)["notes"] for x in jl.read_text().splitlines()] == ["ran on CPU", "again"]


def test_a_local_cluster_only_for_a_multinode_cpu_run_without_an_address() -> None:
    assert local_cluster_plan(2, 2, 1, "cpu", None) == [2, 2]
    assert local_cluster_plan(1, 2, 1, "cpu", None) is None
    assert local_cluster_plan(2, 2, 1, "cpu", "10.0.0.1:6379") is None
    assert local_cluster_plan(2, 16, 4, "cuda", "10.0.0.1:6379") is None
    with pytest.raises(SystemExit, match="--address"):
        local_cluster_plan(2, 16, 4, "cuda", None)


@pytest.mark.integration
def test_quick_reproduction_of_the_dense_debug_flavour(tmp_path: Path) -> None:
    """A whole ``--quick`` study of dense_1node_debug with its steps cut to 1 warm-up + 2 measured
    (the workload as shipped takes about 3 minutes here); the row lands in ``--results``."""
    raw = yaml.safe_load(resolve_workload("dense_1node_debug").read_text())
    raw.update(
        steps={"warmup": 1, "measured": 2},
        search_space=str(ROOT / "search_spaces" / "deepspeed_dense.yaml"),
    )
    wl = tmp_path / "dense_1node_debug.yaml"
    wl.write_text(yaml.safe_dump(raw))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.reproduce",
            str(wl),
            "--quick",
            "--out",
            str(tmp_path / "study"),
            "--results",
            str(tmp_path / "res"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    got = json.loads((tmp_path / "res" / "reproduce.jsonl").read_text())
    assert (
        got["workload"] == "dense_1node_debug"
        and got["quick"]
        and got["hardware"].startswith("CPU (debug")
    )
    assert (got["trials_run"], got["devices"], got["nodes"]) == (2, 2, 1)
    assert got["baseline_step_time_s"] > 0 and got["device_hours"] > 0
    assert "ran on CPU" in (tmp_path / "res" / "reproduce.md").read_text()
