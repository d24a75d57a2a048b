"""``infrarsi bank ingest | query | stats``: the experience bank (``infrarsi.bank.store``) on the command line.

The bank is a local directory or a filesystem URI (``s3://``, ``gs://``, ``hdfs://``, ``file://``,
or any fsspec protocol with ``fsspec`` installed): ``--bank``, else for ``ingest`` the bank the
study's contract names, else ``$INFRARSI_BANK``, else ``~/.cache/infrarsi/bank``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from infrarsi.cli.app import app, console, env_help, handle_errors
from infrarsi.cli.options import wait_option, wait_seconds
from infrarsi.errors import ConfigError, StudyError
from infrarsi.study.paths import StudyPaths

bank_app = typer.Typer(
    name="bank",
    help="The experience bank: ingest studies, query rows, stats.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(bank_app, name="bank")

BANK_HELP = env_help(
    "The bank: a directory or a URI (s3://bucket/bank, gs://..., hdfs://..., file:///abs/path, "
    "memory://... with fsspec). Default: $INFRARSI_BANK, else ~/.cache/infrarsi/bank.",
    "INFRARSI_BANK",
)


def open_bank(bank: str | None, *, study_dir: Path | None = None) -> Any:
    """The ``Bank`` that ``--bank`` names (``ConfigError``, exit 2, for ``off`` or a bad value);
    without it the study's contract's bank (for ingest), else the environment's."""
    from infrarsi.bank.store import Bank
    from infrarsi.study.switches import BANK_ENV, bank_from_environment, parse_bank

    if bank is not None:
        root = parse_bank(bank, what="--bank")
        if root is None:
            raise ConfigError(
                f"--bank: rule: a bank location, not off; value: {bank!r}. "
                f"Fix: name the bank's directory or URI."
            )
        return Bank(root)
    if study_dir is not None and StudyPaths(study_dir).contract.exists():
        from infrarsi.study.contract import Contract

        root = Contract.load(study_dir, check_files=False).switches_in_force().bank
        if root is not None:
            return Bank(root)
    root = bank_from_environment()
    if root is None:
        raise ConfigError(
            f"environment variable {BANK_ENV}: rule: a bank location when --bank is not given; "
            f"value: off. Fix: pass --bank PATH_OR_URI, or unset {BANK_ENV}."
        )
    return Bank(root)


def _studies(folder: Path) -> list[Path]:
    """``folder`` if it is a study, else the studies directly inside it."""
    if StudyPaths(folder).contract.exists():
        return [folder]
    if folder.is_dir():
        return sorted(p for p in folder.iterdir() if StudyPaths(p).contract.exists())
    return []


@bank_app.command("ingest")
@handle_errors
def ingest_cmd(
    study: list[Path] = typer.Argument(..., help="Study directories (or folders holding studies)."),
    bank: str | None = typer.Option(
        None, "--bank", help="Without it: the study's contract's bank. " + BANK_HELP
    ),
    as_json: bool = typer.Option(False, "--json", help="Print what was ingested as JSON."),
    wait: str | None = wait_option(),
) -> None:
    """Add (or replace: ingest is idempotent) every logged trial of each study to the bank (holding
    each study's lock while it reads it)."""
    from infrarsi.study.lock import hold_study

    found = [(d, s) for d in study for s in _studies(d)]
    missing = [str(d) for d in study if not _studies(d)]
    if missing:
        raise ConfigError(
            f"{missing[0]}: rule: a study directory (with contract.yaml) or a folder of them. "
            f"Fix: run `infrarsi init` there first, or name the study directory."
        )
    out = []
    for _, s in found:
        b = open_bank(bank, study_dir=s)
        try:
            with hold_study(s, "bank", wait_s=wait_seconds(wait)):
                n = b.add_study(s)
        except StudyError as e:  # a study with nothing logged: bad input for this command
            raise ConfigError(f"{s}/trials: rule: a study with logged trials; {e} ") from None
        out.append({"study": str(s), "bank": b.uri, "rows": n, "atomic": b.atomic_writes})
    if as_json:
        print(json.dumps(out, indent=2))
        return
    for o in out:
        note = (
            ""
            if o["atomic"]
            else " (this filesystem's move is not atomic: a reader may briefly miss the study)"
        )
        console.print(
            f"ingested {o['study']}: {o['rows']} rows into {o['bank']}{note}", highlight=False
        )


@bank_app.command("query")
@handle_errors
def query_cmd(
    bank: str | None = typer.Option(None, "--bank", help=BANK_HELP),
    device: str | None = typer.Option(
        None, "--device", help="Device name, kind or fingerprint (substring, any case)."
    ),
    workload: str | None = typer.Option(
        None, "--workload", help="Workload name, family or entry point (substring)."
    ),
    status: str | None = typer.Option(
        None,
        "--status",
        help="Trial status: ok | oom | failed | timeout | nan | invariant_violation.",
    ),
    study: str | None = typer.Option(None, "--study", help="A study's name or key."),
    limit: int = typer.Option(20, "--limit", help="At most this many rows (0: all)."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON (every column)."),
) -> None:
    """Rows of the bank, newest study first."""
    from infrarsi.result import STATUSES

    if status is not None and status not in STATUSES:
        raise ConfigError(
            f"--status: rule: one of {', '.join(STATUSES)}; value: {status!r}. Fix: e.g. --status ok."
        )
    if limit < 0:
        raise ConfigError(f"--limit: rule: >= 0 (0: all); value: {limit}. Fix: e.g. --limit 20.")
    rows = open_bank(bank).query(
        device=device, workload=workload, status=status, study=study, limit=limit or None
    )
    if as_json:
        print(json.dumps(rows, indent=2, default=str))
        return
    from rich.table import Table

    t = Table(
        "study", "trial", "stage", "status", "device", "workload", "step s", "vs baseline", "config"
    )
    for r in rows:
        rel = r.get("relative_step_time")
        t.add_row(
            str(r["study"]),
            str(r["trial_id"]),
            str(r["stage"]),
            str(r["status"]),
            str(
                r.get("hw_device_name")
                or r.get("hw_device_kind")
                or r["hardware"].get("device")
                or "-"
            ),
            str(r.get("workload_name")),
            "-" if r["step_time_s"] is None else f"{r['step_time_s']:.4g}",
            "-" if rel is None else f"{rel:.3f}",
            json.dumps(r["config"], sort_keys=True),
        )
    console.print(t)
    console.print(f"{len(rows)} rows", highlight=False)


@bank_app.command("stats")
@handle_errors
def stats_cmd(
    bank: str | None = typer.Option(None, "--bank", help=BANK_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the stats as JSON."),
) -> None:
    """What the bank holds: studies, rows by status, hardware kinds, workloads."""
    s = open_bank(bank).stats()
    if as_json:
        print(json.dumps(s, indent=2))
        return
    console.print(
        f"bank {s['location']}: {s['studies']} studies, {s['rows']} rows in {s['files']} files"
        + (f" ({s['legacy_rows']} rows written before the signatures)" if s["legacy_rows"] else ""),
        highlight=False,
    )
    for title, key in (
        ("rows by status", "rows_by_status"),
        ("hardware", "hardware"),
        ("workloads", "workloads"),
    ):
        console.print(
            f"{title}: " + (", ".join(f"{k} {v}" for k, v in s[key].items()) or "none"),
            highlight=False,
        )
