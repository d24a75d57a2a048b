"""The experience bank: every trial of every study, kept for warm-starting later studies.

A bank is a directory of Parquet files (a study's contract names it: ``switches.bank``, whose
default at init is ``$INFRARSI_BANK`` or ``~/.cache/infrarsi/bank``), one file per study, named by the study's contract hash, so adding a
study twice replaces its rows. Each row holds the hardware fingerprint, workload features
(model family, parameters, tokens per step, world size), the config and the outcome, plus the
outcome in relative terms: step time over that study's baseline step time, and peak memory
over that study's memory capacity. Files are written to ``*.tmp`` and renamed (``os.replace``),
because a half-written Parquet file breaks a dataset reader::

    bank = Bank()
    bank.add_study("studies/dense-a100")
    prior = bank.warm_start_rows(workload, space, hardware={"device": "cuda", "cpu": "..."})
    # [{"config": {...}, "status": "ok", "relative_step_time": 0.41, ...}, ...]

``warm_start_rows`` returns observations from OTHER hardware only (the same hardware's rows are
better used directly), restricted to the space's knobs and sorted by workload similarity.
Simulated (surrogate) rows only seed simulated studies.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from infrarsi.errors import ConfigError, StudyError
from infrarsi.result import TrialResult
from infrarsi.study.contract import Contract
from infrarsi.study.doctor_report import DoctorReport
from infrarsi.study.switches import BANK_ENV, bank_from_environment
from infrarsi.study.trial_log import read_results

FINGERPRINT_KEYS = ("device", "device_kind", "device_name", "gpu_name", "cpu", "cpu_count",
                    "gpus_per_node", "devices_per_node", "memory_per_device_bytes", "interconnect",
                    "simulated")
"""Hardware keys that identify a machine type (host names and measured rates are left out)."""

SCHEMA = pa.schema([
    ("study_id", pa.string()), ("study", pa.string()), ("contract_hash", pa.string()),
    ("added_at", pa.float64()), ("workload_name", pa.string()), ("model_family", pa.string()),
    ("model_size", pa.string()), ("num_params", pa.int64()), ("tokens_per_step", pa.int64()),
    ("world_size", pa.int64()), ("nodes", pa.int64()), ("space_name", pa.string()),
    ("space_hash", pa.string()), ("hardware_fingerprint", pa.string()), ("hardware", pa.string()),
    ("trial_id", pa.string()), ("stage", pa.string()), ("config", pa.string()),
    ("status", pa.string()), ("step_time_s", pa.float64()), ("baseline_step_time_s", pa.float64()),
    ("relative_step_time", pa.float64()), ("tokens_per_s", pa.float64()),
    ("peak_memory_bytes", pa.int64()), ("memory_censored", pa.bool_()),
    ("memory_capacity_bytes", pa.int64()), ("relative_peak_memory", pa.float64()),
    ("device_seconds", pa.float64()), ("simulated", pa.bool_()),
])
"""One bank row per trial."""


def default_root() -> Path:
    """The bank ``$INFRARSI_BANK`` names, else ``~/.cache/infrarsi/bank`` (parsed by
    ``infrarsi.study.switches``); ``ConfigError`` when ``$INFRARSI_BANK`` turns the bank off."""
    root = bank_from_environment()
    if root is None:
        raise ConfigError(f"environment variable {BANK_ENV}: rule: a bank directory is needed here; value: "
                          f"{os.environ.get(BANK_ENV)!r} (off). Fix: pass the bank's directory, or unset {BANK_ENV}.")
    return Path(root)


def hardware_fingerprint(hardware: Mapping[str, Any] | str | None) -> str:
    """A short stable id of a machine type: sha256 of its ``FINGERPRINT_KEYS`` (a str passes)."""
    if isinstance(hardware, str):
        return hardware
    hw = dict(hardware or {})
    picked = {k: hw[k] for k in FINGERPRINT_KEYS if k in hw}
    if not picked:
        return "unknown"
    return hashlib.sha256(json.dumps(picked, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _space_info(space: Any) -> tuple[str, list[str]]:
    """(name, knob names) of a SearchSpace, a path, YAML text or a dict."""
    data: Any = space
    if isinstance(space, Path) or (isinstance(space, str) and "\n" not in space and Path(space).exists()):
        data = yaml.safe_load(Path(space).read_text())
    elif isinstance(space, str):
        data = yaml.safe_load(space)
    if isinstance(data, Mapping):
        return str(data.get("name", "")), [str(k["name"]) for k in data.get("knobs", [])]
    knobs = getattr(data, "knobs", None) or []
    if isinstance(knobs, Mapping):
        names = [str(k) for k in knobs]
    else:
        names = [str(getattr(k, "name", k)) for k in knobs]
    return str(getattr(data, "name", "")), names


def _baseline_step_time(study_dir: Path, rows: list[TrialResult], baseline: Mapping[str, Any]) -> float | None:
    doctor = DoctorReport.load_if_present(study_dir)
    if doctor is not None and doctor.baseline_step_time_s:
        return doctor.baseline_step_time_s
    for stage in ("doctor", "verify", "run"):
        vals = [r.step_time_s for r in rows if r.stage == stage and r.ok and r.step_time_s
                and all(r.config.get(k) == v for k, v in baseline.items())
                and (stage != "verify" or r.extra.get("role") == "baseline")]
        if vals:
            return float(statistics.median(vals))
    return None


class Bank:
    """A directory of per-study Parquet files of trial rows."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root).expanduser() if root is not None else default_root()
        """The bank directory."""

    def add_study(self, study_dir: str | Path) -> int:
        """Add (or replace) every logged trial of a study; returns the number of rows written."""
        d = Path(study_dir)
        contract = Contract.load(d, check_files=False)
        rows = read_results(d)
        if not rows:
            raise StudyError(f"{d}: the study has no logged trials to add to the bank; run "
                             f"`infrarsi doctor`/`run` first.")
        wl = contract.workload
        base = _baseline_step_time(d, rows, wl.get("baseline", {}))
        cap = contract.memory_capacity.memory_capacity_bytes
        space_name, _ = _space_info(Path(contract.search_space_path)) if Path(
            contract.search_space_path).exists() else ("", [])
        study_id = contract.contract_hash[:16]
        now = time.time()
        recs = []
        for r in rows:
            n_params = r.extra.get("num_params") or r.extra.get("model_params")
            cap_r = cap or r.extra.get("memory_capacity_bytes")
            recs.append({
                "study_id": study_id, "study": contract.study, "contract_hash": contract.contract_hash,
                "added_at": now, "workload_name": wl.get("name"),
                "model_family": (wl.get("model") or {}).get("family"),
                "model_size": (wl.get("model") or {}).get("size"),
                "num_params": int(n_params) if n_params else None,
                "tokens_per_step": contract.invariants.tokens_per_step,
                "world_size": r.world_size or None, "nodes": r.nodes,
                "space_name": space_name, "space_hash": contract.search_space_hash,
                "hardware_fingerprint": hardware_fingerprint(r.hardware),
                "hardware": json.dumps(r.hardware, sort_keys=True, default=str),
                "trial_id": r.trial_id, "stage": r.stage,
                "config": json.dumps(r.config, sort_keys=True, default=str), "status": r.status,
                "step_time_s": r.step_time_s, "baseline_step_time_s": base,
                "relative_step_time": (r.step_time_s / base) if (r.ok and r.step_time_s and base) else None,
                "tokens_per_s": r.tokens_per_s, "peak_memory_bytes": r.peak_memory_bytes,
                "memory_censored": bool(r.memory_censored),
                "memory_capacity_bytes": int(cap_r) if cap_r else None,
                "relative_peak_memory": (r.peak_memory_bytes / float(cap_r))
                if (r.peak_memory_bytes and cap_r) else None,
                "device_seconds": r.device_seconds, "simulated": bool(r.simulated),
            })
        table = pa.Table.from_pylist(recs, schema=SCHEMA)
        self.root.mkdir(parents=True, exist_ok=True)
        dest = self.root / f"{study_id}.parquet"
        tmp = self.root / f"{study_id}.parquet.{os.getpid()}.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, dest)
        return len(recs)

    def files(self) -> list[Path]:
        """The bank's complete Parquet files (``*.tmp`` leftovers are ignored)."""
        return sorted(self.root.glob("*.parquet")) if self.root.is_dir() else []

    def table(self) -> pa.Table:
        """Every row in the bank (an empty table for an empty bank)."""
        tables = []
        for f in self.files():
            try:
                tables.append(pq.read_table(f))
            except (OSError, pa.ArrowInvalid):
                continue  # a damaged file is skipped; re-add its study to repair it
        if not tables:
            return SCHEMA.empty_table()
        return pa.concat_tables(tables, promote_options="permissive")

    def warm_start_rows(
        self,
        workload: Any,
        space: Any,
        hardware: Mapping[str, Any] | str | None,
        *,
        num_params: int | None = None,
        include_same_hardware: bool = False,
        max_rows: int = 200,
    ) -> list[dict[str, Any]]:
        """Prior observations for a new study, in relative terms, most similar first.

        Args:
            workload: a ``Workload``, a ``Contract`` or a workload dict (family, tokens per step
                and world size are read from it).
            space: the new study's ``SearchSpace``, its YAML path/text or dict; only rows of a
                space with the same name are used, and configs keep only its knobs.
            hardware: the new study's hardware dict (or fingerprint); rows from it are left out
                unless ``include_same_hardware``.
            num_params: the new model's parameter count, for similarity (optional).

        Returns:
            Dicts with ``config``, ``status`` (ok | oom), ``relative_step_time`` (step time over
            that study's baseline; None for oom), ``relative_peak_memory`` (peak over that
            study's capacity; a lower bound when ``memory_censored``), ``memory_censored``,
            ``similarity`` in (0, 1], ``source_study``, ``hardware_fingerprint``.
        """
        wl = _workload_features(workload)
        fam, tps, ws = wl
        space_name, knobs = _space_info(space)
        fp = hardware_fingerprint(hardware)
        out = []
        for rec in self.table().to_pylist():
            if rec["status"] not in ("ok", "oom") or (rec.get("simulated") and not _is_sim(hardware)):
                continue
            if not include_same_hardware and rec["hardware_fingerprint"] == fp:
                continue
            if space_name and rec["space_name"] and rec["space_name"] != space_name:
                continue
            if fam and rec["model_family"] and rec["model_family"] != fam:
                continue
            if rec["status"] == "ok" and rec["relative_step_time"] is None:
                continue
            cfg = json.loads(rec["config"])
            if knobs:
                cfg = {k: v for k, v in cfg.items() if k in knobs}
            dist = _logdist(tps, rec["tokens_per_step"]) + _logdist(ws, rec["world_size"]) \
                + _logdist(num_params, rec["num_params"])
            out.append({
                "config": cfg, "status": rec["status"],
                "relative_step_time": rec["relative_step_time"],
                "relative_peak_memory": rec["relative_peak_memory"],
                "memory_censored": bool(rec["memory_censored"]),
                "similarity": math.exp(-dist), "source_study": rec["study"],
                "trial_id": rec["trial_id"], "hardware_fingerprint": rec["hardware_fingerprint"],
            })
        out.sort(key=lambda x: (-x["similarity"], x["relative_step_time"] or math.inf))
        return out[:max_rows]


