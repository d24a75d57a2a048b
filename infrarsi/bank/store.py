"""The experience bank: every trial of every study, kept for warm-starting later studies.

A bank is a Parquet dataset: one file per study in one folder, on a local path or on any
filesystem a URI names, so that several clusters can share one (``switches.bank`` in a study's
contract; its default at init is ``$INFRARSI_BANK`` or ``~/.cache/infrarsi/bank``):

- a local directory, or ``file:///abs/path``;
- ``s3://bucket/prefix``, ``gs://bucket/prefix``, ``hdfs://host/path``: pyarrow's own filesystems
  (``pyarrow.fs.FileSystem.from_uri``; credentials come from the environment as pyarrow reads them);
- any other fsspec protocol (``memory://``, ``abfs://``, ...) when ``fsspec`` (and the protocol's
  package) is installed: ``pyarrow.fs.PyFileSystem(FSSpecHandler(fs))``.

Each study's file is named by its study key (``study_key``: the contract's hash without the
calibrations doctor adds, so one study keeps one file across its stages), so ingesting a study
again replaces its rows: ingest is idempotent. Every stage feeds the bank (doctor, run, verify,
tune: ``infrarsi.bank.feed.add_to_bank``) and ``infrarsi bank ingest DIR`` adds a study by hand.
Writes are atomic where the filesystem allows: a local or pyarrow/fsspec filesystem gets a
``*.tmp`` file renamed over the old one (a rename is atomic on a local disk and HDFS; an fsspec
``move`` may be a copy and a delete), an object store (S3, GCS) gets the object written directly,
which only appears once complete. Readers skip ``*.tmp`` leftovers and damaged files.

Each row holds the trial's config and outcome, the outcome in relative terms (step time over
that study's baseline step time, peak memory over that study's memory capacity) and three
signatures (``infrarsi.bank.signatures``): hardware (``hw_*``), workload (``wl_*``) and
parallel layout (``par_*``). Banks written before the signatures (the same folder layout, fewer
columns) are read as they are, the missing columns as nulls::

    bank = Bank("s3://team-bucket/infrarsi-bank")
    bank.add_study("studies/dense-a100")
    prior = bank.warm_start_rows(workload, space, hardware={"device": "cuda", "cpu": "..."})
    # [{"config": {...}, "status": "ok", "relative_step_time": 0.41, ...}, ...]

``warm_start_rows`` returns observations of OTHER studies (the new study's own rows are left
out), on any hardware: another cluster, or the same one with another model size or node count
(each row says whether it was measured on the new study's hardware, ``same_hardware``), sorted by
workload similarity; ``config`` keeps only the space's knobs, ``bank_config`` is the config as
measured. Simulated (surrogate) rows only seed simulated studies.

Why one module: the bank's format, writes and queries are one Parquet dataset's interface; what the
stages feed it and take from it is in ``bank.feed`` and ``bank.transfer``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import yaml

from infrarsi.bank.signatures import (
    HardwareSignature,
    ParallelLayout,
    WorkloadSignature,
    signature_fields,
)
from infrarsi.errors import ConfigError, StudyError
from infrarsi.result import TrialResult
from infrarsi.study.contract import Contract
from infrarsi.study.doctor_report import DoctorReport
from infrarsi.study.switches import BANK_ENV, bank_from_environment
from infrarsi.study.trial_log import read_results

FINGERPRINT_KEYS = (
    "device",
    "device_kind",
    "device_name",
    "gpu_name",
    "cpu",
    "cpu_count",
    "gpus_per_node",
    "devices_per_node",
    "memory_per_device_bytes",
    "interconnect",
    "simulated",
)
"""Hardware keys that identify a machine type (host names and measured rates are left out)."""

LEGACY_SCHEMA = pa.schema(
    [
        ("study_id", pa.string()),
        ("study", pa.string()),
        ("contract_hash", pa.string()),
        ("added_at", pa.float64()),
        ("workload_name", pa.string()),
        ("model_family", pa.string()),
        ("model_size", pa.string()),
        ("num_params", pa.int64()),
        ("tokens_per_step", pa.int64()),
        ("world_size", pa.int64()),
        ("nodes", pa.int64()),
        ("space_name", pa.string()),
        ("space_hash", pa.string()),
        ("hardware_fingerprint", pa.string()),
        ("hardware", pa.string()),
        ("trial_id", pa.string()),
        ("stage", pa.string()),
        ("config", pa.string()),
        ("status", pa.string()),
        ("step_time_s", pa.float64()),
        ("baseline_step_time_s", pa.float64()),
        ("relative_step_time", pa.float64()),
        ("tokens_per_s", pa.float64()),
        ("peak_memory_bytes", pa.int64()),
        ("memory_censored", pa.bool_()),
        ("memory_capacity_bytes", pa.int64()),
        ("relative_peak_memory", pa.float64()),
        ("device_seconds", pa.float64()),
        ("simulated", pa.bool_()),
    ]
)
"""The columns of banks written before the signatures (still read: the rest read as nulls)."""

SCHEMA = pa.schema([*LEGACY_SCHEMA, pa.field("study_dir", pa.string()), *signature_fields()])
"""One bank row per trial: ``LEGACY_SCHEMA``, the study's directory when ingested, and the
three signatures' columns (``hw_*``, ``wl_*``, ``par_*``; ``infrarsi.bank.signatures``)."""

