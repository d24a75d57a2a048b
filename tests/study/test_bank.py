"""The experience bank: per-study Parquet files, relative outcomes, warm start from other hardware."""

from __future__ import annotations

from pathlib import Path

import pytest
from synthetic_study import BEST, make_study

from infrarsi.errors import StudyError
from infrarsi.study.bank import Bank, default_root, hardware_fingerprint, scale_prior
from infrarsi.workload import Workload

ROOT = Path(__file__).resolve().parents[2]
SPACE = ROOT / "search_spaces/deepspeed_dense.yaml"


def hw(kind: str) -> dict[str, object]:
    return {"device": "cpu", "device_kind": kind, "host": "h1"}


def test_add_study_is_idempotent_and_relative(tmp_path: Path) -> None:
    bank = Bank(tmp_path / "bank")
    s = make_study(tmp_path, "a", hw="box-a")
    n = bank.add_study(s)
    assert n == 15
    assert bank.add_study(s) == 15  # replaces, not appends
    assert len(bank.files()) == 1 and bank.table().num_rows == 15
    (bank.root / "junk.parquet.123.tmp").write_bytes(b"half a file")  # ignored
    rows = {r["trial_id"]: r for r in bank.table().to_pylist()}
    assert rows["run-2"]["baseline_step_time_s"] == pytest.approx(2.05)  # doctor.json median
    assert rows["run-2"]["relative_step_time"] == pytest.approx(0.66 / 2.05)
    assert rows["run-1"]["status"] == "oom" and rows["run-1"]["memory_censored"]
    assert rows["run-1"]["relative_peak_memory"] == pytest.approx(1.1)
    assert rows["run-2"]["num_params"] == 5_300_000


def test_warm_start_uses_other_hardware_only(tmp_path: Path) -> None:
    bank = Bank(tmp_path / "bank")
    bank.add_study(make_study(tmp_path, "a", hw="box-a"))
    bank.add_study(make_study(tmp_path, "b", hw="box-b"))
    wl = Workload.from_yaml(ROOT / "workloads/dense_debug.yaml")
    prior = bank.warm_start_rows(wl, SPACE, hw("box-a"))
    assert prior and {p["source_study"] for p in prior} == {"b"}
    assert {p["status"] for p in prior} == {"ok", "oom"}
    best = min((p for p in prior if p["status"] == "ok"), key=lambda p: p["relative_step_time"])
    assert best["config"] == BEST and best["relative_step_time"] < 0.4
    assert all(p["similarity"] == pytest.approx(1.0) for p in prior)
    # From a third machine both studies count; the same machine's rows can be asked for.
    assert {p["source_study"] for p in bank.warm_start_rows(wl, SPACE, hw("box-c"))} == {"a", "b"}
    assert len(bank.warm_start_rows(wl, SPACE, hw("box-a"), include_same_hardware=True)) == 2 * len(prior)
    # Another space or model family gives nothing.
    assert bank.warm_start_rows(wl, {"name": "other", "knobs": []}, hw("box-c")) == []
    moe = {**wl.to_yaml_dict(), "model": {"family": "moe", "size": "debug"}}
    assert bank.warm_start_rows(moe, SPACE, hw("box-c")) == []


def test_similarity_prefers_closer_workloads(tmp_path: Path) -> None:
    bank = Bank(tmp_path / "bank")
    bank.add_study(make_study(tmp_path, "a", hw="box-a"))
    wl = Workload.from_yaml(ROOT / "workloads/dense_debug.yaml").to_yaml_dict()
    near = bank.warm_start_rows(wl, SPACE, hw("x"), num_params=5_300_000)
    far = bank.warm_start_rows({**wl, "tokens_per_step": 8 * 2048}, SPACE, hw("x"), num_params=53_000_000)
    assert near[0]["similarity"] > far[0]["similarity"]


def test_fingerprint_and_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = hardware_fingerprint({"device": "cuda", "gpu_name": "H100", "hosts": ["n1"], "peak_flops_per_s": 1})
    b = hardware_fingerprint({"device": "cuda", "gpu_name": "H100", "hosts": ["n2"], "peak_flops_per_s": 2})
    assert a == b != hardware_fingerprint({"device": "cuda", "gpu_name": "A100"})
    assert hardware_fingerprint({}) == "unknown"
    monkeypatch.setenv("INFRARSI_BANK", str(tmp_path / "b"))
    assert default_root() == tmp_path / "b" and Bank().root == tmp_path / "b"


def test_empty_study_is_refused(tmp_path: Path) -> None:
    s = make_study(tmp_path, "a")
    for f in (s / "trials").iterdir():
        f.unlink()
    with pytest.raises(StudyError, match="no logged trials"):
        Bank(tmp_path / "bank").add_study(s)
    assert Bank(tmp_path / "nothing").table().num_rows == 0


def test_scale_prior_to_new_units(tmp_path: Path) -> None:
    bank = Bank(tmp_path / "bank")
    bank.add_study(make_study(tmp_path, "a", hw="box-a"))
    wl = Workload.from_yaml(ROOT / "workloads/dense_debug.yaml")
    prior = scale_prior(bank.warm_start_rows(wl, SPACE, hw("gpu")), baseline_step_time_s=10.0,
                        memory_capacity_bytes=80e9)
    ok = min((p for p in prior if p["status"] == "ok"), key=lambda p: p["step_time_s"])
    assert ok["config"] == BEST and ok["step_time_s"] == pytest.approx(10.0 * 0.66 / 2.05)
    assert ok["peak_memory_bytes"] == pytest.approx(80e9 * 0.8)
    oom = next(p for p in prior if p["status"] == "oom")
    assert oom["memory_censored"] and oom["step_time_s"] is None and oom["peak_memory_bytes"] > 80e9
    with pytest.raises(ValueError, match="> 0"):
        scale_prior(prior, 0.0, 1.0)
