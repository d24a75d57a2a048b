"""The Arrow trial log: one row per trial, crash-safe.

Layout: ``STUDY/trials/*.arrows``. Each writer process opens its own new IPC *stream* file
(``<timestamp>-<pid>-<uuid>.arrows``), writes one record batch per trial, and flushes and fsyncs
it. It never appends a second stream to an existing file, because a reader stops at the first
end-of-stream marker. ``read_trials`` reads every segment and tolerates a torn last batch (a
writer killed mid-write), which pyarrow reports as ``OSError`` or ``ArrowInvalid``.

The schema is derived from ``infrarsi.result.TrialResult``: adding a field there adds a column
here. Dict fields (and ``extra``, a ``TrialExtra``) are stored as JSON strings, ``started_at``/
``ended_at`` as UTC timestamps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import os
import time
import types
import typing
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa

from infrarsi.errors import LogError
from infrarsi.result import TrialExtra, TrialResult
from infrarsi.study.paths import StudyPaths, make_private_dir, write_error

SEGMENT_SUFFIX = ".arrows"
"""File suffix of one writer's IPC stream segment."""
_TIMESTAMP_FIELDS = ("started_at", "ended_at")
_TS_TYPE = pa.timestamp("us", tz="UTC")


def _arrow_type(name: str, hint: Any) -> pa.DataType:
    """Arrow type of one TrialResult field (``X | None`` becomes a nullable X)."""
    if name in _TIMESTAMP_FIELDS:
        return _TS_TYPE
    origin = typing.get_origin(hint)
    if origin is typing.Literal and all(isinstance(a, str) for a in typing.get_args(hint)):
        return pa.string()
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return _arrow_type(name, args[0])
    if hint is bool:
        return pa.bool_()
    if hint is int:
        return pa.int64()
    if hint is float:
        return pa.float64()
    if hint is str:
        return pa.string()
    if origin is list:
        (inner,) = typing.get_args(hint) or (str,)
        return pa.list_(pa.float64() if inner is float else pa.string())
    if origin is dict or hint is dict or hint is TrialExtra:
        return pa.string()  # JSON text
    raise LogError(f"TrialResult field {name!r} has type {hint!r}, which the log cannot store.")


def trial_schema() -> pa.Schema:
    """The Arrow schema of one trial row, derived from ``TrialResult``."""
    hints = typing.get_type_hints(TrialResult)
    return pa.schema(
        [
            pa.field(f.name, _arrow_type(f.name, hints[f.name]))
            for f in dataclasses.fields(TrialResult)
        ]
    )


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    return str(obj)


def _row(result: TrialResult, schema: pa.Schema) -> dict[str, list[Any]]:
    data = result.to_dict()
    row: dict[str, list[Any]] = {}
    for fld in schema:
        value = data.get(fld.name)
        if fld.name in _TIMESTAMP_FIELDS:
            value = _dt.datetime.fromtimestamp(float(value or 0.0), tz=_dt.timezone.utc)
        elif pa.types.is_string(fld.type) and isinstance(value, dict):
            value = json.dumps(value, sort_keys=True, default=_json_default)
        elif pa.types.is_list(fld.type) and value is not None:
            value = [
                float(v) if pa.types.is_floating(fld.type.value_type) else str(v) for v in value
            ]
        row[fld.name] = [value]
    return row


def trials_dir(study_dir: str | os.PathLike[str]) -> Path:
    """The ``trials/`` folder of a study directory."""
    return StudyPaths(Path(study_dir)).trials


