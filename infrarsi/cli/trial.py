"""The ``infrarsi trial`` command: one trial of a workload, printed as a table or as JSON."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from pathlib import Path
from typing import Any

import typer
import yaml
from rich.table import Table

from infrarsi.cli.app import EXIT_FAILURE, command, console
from infrarsi.cli.options import shared
from infrarsi.errors import ConfigError
from infrarsi.result import TrialResult
from infrarsi.structlog_config import configure_logging
from infrarsi.units import format_bytes, parse_duration, parse_size


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``["zero_stage=2", "dtype=bf16"]`` -> ``{"zero_stage": 2, "dtype": "bf16"}`` (YAML scalars)."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ConfigError(f"--set {item!r}: expected knob=value, e.g. --set zero_stage=2.")
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError as e:
            raise ConfigError(f"--set {item!r}: the value is not a YAML scalar: {e}") from None
        if isinstance(value, str):
            with contextlib.suppress(ValueError):  # YAML 1.1 reads 1e-3 as a string
                value = float(value) if any(c in value for c in ".eE") else int(value)
        if isinstance(value, (dict, list)):
            raise ConfigError(
                f"--set {item!r}: the value must be a single number, bool or word, got {value!r}."
            )
        out[name] = value
    return out


def result_table(res: TrialResult, title: str | None = None) -> Table:
    """A rich table of one trial result."""
    table = Table(title=title or f"trial {res.trial_id}", show_header=True, header_style="bold")
    table.add_column("field")
    table.add_column("value", overflow="fold")

    def fmt(v: float | None, unit: str = "", digits: int = 4) -> str:
        return "-" if v is None else f"{v:.{digits}g}{unit}"

    style = "green" if res.status == "ok" else "red"
    rows: list[tuple[str, str]] = [
        ("status", f"[{style}]{res.status}[/]" + (" (simulated)" if res.simulated else "")),
        ("config", json.dumps(res.config, sort_keys=True)),
        ("step_time_s (median)", fmt(res.step_time_s, " s")),
        ("step_time_samples_s", ", ".join(f"{x:.3f}" for x in res.step_time_samples_s) or "-"),
        ("warmup_time_s", fmt(res.warmup_time_s, " s")),
        ("setup_time_s", fmt(res.setup_time_s, " s")),
        (
            "peak_memory_bytes",
            f"{format_bytes(res.peak_memory_bytes)}"
            + (" (censored: true peak is higher)" if res.memory_censored else "")
            + (f" [{res.memory_measure}]" if res.memory_measure else ""),
        ),
        ("tokens_per_step", str(res.tokens_per_step) if res.tokens_per_step is not None else "-"),
        ("optimizer_steps", str(res.optimizer_steps) if res.optimizer_steps is not None else "-"),
        ("tokens_per_s", fmt(res.tokens_per_s)),
        ("mfu", fmt(res.mfu)),
        (
            "loss (first -> last)",
            f"{res.loss[0]:.5f} -> {res.loss[-1]:.5f} ({len(res.loss)} steps)" if res.loss else "-",
        ),
        ("phase_times_s", ", ".join(f"{k}={v:.3f}" for k, v in res.phase_times_s.items()) or "-"),
        ("world_size / nodes", f"{res.world_size} / {res.nodes}"),
        ("device_seconds", fmt(res.device_seconds)),
    ]
    if res.error:
        rows.append(("error", res.error[-2000:]))
    for k, v in rows:
        table.add_row(k, v)
    return table


@command("trial")
def trial(
    workload: Path = typer.Argument(..., help="Workload YAML, e.g. workloads/dense_debug.yaml."),
    set_: list[str] = typer.Option(
        [], "--set", help="knob=value, repeatable; overrides the workload's baseline."
    ),
    memory_capacity: str | None = typer.Option(
        None,
        "--memory-capacity",
        help="Per-device memory capacity with units, e.g. 2GiB (default: the workload's, else the device's).",
    ),
    log: Path | None = typer.Option(
        None, "--log", help="Study directory: the row is appended to DIR/trials/ (Arrow)."
    ),
    timeout: str | None = typer.Option(
        None,
        "--timeout",
        help="Trial deadline with units, e.g. 90s or 5m (default: 120 s + 30 s per step).",
    ),
    address: str | None = shared("address"),
    trial_id: str | None = typer.Option(
        None, "--trial-id", help="Trial id (default: a fresh one)."
    ),
    log_format: str | None = typer.Option(
        None, "--log-format", help="Log lines on stderr: text | json."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print the result row as JSON instead of a table."
    ),
) -> None:
    """Run ONE trial of WORKLOAD (baseline knobs + --set overrides) and print its result.

    Exits 0 when the trial's status is ok, 1 for any other status (oom, failed, timeout, nan),
    2 on bad input.
    """
    from infrarsi.execution.runner import TrialRunner
    from infrarsi.patches import config_patch, patched_code
    from infrarsi.stages.init import workload_space_path
    from infrarsi.study.trial_log import TrialLogWriter
    from infrarsi.workload import Workload

    if log_format is not None:
        configure_logging(log_format)
    wl = Workload.from_yaml(workload)
    workload_space_path(wl, workload)
    capacity = (
        parse_size(memory_capacity, what="--memory-capacity", unit_required=True)
        if memory_capacity
        else None
    )
    timeout_s = parse_duration(timeout, what="--timeout") if timeout else None
    overrides = parse_sets(set_)
    tid = (
        trial_id or f"trial-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:6]}"
    )
    with TrialRunner(wl, memory_capacity_bytes=capacity, address=address) as runner:
        # bad input fails here, before Ray starts: the workload's own baseline first (named by its
        # file and field), then the baseline with the --set overrides
        runner.validate(dict(wl.baseline), where=f"{workload}: field `baseline`")
        full = runner.validate({**wl.baseline, **overrides}, where="--set")
        # a code patch runs in a temporary worktree with it applied: the study's own checkout
        with patched_code(runner.code_dir, config_patch(full)) as code:
            res = runner.run(
                full,
                trial_id=tid,
                stage="trial",
                timeout_s=timeout_s,
                code_dir=code.code_dir,
                patches=code.patches,
            )
            res.extra.update(code.extra)
    if log is not None:
        with TrialLogWriter(log) as writer:
            writer.write(res)
    if as_json:
        print(json.dumps(res.to_dict(), default=str))
    else:
        console.print(result_table(res, title=f"{wl.name}: trial {tid}"))
        if log is not None:
            console.print(f"row appended to {writer.path}")
    if res.status != "ok":
        raise typer.Exit(EXIT_FAILURE)
