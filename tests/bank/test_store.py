"""The experience bank: per-study Parquet files, relative outcomes, warm start from other studies."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from synthetic_study import BEST, make_study

from infrarsi.bank.signatures import HardwareSignature, ParallelLayout
from infrarsi.bank.store import (
    LEGACY_SCHEMA,
    SCHEMA,
    Bank,
    default_root,
    hardware_fingerprint,
    scale_prior,
    study_key,
)
from infrarsi.errors import ConfigError, StudyError
from infrarsi.study.contract import Contract
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


def test_warm_start_uses_other_studies_on_any_hardware(tmp_path: Path) -> None:
    bank = Bank(tmp_path / "bank")
    bank.add_study(make_study(tmp_path, "a", hw="box-a"))
    bank.add_study(make_study(tmp_path, "b", hw="box-b"))
    wl = Workload.from_yaml(ROOT / "workloads/dense_debug.yaml")
    prior = bank.warm_start_rows(wl, SPACE, hw("box-a"))
    # The same cluster's other studies count (another model size, another node count), marked as such.
    assert {p["source_study"] for p in prior} == {"a", "b"}
    assert {(p["source_study"], p["same_hardware"]) for p in prior} == {("a", True), ("b", False)}
    assert {p["status"] for p in prior} == {"ok", "oom"}
    best = min((p for p in prior if p["status"] == "ok"), key=lambda p: p["relative_step_time"])
    assert best["config"] == BEST and best["relative_step_time"] < 0.4
    assert all(p["similarity"] == pytest.approx(1.0) for p in prior)
    # Other hardware only, when asked for.
    other = bank.warm_start_rows(wl, SPACE, hw("box-a"), include_same_hardware=False)
    assert {p["source_study"] for p in other} == {"b"} and 2 * len(other) == len(prior)
    # Another space or model family gives nothing.
    assert bank.warm_start_rows(wl, {"name": "other", "knobs": []}, hw("box-c")) == []
    moe = {**wl.to_yaml_dict(), "model": {"family": "moe", "size": "debug"}}
    assert bank.warm_start_rows(moe, SPACE, hw("box-c")) == []


def test_similarity_prefers_closer_workloads(tmp_path: Path) -> None:
    bank = Bank(tmp_path / "bank")
    bank.add_study(make_study(tmp_path, "a", hw="box-a"))
    wl = Workload.from_yaml(ROOT / "workloads/dense_debug.yaml").to_yaml_dict()
    near = bank.warm_start_rows(wl, SPACE, hw("x"), num_params=5_300_000)
    far = bank.warm_start_rows(
        {**wl, "tokens_per_step": 8 * 2048}, SPACE, hw("x"), num_params=53_000_000
    )
    assert near[0]["similarity"] > far[0]["similarity"]


def test_fingerprint_and_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = hardware_fingerprint(
        {"device": "cuda", "gpu_name": "H100", "hosts": ["n1"], "peak_flops_per_s": 1}
    )
    b = hardware_fingerprint(
        {"device": "cuda", "gpu_name": "H100", "hosts": ["n2"], "peak_flops_per_s": 2}
    )
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
    prior = scale_prior(
        bank.warm_start_rows(wl, SPACE, hw("gpu")),
        baseline_step_time_s=10.0,
        memory_capacity_bytes=80e9,
    )
    ok = min((p for p in prior if p["status"] == "ok"), key=lambda p: p["step_time_s"])
    assert ok["config"] == BEST and ok["step_time_s"] == pytest.approx(10.0 * 0.66 / 2.05)
    assert ok["peak_memory_bytes"] == pytest.approx(80e9 * 0.8)
    oom = next(p for p in prior if p["status"] == "oom")
    assert oom["memory_censored"] and oom["step_time_s"] is None and oom["peak_memory_bytes"] > 80e9
    with pytest.raises(ValueError, match="> 0"):
        scale_prior(prior, 0.0, 1.0)


def _locations(tmp_path: Path) -> list[str]:
    locs = [str(tmp_path / "local-bank"), (tmp_path / "uri-bank").as_uri()]
    try:
        import fsspec  # noqa: F401

        locs.append(f"memory://infrarsi-test-{tmp_path.name}")
    except ImportError:
        pass
    return locs


def test_ingest_query_round_trip_is_idempotent_on_paths_and_uris(tmp_path: Path) -> None:
    s = make_study(tmp_path, "a", hw="box-a")
    for loc in _locations(tmp_path):
        bank = Bank(loc)
        assert bank.ingest(s) == 15
        first = bank.query()
        assert bank.ingest(s) == 15  # ingest again: the study's file is replaced, not appended to
        assert len(bank.files()) == 1 and bank.table().num_rows == 15
        again = bank.query()
        assert [(r["trial_id"], r["config"]) for r in again] == [
            (r["trial_id"], r["config"]) for r in first
        ]
        ok = bank.query(status="ok", device="BOX-A", workload="dense_debug", limit=3)
        assert len(ok) == 3 and {r["status"] for r in ok} == {"ok"}
        assert bank.query(device="box-z") == [] and bank.query(workload="moe") == []
        best = bank.query(study="a", status="ok")
        r = next(x for x in best if x["config"] == BEST)
        assert r["relative_step_time"] == pytest.approx(0.66 / 2.05)
        # The three signatures, flattened, units in the names.
        assert (
            r["hw_device_kind"],
            r["hw_device_name"],
            r["hw_devices_per_node"],
            r["hw_nodes"],
        ) == ("cpu", "box-a", 2, 1)
        assert (r["wl_name"], r["wl_family"], r["wl_seq_len_tokens"], r["wl_tokens_per_step"]) == (
            "dense_debug",
            "dense",
            128,
            2048,
        )
        assert (r["wl_n_layers"], r["wl_hidden"], r["wl_n_heads"], r["wl_num_experts"]) == (
            4,
            256,
            4,
            0,
        )
        assert r["wl_num_params"] == 5_300_000
        assert (
            r["par_world_size"],
            r["par_data_parallel"],
            r["par_zero_stage"],
            r["par_micro_batch_size"],
            r["par_gradient_accumulation_steps"],
        ) == (2, 2, 0, 8, 1)  # 16 sequences / (8 x 2)
        assert bank.stats()["rows_by_status"] == {
            "failed": 1,
            "invariant_violation": 1,
            "ok": 12,
            "oom": 1,
        }
        assert bank.atomic_writes == (not loc.startswith("memory://"))


def test_signature_columns_round_trip() -> None:
    sig = HardwareSignature(
        device_kind="cuda",
        device_name="NVIDIA H200",
        memory_per_device_bytes=150 << 30,
        devices_per_node=8,
        nodes=2,
        cuda_version="13.0",
        torch_version="2.11",
    )
    assert sig.columns()["hw_memory_per_device_bytes"] == 150 << 30
    assert HardwareSignature.from_columns(sig.columns()) == sig
    lay = ParallelLayout.from_config(
        {"tp": 2, "pp": 2, "zero_stage": 1, "micro_batch_size": 2},
        world_size=16,
        nodes=2,
        global_batch=64,
    )
    assert (lay.data_parallel, lay.gradient_accumulation_steps) == (4, 8)
    assert ParallelLayout.from_columns({}) == ParallelLayout()  # a legacy row
    hw = HardwareSignature.from_study(
        {
            "device": "cuda",
            "device_name": "H200",
            "torch": "2.11",
            "deepspeed": "0.19",
            "cuda": "13.0",
            "driver": "580.1",
            "memory_per_device_bytes": 1,
        }
    )
    assert (hw.cuda_version, hw.driver_version, hw.deepspeed_version, hw.device_name) == (
        "13.0",
        "580.1",
        "0.19",
        "H200",
    )


def test_a_study_keeps_one_file_across_calibrations(tmp_path: Path) -> None:
    s = make_study(tmp_path, "a", hw="box-a")
    bank = Bank(tmp_path / "bank")
    bank.ingest(s)
    c = Contract.load(s, check_files=False)
    c2 = c.with_calibration(loss_atol=5e-4, reason="doctor again")
    assert c2.contract_hash != c.contract_hash and study_key(c2) == study_key(c)
    c2.save(s)
    bank.ingest(s)
    assert len(bank.files()) == 1 and bank.table().num_rows == 15


def test_banks_written_before_the_signatures_still_read(tmp_path: Path) -> None:
    s = make_study(tmp_path, "a", hw="box-a")
    bank = Bank(tmp_path / "bank")
    bank.ingest(s)
    # The old layout: the same folder, the old columns only, the file named by the contract hash.
    old = bank.table().select(LEGACY_SCHEMA.names).cast(LEGACY_SCHEMA)
    for f in bank.files():
        Path(f).unlink()
    legacy = bank.root / f"{Contract.load(s, check_files=False).contract_hash[:16]}.parquet"
    pq.write_table(old, legacy)
    t = bank.table()
    assert t.num_rows == 15 and t.schema == SCHEMA and t.column("hw_device_kind").null_count == 15
    assert bank.stats()["legacy_rows"] == 15 and bank.stats()["hardware"] == {"box-a": 15}
    wl = Workload.from_yaml(ROOT / "workloads/dense_debug.yaml")
    assert bank.warm_start_rows(wl, SPACE, hw("box-b"))  # still a warm start
    bank.ingest(s)  # re-ingest replaces the legacy file: no duplicate rows
    assert [Path(f).name for f in bank.files()] == [
        f"{study_key(Contract.load(s, check_files=False))}.parquet"
    ]
    assert bank.table().num_rows == 15 and bank.stats()["legacy_rows"] == 0


def test_a_study_never_warm_starts_from_itself(tmp_path: Path) -> None:
    s = make_study(tmp_path, "a", hw="box-a")
    bank = Bank(tmp_path / "bank")
    bank.ingest(s)
    contract = Contract.load(s, check_files=False)
    assert bank.warm_start_rows(contract, SPACE, hw("elsewhere")) == []
    assert bank.warm_start_rows(contract, SPACE, hw("box-a")) == []  # nor on its own hardware
    assert bank.warm_start_rows(contract, SPACE, hw("elsewhere"), exclude_study="") != []


def test_a_bad_uri_is_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="Fix"):
        Bank("nosuchprotocol-xyz://bucket/bank")