def scale_prior(
    rows: list[dict[str, Any]], baseline_step_time_s: float, memory_capacity_bytes: float
) -> list[dict[str, Any]]:
    """Turn ``warm_start_rows`` into the new study's absolute units (a prior, not a measurement).

    ``step_time_s = relative_step_time x baseline_step_time_s`` (the new baseline, e.g. from
    doctor) and ``peak_memory_bytes = relative_peak_memory x memory_capacity_bytes``; an oom row
    keeps ``memory_censored`` (its peak is a lower bound). Each dict also keeps ``similarity``
    so a caller can down-weight or inflate the noise of distant priors.
    """
    if not (baseline_step_time_s > 0 and memory_capacity_bytes > 0):
        raise ValueError(f"`baseline_step_time_s > 0 and memory_capacity_bytes > 0` must hold, but "
                         f"got ({baseline_step_time_s}, {memory_capacity_bytes}).")
    out = []
    for r in rows:
        rel_t, rel_m = r.get("relative_step_time"), r.get("relative_peak_memory")
        out.append({
            "config": dict(r["config"]), "status": r["status"],
            "step_time_s": rel_t * baseline_step_time_s if rel_t is not None else None,
            "peak_memory_bytes": rel_m * memory_capacity_bytes if rel_m is not None else None,
            "memory_censored": bool(r.get("memory_censored")),
            "similarity": r.get("similarity", 1.0), "source_study": r.get("source_study"),
        })
    return out


def _is_sim(hardware: Mapping[str, Any] | str | None) -> bool:
    return isinstance(hardware, Mapping) and bool(hardware.get("simulated"))


def _logdist(a: float | None, b: float | None) -> float:
    if not a or not b:
        return 0.0
    return abs(math.log(float(a) / float(b)))


def _workload_features(workload: Any) -> tuple[str | None, int | None, int | None]:
    """(model family, tokens per step, world size) of a Workload, Contract or dict."""
    if isinstance(workload, Contract):
        workload = workload.workload
    if isinstance(workload, Mapping):
        res = workload.get("resources") or {}
        ws = int(res.get("workers", 1)) * int(res.get("devices_per_worker", 1)) if res else None
        return (workload.get("model") or {}).get("family"), workload.get("tokens_per_step"), ws
    return (getattr(getattr(workload, "model", None), "family", None),
            getattr(workload, "tokens_per_step", None), getattr(workload, "world_size", None))


__all__ = ["SCHEMA", "Bank", "default_root", "hardware_fingerprint", "scale_prior"]