class TrialLogWriter:
    """Appends trial rows to this process's own new stream file under ``STUDY/trials/``.

    The file is created at the first ``write``; each row is one batch, flushed and fsynced.
    Use as a context manager, or call ``close()``.
    """

    def __init__(self, study_dir: str | os.PathLike[str]) -> None:
        self.study_dir = Path(study_dir)
        """The study directory; rows go to its ``trials/`` folder."""
        self.schema = trial_schema()
        """Arrow schema of the rows."""
        self.path: Path | None = None
        """Path of this writer's segment, once the first row was written."""
        self._sink: pa.OSFile | None = None
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None

    def _open(self) -> None:
        folder = trials_dir(self.study_dir)
        try:
            make_private_dir(
                self.study_dir
            )  # `infrarsi trial --log DIR` may make the study directory
            make_private_dir(folder)
        except OSError as e:
            raise write_error(self.study_dir, folder, e, "create the trial log folder") from e
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        path = folder / f"{stamp}-{os.getpid()}-{uuid.uuid4().hex[:12]}{SEGMENT_SUFFIX}"
        try:
            self._sink = pa.OSFile(str(path), "ab")
            self._writer = pa.ipc.new_stream(self._sink, self.schema)
        except OSError as e:
            self._abandon()
            raise write_error(self.study_dir, path, e, "create a trial log segment") from e
        self.path = path

    def write(self, result: TrialResult) -> None:
        """Append one trial row and make it durable (flush + fsync).

        A write that fails (a full disk, a directory made read-only) raises ``LogError`` naming
        the file and the fix. The segment is cut back to its last complete row and abandoned, so
        the failed row is not half in the log and every row written before stays readable; the
        next ``write`` starts a new segment."""
        if self._writer is None:
            self._open()
        if self._writer is None or self._sink is None:
            raise LogError("trial log writer: no open segment after opening one (a bug).")
        batch = pa.RecordBatch.from_pydict(_row(result, self.schema), schema=self.schema)
        path = self.path
        start = self._sink.tell()
        try:
            self._writer.write_batch(batch)
            self._sink.flush()
            os.fsync(self._sink.fileno())
        except OSError as e:
            self._abandon()
            if path is not None:
                with contextlib.suppress(OSError):  # a reader drops a torn tail anyway
                    os.truncate(path, start)  # drop the torn row: never a half-logged trial
            raise write_error(
                self.study_dir,
                path or trials_dir(self.study_dir),
                e,
                f"log trial {result.trial_id!r}",
            ) from e

    def _abandon(self) -> None:
        """Drop the current segment without an end-of-stream marker (after a failed write)."""
        sink, self._writer, self._sink, self.path = self._sink, None, None, None
        if sink is not None:
            with contextlib.suppress(OSError):
                sink.close()

    def close(self) -> None:
        """Write the end-of-stream marker and close the file (idempotent)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._sink is not None:
            self._sink.close()
            self._sink = None

    def __enter__(self) -> TrialLogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _segment_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    folder = StudyPaths(path).trials if StudyPaths(path).trials.is_dir() else path
    return sorted(folder.glob(f"*{SEGMENT_SUFFIX}"))


def _read_segment(path: Path) -> pa.Table | None:
    """Every complete batch of one segment; a torn tail (crash mid-write) is dropped."""
    batches: list[pa.RecordBatch] = []
    try:
        reader = pa.ipc.open_stream(pa.memory_map(str(path)))
    except (OSError, pa.ArrowInvalid):
        return None  # empty file, or torn before the schema was complete
    schema = reader.schema
    while True:
        try:
            batches.append(reader.read_next_batch())
        except StopIteration:
            break
        except (OSError, pa.ArrowInvalid):
            break  # torn last batch
    return pa.Table.from_batches(batches, schema=schema)


def read_trials(path: str | os.PathLike[str]) -> pa.Table:
    """All trial rows of a study directory (or of its ``trials/`` folder, or of one segment).

    Segments are read in name order (their names start with a UTC timestamp). Columns missing
    from older segments are null. A missing folder gives an empty table.
    """
    p = Path(path)
    tables = [t for t in (_read_segment(f) for f in _segment_files(p)) if t is not None]
    if not tables:
        return trial_schema().empty_table()
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise LogError(f"trial log segments under {str(p)!r} have incompatible schemas: {e}") from e


def _from_cell(value: Any) -> Any:
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        return value.timestamp()
    return value


_NOT_NULL = frozenset(
    f.name
    for f in dataclasses.fields(TrialResult)
    if f.default not in (None, dataclasses.MISSING) or f.default_factory is not dataclasses.MISSING
)
"""TrialResult fields whose default is not None: a null cell (a column missing from an older
segment) takes the field's default."""


def rows(table: pa.Table) -> list[TrialResult]:
    """The trial rows of a table from ``read_trials`` as ``TrialResult`` objects (null cells of
    fields that are never None take the field's default)."""
    out = []
    for record in table.to_pylist():
        data = {k: _from_cell(v) for k, v in record.items() if not (v is None and k in _NOT_NULL)}
        out.append(TrialResult.from_dict(data))
    return out


def read_results(path: str | os.PathLike[str]) -> list[TrialResult]:
    """Shortcut: ``rows(read_trials(path))``."""
    return rows(read_trials(path))


__all__ = ["TrialLogWriter", "read_results", "read_trials", "rows", "trial_schema", "trials_dir"]