OBJECT_STORES = ("s3", "gcs")
"""pyarrow filesystem types whose objects appear only once completely written (no tmp + move)."""


def default_root() -> Path | str:
    """The bank ``$INFRARSI_BANK`` names (a URI stays a str), else ``~/.cache/infrarsi/bank``
    (parsed by ``infrarsi.study.switches``); ``ConfigError`` when ``$INFRARSI_BANK`` turns it off."""
    root = bank_from_environment()
    if root is None:
        raise ConfigError(
            f"environment variable {BANK_ENV}: rule: a bank location is needed here; value: "
            f"{os.environ.get(BANK_ENV)!r} (off). Fix: pass the bank's directory or URI, or unset {BANK_ENV}."
        )
    return root if "://" in root else Path(root)


def open_filesystem(location: str | Path) -> tuple[pafs.FileSystem, str]:
    """(filesystem, base path) of a bank location: a local path, a pyarrow URI (``file://``,
    ``s3://``, ``gs://``, ``hdfs://``) or an fsspec URI (needs ``fsspec``). ``ConfigError`` when
    no filesystem can open it."""
    text = str(location)
    if "://" not in text:
        return pafs.LocalFileSystem(), str(Path(text).expanduser().resolve())
    try:
        fs, path = pafs.FileSystem.from_uri(text)
        return fs, path.rstrip("/") or "/"
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as e:
        pyarrow_error = str(e)
    try:
        import fsspec  # an optional dependency: any fsspec protocol
    except ImportError:
        raise ConfigError(
            f"bank {text!r}: rule: a local path, or a URI pyarrow can open (file://, s3://, gs://, "
            f"hdfs://) or fsspec can (with fsspec installed); pyarrow: {pyarrow_error}. "
            f"Fix: `pip install fsspec` (and the protocol's package), or use a supported URI."
        ) from None
    try:
        ffs, fpath = fsspec.core.url_to_fs(text)
    except (ValueError, ImportError) as e:
        raise ConfigError(
            f"bank {text!r}: rule: a URI pyarrow or fsspec can open; pyarrow: {pyarrow_error}; "
            f"fsspec: {e}. Fix: install the protocol's package, or use another URI."
        ) from None
    return pafs.PyFileSystem(pafs.FSSpecHandler(ffs)), str(fpath).rstrip("/") or "/"


def study_key(contract: Contract) -> str:
    """A study's id in the bank: sha256 (16 hex) of its contract without the calibrations
    doctor adds (amendments, invariants, memory capacity), so it stays the same across stages."""
    content = contract.content()
    for k in ("amendments", "invariants", "memory_capacity_bytes"):
        content.pop(k, None)
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[
        :16
    ]


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
    if isinstance(space, Path) or (
        isinstance(space, str) and "\n" not in space and Path(space).exists()
    ):
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


