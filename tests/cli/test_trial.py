"""``infrarsi trial``: exit codes on bad input, and real 2-rank trials through Ray."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import assume, given
from hypothesis import strategies as st
from malformed import PROPERTY, mutated, refused
from typer.testing import CliRunner

from infrarsi.cli import app
from infrarsi.cli.trial import parse_sets
from infrarsi.errors import ConfigError, UserInputError
from infrarsi.search import SearchSpace
from infrarsi.study.trial_log import read_trials, rows
from infrarsi.units import parse_duration, parse_size

ROOT = Path(__file__).resolve().parents[2]
DENSE = str(ROOT / "workloads" / "dense_debug.yaml")


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["trial", DENSE, "--set", "no_such_knob=1"], "no_such_knob"),
        (["trial", DENSE, "--set", "zero_stage=7"], "zero_stage"),
        (["trial", DENSE, "--set", "micro_batch_size=many"], "micro_batch_size"),
        (["trial", str(ROOT / "workloads" / "missing.yaml")], "missing.yaml"),
        (["trial", DENSE, "--set", "zero_stage"], "knob=value"),
        (["trial", DENSE, "--memory-capacity", "lots"], "--memory-capacity"),
        (["trial", DENSE, "--memory-capacity", "160"], "160MiB"),
        (["trial", DENSE, "--timeout", "-5m"], "--timeout"),
    ],
)
def test_bad_input_exits_2_and_names_it(args, needle):
    res = _invoke(*args)
    assert res.exit_code == 2, res.output
    assert needle in res.output.replace("\n", "")


def test_bad_log_format_exits_2():
    assert _invoke("--log-format", "xml", "trial", DENSE).exit_code == 2


def test_parse_sets_reads_yaml_scalars():
    assert parse_sets(["zero_stage=2", "dtype=bf16", "offload_optimizer=true", "x=1e-3"]) == {
        "zero_stage": 2,
        "dtype": "bf16",
        "offload_optimizer": True,
        "x": 1e-3,
    }
    with pytest.raises(ConfigError):
        parse_sets(["=3"])
    with pytest.raises(ConfigError):
        parse_sets(["a=[1, 2]"])


WORKLOAD_RAW = {
    **yaml.safe_load(Path(DENSE).read_text()),
    "search_space": str(ROOT / "search_spaces" / "deepspeed_dense.yaml"),
}
SECTIONS = {
    "model": ["family", "size", "overrides", "entry_point", "code_dir", "args"],
    "data": ["kind", "seed", "seq_len", "path", "dtype"],
    "steps": ["warmup", "measured"],
    "resources": ["workers", "nodes", "devices_per_worker", "cpus_per_worker", "device"],
    "optimizer": ["lr", "betas"],
    "baseline": ["zero_stage", "micro_batch_size", "dtype"],
}


@PROPERTY
@given(raw=mutated(WORKLOAD_RAW, SECTIONS))
def test_a_malformed_workload_exits_2_before_any_trial(raw: object, tmp_path: Path) -> None:
    """Any broken workload YAML exits 2 naming the file (or, when the junk happened to be valid,
    the unknown knob): never a traceback, never a trial (``--set no_such_knob`` stops a valid one)."""
    wl = tmp_path / "mutated_workload.yaml"
    wl.write_text(yaml.safe_dump(raw, sort_keys=False))
    res = _invoke("trial", str(wl), "--set", "no_such_knob=1")
    out = res.output.replace("\n", "")
    refused(res)
    assert str(wl) in out or "no_such_knob" in out, res.output


SPACE = SearchSpace.from_yaml(WORKLOAD_RAW["search_space"])
SET_VALUES = st.one_of(
    st.text(max_size=12),
    st.sampled_from(
        [
            "{a: 1}",
            "[1, 2]",
            "null",
            "2020-01-01",
            "!!binary aGk=",
            ".nan",
            "*a",
            "&a 1",
            "!!python/object:os.system",
            "1e400",
            "-1",
            "3.0",
            "'2'",
            "|\n x",
            "? a",
        ]
    ),
)


@PROPERTY
@given(
    knob=st.sampled_from(
        ["zero_stage", "micro_batch_size", "dtype", "offload_optimizer", "no_such_knob"]
    ),
    value=SET_VALUES,
)
def test_any_bad_set_value_exits_2_naming_the_knob(knob: str, value: str) -> None:
    """``--set knob=<anything>`` that is not a valid value of the knob (with the baseline's other
    values) exits 2 naming the knob, before any trial."""
    try:
        SPACE.validate({**WORKLOAD_RAW["baseline"], **parse_sets([f"{knob}={value}"])})
    except UserInputError:
        pass
    else:
        assume(False)  # a valid value would start a trial
    refused(_invoke("trial", DENSE, "--set", f"{knob}={value}"), knob)


@PROPERTY
@given(flag=st.sampled_from(["--timeout", "--memory-capacity"]), value=st.text(max_size=10))
def test_bad_trial_sizes_and_durations_exit_2(flag: str, value: str) -> None:
    try:
        parse_duration(value) if flag == "--timeout" else parse_size(value, unit_required=True)
    except ConfigError:
        pass
    else:
        assume(False)  # a valid value would start a trial
    assume(value != "")
    refused(_invoke("trial", DENSE, f"{flag}={value}"), flag)


# ----------------------------------------------------------------------------- integration
def _short_workload(tmp_path: Path, warmup: int = 1, measured: int = 2) -> str:
    data = yaml.safe_load(Path(DENSE).read_text())
    data["steps"] = {"warmup": warmup, "measured": measured}
    data["search_space"] = str(ROOT / "search_spaces" / "deepspeed_dense.yaml")
    path = tmp_path / "dense_short.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _cli(*args: str, address: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("infrarsi")
    return subprocess.run(
        [str(exe), *args, "--address", address],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )


@pytest.mark.integration
def test_trial_trains_two_ranks_and_logs_an_ok_row(ray_local, tmp_path):
    study = tmp_path / "study"
    proc = _cli(
        "trial",
        "workloads/dense_debug.yaml",
        "--set",
        "zero_stage=2",
        "--set",
        "micro_batch_size=4",
        "--log",
        str(study),
        address=ray_local,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok" in proc.stdout
    (row,) = rows(read_trials(study))
    assert row.status == "ok", row.error
    assert row.world_size == 2 and row.nodes == 1
    assert row.step_time_s is not None and row.step_time_s > 0
    assert row.peak_memory_bytes is not None and row.peak_memory_bytes > 0
    assert row.memory_censored is False
    assert row.tokens_per_step == 2048
    assert (
        row.optimizer_steps == len(row.loss) == 1 + 10
    )  # one loss per optimizer step (warm-up included)
    assert len(row.step_time_samples_s) == 10
    assert row.config["zero_stage"] == 2 and row.config["micro_batch_size"] == 4
    assert row.device_seconds > 0 and row.ended_at > row.started_at


@pytest.mark.integration
def test_trial_over_capacity_gives_a_censored_oom_row(ray_local, tmp_path):
    study = tmp_path / "study"
    proc = _cli(
        "trial",
        _short_workload(tmp_path),
        "--set",
        "zero_stage=2",
        "--set",
        "micro_batch_size=4",
        "--memory-capacity",
        "1MiB",
        "--log",
        str(study),
        address=ray_local,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr  # a trial that is not ok exits 1
    (row,) = rows(read_trials(study))
    assert row.status == "oom", row.error
    assert row.memory_censored is True
    assert row.peak_memory_bytes is not None and row.peak_memory_bytes >= 2**20
    assert row.step_time_s is None
    assert row.device_seconds > 0


@pytest.mark.integration
def test_an_entry_point_outside_the_repository_runs_a_trial(ray_local, tmp_path):
    """A job module written into a temporary folder (plain torch, its own ``global_batch``), named
    by a workload YAML's ``model.entry_point`` and ``model.code_dir``: one trial on 2 CPU ranks,
    with the harness's own token and step counts."""
    from tests.outside_job import SEQ_LEN, SEQUENCES, write_tiny_workload

    path = write_tiny_workload(tmp_path / "outside", warmup=1, measured=2)
    study = tmp_path / "study"
    proc = _cli("trial", str(path), "--log", str(study), address=ray_local)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = rows(read_trials(study))
    assert row.status == "ok", row.error
    assert row.world_size == 2
    # counted by the harness (forward pre-hook on the model), the same at every step
    assert row.tokens_per_step == SEQ_LEN * SEQUENCES and row.extra.tokens_per_step_varied is None
    assert row.extra.sequences_seen == [SEQUENCES] * 3
    assert row.optimizer_steps == len(row.loss) == 3
    assert (
        row.eval_loss is not None and row.loss[-1] < row.loss[0]
    )  # the counting sequences are learnt


def test_an_unknown_knob_in_the_workloads_baseline_names_the_file_and_field(tmp_path: Path) -> None:
    raw = yaml.safe_load(Path(DENSE).read_text())
    raw["baseline"] = {**raw.get("baseline", {}), "bogus": 1}
    raw["search_space"] = str(ROOT / "search_spaces" / "deepspeed_dense.yaml")
    wl = tmp_path / "bad_baseline.yaml"
    wl.write_text(yaml.safe_dump(raw, sort_keys=False))
    res = _invoke("trial", str(wl))
    refused(res, str(wl), "baseline", "bogus")
    assert "--set" not in res.output.replace("\n", "")
