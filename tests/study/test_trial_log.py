"""The Arrow trial log: schema, round trip, several writers, and a writer killed mid-write."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pytest

from infrarsi.errors import LogError
from infrarsi.result import TrialExtra, TrialResult
from infrarsi.study.trial_log import TrialLogWriter, read_trials, rows, trial_schema


def _result(i: int, **kw) -> TrialResult:
    base = dict(
        trial_id=f"t{i}",
        stage="run",
        config={"zero_stage": i % 4, "dtype": "fp32"},
        status="ok",
        patches=["workloads/patches/a.patch"],
        step_time_s=0.5 + i,
        step_time_samples_s=[0.5, 0.6],
        peak_memory_bytes=10**8 + i,
        loss=[3.0, 2.9],
        tokens_per_step=2048,
        optimizer_steps=2,
        world_size=2,
        nodes=1,
        device_seconds=12.5,
        started_at=1_700_000_000.25,
        ended_at=1_700_000_010.5,
        hardware={"device": "cpu"},
        extra=TrialExtra(warm=True),
        phase_times_s={"forward": 0.1},
    )
    base.update(kw)
    return TrialResult(**base)


def test_schema_has_the_required_columns_and_types():
    s = trial_schema()
    assert s.field("config").type == pa.string()
    assert s.field("hardware").type == pa.string()
    assert s.field("extra").type == pa.string()
    assert s.field("stage").type == s.field("status").type == pa.string()
    assert s.field("patches").type == pa.list_(pa.string())
    assert s.field("loss").type == pa.list_(pa.float64())
    assert s.field("step_time_samples_s").type == pa.list_(pa.float64())
    assert pa.types.is_timestamp(s.field("started_at").type)
    assert pa.types.is_timestamp(s.field("ended_at").type)
    assert s.field("tokens_per_step").type == pa.int64()
    assert s.field("optimizer_steps").type == pa.int64()
    assert s.field("memory_censored").type == pa.bool_()
    assert s.field("step_time_s").type == pa.float64()
    for name in (
        "trial_id",
        "stage",
        "status",
        "error",
        "peak_memory_bytes",
        "tokens_per_s",
        "mfu",
        "world_size",
        "nodes",
        "device_seconds",
    ):
        assert name in s.names


def test_round_trip_of_rows_including_nulls(tmp_path):
    written = [
        _result(0),
        _result(1, status="oom", step_time_s=None, memory_censored=True, loss=[]),
        _result(2, status="failed", error="boom", step_time_s=None, peak_memory_bytes=None),
    ]
    with TrialLogWriter(tmp_path) as w:
        for r in written:
            w.write(r)
    assert w.path is not None and w.path.parent == tmp_path / "trials"
    table = read_trials(tmp_path)
    assert table.num_rows == 3
    back = rows(table)
    assert [r.to_dict() for r in back] == [r.to_dict() for r in written]


def test_each_writer_has_its_own_segment_and_the_reader_reads_all(tmp_path):
    with TrialLogWriter(tmp_path) as a, TrialLogWriter(tmp_path) as b:
        a.write(_result(0))
        b.write(_result(1))
        a.write(_result(2))
    assert a.path != b.path
    assert len(list((tmp_path / "trials").glob("*.arrows"))) == 2
    assert sorted(read_trials(tmp_path)["trial_id"].to_pylist()) == ["t0", "t1", "t2"]
    assert read_trials(tmp_path / "trials").num_rows == 3  # the trials/ folder itself works too


def test_empty_or_missing_log_gives_an_empty_table(tmp_path):
    assert read_trials(tmp_path / "nope").num_rows == 0
    (tmp_path / "trials").mkdir()
    (tmp_path / "trials" / "empty.arrows").write_bytes(b"")
    assert read_trials(tmp_path).num_rows == 0


_WRITER = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {root!r})
    from infrarsi.study.trial_log import TrialLogWriter
    from infrarsi.result import TrialResult
    w = TrialLogWriter({study!r})
    i = 0
    while True:
        w.write(TrialResult(trial_id=f"t{{i}}", stage="run", config={{"i": i}}, status="ok",
                            loss=[float(i)] * 2000, step_time_samples_s=[0.1] * 2000))
        print(i, flush=True)
        i += 1
    """
)


def test_log_survives_a_writer_killed_with_sigkill(tmp_path):
    """Every batch flushed before kill -9 is read back; the torn tail is dropped, not an error."""
    root = str(Path(__file__).resolve().parents[2])
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER.format(root=root, study=str(tmp_path))],
        stdout=subprocess.PIPE,
        text=True,
    )
    acknowledged = -1
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            acknowledged = int(line)
            if acknowledged >= 30:
                break
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    table = read_trials(tmp_path)
    ids = table["trial_id"].to_pylist()
    # every row the writer acknowledged (written + fsynced before the print) is there, in order
    assert ids[: acknowledged + 1] == [f"t{i}" for i in range(acknowledged + 1)]
    assert len(ids) <= acknowledged + 3
    back = rows(table)
    assert back[acknowledged].config == {"i": acknowledged}
    assert len(back[acknowledged].loss) == 2000