def _baseline_step_time(
    study_dir: Path, rows: list[TrialResult], baseline: Mapping[str, Any]
) -> float | None:
    doctor = DoctorReport.load_if_present(study_dir)
    if doctor is not None and doctor.baseline_step_time_s:
        return doctor.baseline_step_time_s
    for stage in ("doctor", "verify", "run"):
        vals = [
            r.step_time_s
            for r in rows
            if r.stage == stage
            and r.ok
            and r.step_time_s
            and all(r.config.get(k) == v for k, v in baseline.items())
            and (stage != "verify" or r.extra.role == "baseline")
        ]
        if vals:
            return float(statistics.median(vals))
    return None


def _conform(table: pa.Table) -> pa.Table:
    """``table`` with ``SCHEMA``'s columns in order (missing ones null, extra ones dropped)."""
    cols = []
    for f in SCHEMA:
        if f.name in table.column_names:
            col = table.column(f.name)
            cols.append(col if col.type == f.type else col.cast(f.type))
        else:
            cols.append(pa.nulls(table.num_rows, f.type))
    return pa.Table.from_arrays(cols, schema=SCHEMA)


class Bank:
    """A Parquet dataset of trial rows, one file per study, on a local or remote filesystem."""

    def __init__(self, root: str | Path | None = None) -> None:
        given = default_root() if root is None else root
        self.uri = str(given)
        """The location as given: a local path or a URI."""
        self.root: Path | str = Path(given).expanduser() if "://" not in self.uri else self.uri
        """The bank's location: a ``Path`` for a local directory, else the URI (a str)."""
        self.fs, self.base = open_filesystem(given)

    @property
    def atomic_writes(self) -> bool:
        """True where a study's file is replaced atomically (a local disk's rename; an object
        store's single PUT); False where ``move`` may be a copy then a delete (fsspec, others)."""
        return self.fs.type_name in ("local", "hdfs", *OBJECT_STORES)

    def _path(self, name: str) -> str:
        return f"{self.base.rstrip('/')}/{name}"

    def add_study(self, study_dir: str | Path) -> int:
        """Add (or replace) every logged trial of a study; returns the number of rows written."""
        d = Path(study_dir)
        contract = Contract.load(d, check_files=False)
        rows = read_results(d)
        if not rows:
            raise StudyError(
                f"{d}: the study has no logged trials to add to the bank; run "
                f"`infrarsi doctor`/`run` first."
            )
        table = pa.Table.from_pylist(self._records(d, contract, rows), schema=SCHEMA)
        key = study_key(contract)
        self._write(table, f"{key}.parquet")
        legacy = contract.contract_hash[:16]  # the file name banks used before study keys
        if legacy != key:
            self._delete(self._path(f"{legacy}.parquet"))
        return table.num_rows

    ingest = add_study

    def _records(
        self, d: Path, contract: Contract, rows: list[TrialResult]
    ) -> list[dict[str, Any]]:
        wl = contract.workload
        base = _baseline_step_time(d, rows, wl.get("baseline", {}))
        cap = contract.memory_capacity.memory_capacity_bytes
        space_name, _ = (
            _space_info(Path(contract.search_space_path))
            if Path(contract.search_space_path).exists()
            else ("", [])
        )
        key = study_key(contract)
        now = time.time()
        n_params = next(
            (r.extra.num_params for r in rows if r.extra.num_params),
            None,
        )
        doctor = DoctorReport.load_if_present(d)
        try:
            workload = contract.workload_model()
        except Exception:  # an embedded workload this version cannot parse: no signatures from it
            workload = None
        wl_sig = (
            WorkloadSignature.from_workload(
                workload, num_params=int(n_params) if n_params else None
            )
            if workload is not None
            else WorkloadSignature(name=wl.get("name"))
        )
        global_batch = (
            (workload.tokens_per_step // workload.data.seq_len) if workload is not None else None
        )
        recs = []
        for r in rows:
            n_r = r.extra.num_params or n_params
            cap_r = cap or r.extra.memory_capacity_bytes
            hw_sig = HardwareSignature.from_study(
                r.hardware,
                workload=workload,
                nodes=r.nodes or None,
                doctor_hardware=doctor.hardware if doctor else None,
                simulated=bool(r.simulated),
            )
            layout = ParallelLayout.from_config(
                r.config,
                world_size=r.world_size or (workload.world_size if workload is not None else None),
                nodes=r.nodes,
                global_batch=global_batch,
            )
            recs.append(
                {
                    "study_id": key,
                    "study": contract.study,
                    "contract_hash": contract.contract_hash,
                    "added_at": now,
                    "workload_name": wl.get("name"),
                    "model_family": (wl.get("model") or {}).get("family"),
                    "model_size": (wl.get("model") or {}).get("size"),
                    "num_params": int(n_r) if n_r else None,
                    "tokens_per_step": contract.invariants.tokens_per_step,
                    "world_size": r.world_size or None,
                    "nodes": r.nodes,
                    "space_name": space_name,
                    "space_hash": contract.search_space_hash,
                    "hardware_fingerprint": hardware_fingerprint(r.hardware),
                    "hardware": json.dumps(r.hardware, sort_keys=True, default=str),
                    "trial_id": r.trial_id,
                    "stage": r.stage,
                    "config": json.dumps(r.config, sort_keys=True, default=str),
                    "status": r.status,
                    "step_time_s": r.step_time_s,
                    "baseline_step_time_s": base,
                    "relative_step_time": (r.step_time_s / base)
                    if (r.ok and r.step_time_s and base)
                    else None,
                    "tokens_per_s": r.tokens_per_s,
                    "peak_memory_bytes": r.peak_memory_bytes,
                    "memory_censored": bool(r.memory_censored),
                    "memory_capacity_bytes": int(cap_r) if cap_r else None,
                    "relative_peak_memory": (r.peak_memory_bytes / float(cap_r))
                    if (r.peak_memory_bytes and cap_r)
                    else None,
                    "device_seconds": r.device_seconds,
                    "simulated": bool(r.simulated),
                    "study_dir": str(d.resolve()),
                    **hw_sig.columns(),
                    **wl_sig.columns(),
                    **layout.columns(),
                }
            )
        return recs

    def _write(self, table: pa.Table, name: str) -> None:
        """Write one study's file: straight to an object store, else ``*.tmp`` then ``move``."""
        self.fs.create_dir(self.base, recursive=True)
        dest = self._path(name)
        if self.fs.type_name in OBJECT_STORES:
            pq.write_table(table, dest, filesystem=self.fs)
            return
        tmp = f"{dest}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        pq.write_table(table, tmp, filesystem=self.fs)
        try:
            if self.fs.type_name != "local":  # some filesystems refuse to move onto a file
                self._delete(dest)
            self.fs.move(tmp, dest)
        except BaseException:
            self._delete(tmp)
            raise

    def _delete(self, path: str) -> None:
        if self.fs.get_file_info(path).type == pafs.FileType.File:
            self.fs.delete_file(path)

    def files(self) -> list[str]:
        """The bank's complete Parquet files, paths on its filesystem (``*.tmp`` leftovers ignored)."""
        infos = self.fs.get_file_info(pafs.FileSelector(self.base, allow_not_found=True))
        return sorted(
            i.path for i in infos if i.type == pafs.FileType.File and i.path.endswith(".parquet")
        )

    def table(self) -> pa.Table:
        """Every row in the bank with ``SCHEMA``'s columns (an empty table for an empty bank;
        a file written before the signatures has nulls in their columns)."""
        tables = []
        for f in self.files():
            try:
                tables.append(_conform(pq.read_table(f, filesystem=self.fs)))
            except (OSError, pa.ArrowInvalid):
                continue  # a damaged file is skipped; re-ingest its study to repair it
        if not tables:
            return SCHEMA.empty_table()
        return pa.concat_tables(tables)

    def query(
        self,
        *,
        device: str | None = None,
        workload: str | None = None,
        status: str | None = None,
        study: str | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Rows as dicts (``config`` and ``hardware`` parsed), newest study first then by trial.

        ``device``: a case-insensitive substring of the device name, kind or fingerprint;
        ``workload``: the workload's name (or a substring of it, its family or entry point);
        ``status``: a trial status; ``study``: the study's name or key; ``limit``: at most this many.
        """
        out = []
        for rec in self.table().to_pylist():
            if status and rec["status"] != status:
                continue
            if study and study not in (rec["study"], rec["study_id"]):
                continue
            if device and not _contains(
                device,
                rec.get("hw_device_name"),
                rec.get("hw_device_kind"),
                rec.get("hardware_fingerprint"),
                rec.get("hardware"),
            ):
                continue
            if workload and not _contains(
                workload,
                rec.get("workload_name"),
                rec.get("wl_entry_point"),
                rec.get("model_family"),
            ):
                continue
            rec["config"] = json.loads(rec["config"]) if rec.get("config") else {}
            rec["hardware"] = json.loads(rec["hardware"]) if rec.get("hardware") else {}
            out.append(rec)
        out.sort(key=lambda r: (-(r["added_at"] or 0.0), r["study"] or "", r["trial_id"] or ""))
        return out[:limit] if limit is not None else out

    def stats(self) -> dict[str, Any]:
        """What the bank holds: ``location``, ``files``, ``studies``, ``rows``, ``rows_by_status``,
        ``hardware`` (device name or kind -> rows), ``workloads`` (name -> rows), ``legacy_rows``
        (rows written before the signatures)."""
        recs = (
            self.table()
            .select(
                [
                    "study_id",
                    "status",
                    "hw_device_name",
                    "hw_device_kind",
                    "hardware",
                    "workload_name",
                    "wl_name",
                ]
            )
            .to_pylist()
        )
        hw: Counter[str] = Counter()
        for r in recs:
            name = r["hw_device_name"] or r["hw_device_kind"]
            if name is None:
                h = json.loads(r["hardware"] or "{}")
                name = h.get("device_name") or h.get("device_kind") or h.get("device") or "unknown"
            hw[str(name)] += 1
        return {
            "location": self.uri,
            "files": len(self.files()),
            "studies": len({r["study_id"] for r in recs}),
            "rows": len(recs),
            "rows_by_status": dict(sorted(Counter(str(r["status"]) for r in recs).items())),
            "hardware": dict(hw.most_common()),
            "workloads": dict(
                Counter(str(r["workload_name"] or r["wl_name"]) for r in recs).most_common()
            ),
            "legacy_rows": sum(1 for r in recs if r["wl_name"] is None),
        }

    def warm_start_rows(
        self,
        workload: Any,
        space: Any,
        hardware: Mapping[str, Any] | str | None,
        *,
        num_params: int | None = None,
        include_same_hardware: bool = True,
        exclude_study: str | None = None,
        max_rows: int = 200,
    ) -> list[dict[str, Any]]:
        """Prior observations for a new study, in relative terms, most similar first.

        Args:
            workload: a ``Workload``, a ``Contract`` or a workload dict (family, tokens per step
                and world size are read from it).
            space: the new study's ``SearchSpace``, its YAML path/text or dict; only rows of a
                space with the same name are used, and configs keep only its knobs.
            hardware: the new study's hardware dict (or fingerprint); rows measured on it are
                marked ``same_hardware``, and left out when ``include_same_hardware`` is False
                (the default keeps them: the same cluster's studies of another model size or node
                count are the closest experience there is).
            num_params: the new model's parameter count, for similarity (optional).
            exclude_study: a study key (``study_key``) whose rows are left out (the new study's
                own; by default a ``Contract`` passed as ``workload`` excludes itself).

        Returns:
            Dicts with ``config`` (the space's knobs only), ``bank_config`` (as measured),
            ``status`` (ok | oom), ``relative_step_time`` (step time over that study's baseline;
            None for oom), ``relative_peak_memory`` (peak over that study's capacity; a lower
            bound when ``memory_censored``), ``memory_censored``, ``similarity`` in (0, 1],
            ``source_study``, ``source_key``, ``trial_id``, ``hardware_fingerprint``, ``same_hardware``, and the
            absolute ``step_time_s``, ``peak_memory_bytes``, ``memory_capacity_bytes`` and the
            source's ``study_dir`` (for ``infrarsi.bank.transfer``).
        """
        if exclude_study is None and isinstance(workload, Contract):
            exclude_study = study_key(workload)
        wl = _workload_features(workload)
        fam, tps, ws = wl
        space_name, knobs = _space_info(space)
        fp = hardware_fingerprint(hardware)
        out = []
        for rec in self.table().to_pylist():
            if rec["status"] not in ("ok", "oom") or (
                rec.get("simulated") and not _is_sim(hardware)
            ):
                continue
            if not include_same_hardware and rec["hardware_fingerprint"] == fp:
                continue
            if exclude_study and rec["study_id"] == exclude_study:
                continue
            if space_name and rec["space_name"] and rec["space_name"] != space_name:
                continue
            if fam and rec["model_family"] and rec["model_family"] != fam:
                continue
            if rec["status"] == "ok" and rec["relative_step_time"] is None:
                continue
            raw = json.loads(rec["config"])
            cfg = {k: v for k, v in raw.items() if k in knobs} if knobs else dict(raw)
            dist = (
                _logdist(tps, rec["tokens_per_step"])
                + _logdist(ws, rec["world_size"])
                + _logdist(num_params, rec["num_params"])
            )
            out.append(
                {
                    "config": cfg,
                    "bank_config": raw,
                    "status": rec["status"],
                    "relative_step_time": rec["relative_step_time"],
                    "relative_peak_memory": rec["relative_peak_memory"],
                    "memory_censored": bool(rec["memory_censored"]),
                    "similarity": math.exp(-dist),
                    "source_study": rec["study"],
                    "source_key": rec["study_id"],
                    "trial_id": rec["trial_id"],
                    "hardware_fingerprint": rec["hardware_fingerprint"],
                    "same_hardware": rec["hardware_fingerprint"] == fp,
                    "step_time_s": rec["step_time_s"],
                    "peak_memory_bytes": rec["peak_memory_bytes"],
                    "memory_capacity_bytes": rec["memory_capacity_bytes"],
                    "study_dir": rec["study_dir"],
                }
            )
        out.sort(key=lambda x: (-x["similarity"], x["relative_step_time"] or math.inf))
        return out[:max_rows]


def _contains(needle: str, *hay: Any) -> bool:
    n = needle.lower()
    return any(h is not None and n in str(h).lower() for h in hay)


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
        raise ValueError(
            f"`baseline_step_time_s > 0 and memory_capacity_bytes > 0` must hold, but "
            f"got ({baseline_step_time_s}, {memory_capacity_bytes})."
        )
    out = []
    for r in rows:
        rel_t, rel_m = r.get("relative_step_time"), r.get("relative_peak_memory")
        out.append(
            {
                "config": dict(r["config"]),
                "status": r["status"],
                "step_time_s": rel_t * baseline_step_time_s if rel_t is not None else None,
                "peak_memory_bytes": rel_m * memory_capacity_bytes if rel_m is not None else None,
                "memory_censored": bool(r.get("memory_censored")),
                "similarity": r.get("similarity", 1.0),
                "source_study": r.get("source_study"),
            }
        )
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
    return (
        getattr(getattr(workload, "model", None), "family", None),
        getattr(workload, "tokens_per_step", None),
        getattr(workload, "world_size", None),
    )


__all__ = [
    "LEGACY_SCHEMA",
    "SCHEMA",
    "Bank",
    "default_root",
    "hardware_fingerprint",
    "open_filesystem",
    "scale_prior",
    "study_key",
]