def test_torn_tail_in_the_middle_of_a_batch_is_tolerated(tmp_path):
    with TrialLogWriter(tmp_path) as w:
        for i in range(3):
            w.write(_result(i))
    assert w.path is not None
    data = w.path.read_bytes()
    # drop the end-of-stream marker and cut the last batch in half
    one = len(data) // 4
    w.path.write_bytes(data[: len(data) - one])
    n = read_trials(tmp_path).num_rows
    assert 1 <= n < 3


def test_timestamps_are_utc(tmp_path):
    with TrialLogWriter(tmp_path) as w:
        w.write(_result(0, started_at=time.time()))
    col = read_trials(tmp_path)["started_at"]
    assert col.type.tz == "UTC"


def test_unserialisable_extra_is_stringified(tmp_path):
    with TrialLogWriter(tmp_path) as w:
        w.write(_result(0, extra=TrialExtra(ds_config={"x": object()})))
    ds_config = rows(read_trials(tmp_path))[0].extra.ds_config
    assert ds_config is not None and "object" in ds_config["x"]


def test_extra_is_stored_as_the_json_object_of_its_set_fields(tmp_path):
    """The ``extra`` column holds the same JSON object as before ``TrialExtra``: only the keys
    that are set, under their names; an earlier version's row reads back, its unknown keys kept."""
    import json

    with TrialLogWriter(tmp_path) as w:
        w.write(_result(0, extra=TrialExtra(role="baseline", repeat=0, pids=[1, 2])))
        w.write(_result(1, extra={"model_params": 7, "some_old_key": "kept", "warm": False}))
    table = read_trials(tmp_path)
    stored = [json.loads(x) for x in table["extra"].to_pylist()]
    assert stored[0] == {"role": "baseline", "repeat": 0, "pids": [1, 2]}
    old = rows(table)[1].extra
    assert old.num_params == 7 and old.warm is False and old.unknown == {"some_old_key": "kept"}
    assert stored[1] == {"num_params": 7, "some_old_key": "kept", "warm": False}


def test_the_trial_log_makes_its_study_directory_0700(tmp_path: Path) -> None:
    """``infrarsi trial --log DIR`` writes through ``TrialLogWriter``, which makes DIR."""
    import stat

    study = tmp_path / "new_study"
    with TrialLogWriter(study) as w:
        w.write(TrialResult(trial_id="t0", stage="trial", config={}, status="failed", error="x"))
    assert stat.S_IMODE(study.stat().st_mode) == 0o700
    assert stat.S_IMODE((study / "trials").stat().st_mode) == 0o700


# ----------------------------------------------------------------------------- write faults
def _enospc(fd: int) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_is_a_log_error_naming_the_file_and_the_fix_and_loses_no_row(
    tmp_path, monkeypatch
):
    """ENOSPC at the fsync of the third row (fault injected at the write): a ``LogError`` naming
    the segment, the full disk and the fix; the two rows logged before read back unchanged, the
    failed row is not half in the log, and once space is back the next row opens a new segment."""
    w = TrialLogWriter(tmp_path)
    written = [_result(0), _result(1)]
    for r in written:
        w.write(r)
    segment = w.path
    monkeypatch.setattr(os, "fsync", _enospc)
    with pytest.raises(LogError) as info:
        w.write(_result(2))
    msg = str(info.value)
    assert str(segment) in msg and "'t2'" in msg
    assert "full" in msg and "free space" in msg and "--resume" in msg
    assert [r.to_dict() for r in rows(read_trials(tmp_path))] == [r.to_dict() for r in written]
    monkeypatch.undo()
    w.write(_result(2))
    w.close()
    assert w.path != segment
    assert sorted(read_trials(tmp_path)["trial_id"].to_pylist()) == ["t0", "t1", "t2"]


def test_a_full_disk_when_a_segment_is_created_is_a_log_error(tmp_path, monkeypatch):
    """A harness that starts on a full disk (its new segment's first bytes go to /dev/full,
    which answers every write with ENOSPC): a ``LogError``, and the old rows are intact."""
    with TrialLogWriter(tmp_path) as w:
        w.write(_result(0))
    real = pa.OSFile
    monkeypatch.setattr(pa, "OSFile", lambda path, mode="r": real("/dev/full", mode))
    with pytest.raises(LogError, match="No space left on device") as info:
        TrialLogWriter(tmp_path).write(_result(1))
    assert str(tmp_path / "trials") in str(info.value) and "free space" in str(info.value)
    monkeypatch.undo()
    assert read_trials(tmp_path)["trial_id"].to_pylist() == ["t0"]


def test_an_unwritable_study_directory_is_a_log_error_and_the_log_is_intact(
    tmp_path, make_unwritable
):
    with TrialLogWriter(tmp_path) as w:
        w.write(_result(0))
    make_unwritable(tmp_path / "trials")
    with pytest.raises(LogError) as info:
        TrialLogWriter(tmp_path).write(_result(1))
    msg = str(info.value)
    assert str(tmp_path / "trials") in msg and "not writable" in msg and "chmod -R u+w" in msg
    assert read_trials(tmp_path)["trial_id"].to_pylist() == ["t0"]
