"""The options the stage commands share, each defined once.

``SHARED_OPTIONS`` (``tune`` takes every option of the stages it runs), ``--wait``, and the parsing
of sizes, durations and the job a command names (a workload YAML or ``--script``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import typer

from infrarsi.cli.app import console, env_help
from infrarsi.units import parse_duration, parse_size

STUDY_HELP = "Study directory (everything a later stage needs is kept in it)."
CONCURRENCY_HELP = (
    "Run-stage trials at once, at most (default: as many as the cluster holds; each trial "
    "reserves its own devices and cores)."
)
ADDRESS_HELP = env_help("Existing Ray cluster address; default: start a local Ray.", "RAY_ADDRESS")
PRIOR_HELP = env_help(
    "Give the optimizer the workload's analytic prior (recorded in the contract; "
    "default: INFRARSI_PRIOR, else on).",
    "INFRARSI_PRIOR",
)
LOSS_GUARD_HELP = env_help(
    "Stop a trial at the first step whose loss leaves the tolerance (recorded in the contract; "
    "default: INFRARSI_LOSS_GUARD, else on).",
    "INFRARSI_LOSS_GUARD",
)
BANK_HELP = env_help(
    "Experience bank: a directory, a URI shared across clusters (s3://bucket/bank, gs://..., "
    "hdfs://..., file:///path, any fsspec protocol), or 'off' (recorded in the contract; default: "
    "INFRARSI_BANK, else ~/.cache/infrarsi/bank).",
    "INFRARSI_BANK",
)


WAIT_HELP = (
    "When another infrarsi process holds the study (one writer per study): wait for it, as long as "
    "it takes (--wait), or at most TIMEOUT (--wait 30m), instead of exiting 2 at once. Put it "
    "after the study directory, or write --wait=TIMEOUT."
)
WAIT_FOREVER = "forever"
SHARED_OPTIONS: dict[str, tuple[Any, tuple[str, ...], dict[str, Any]]] = {
    # init's, also tune's
    "script": (
        None,
        ("--script",),
        {
            "help": 'The launch line you run today, e.g. "deepspeed --num_gpus 2 train.py --deepspeed ds.json", '
            "instead of WORKLOAD: writes its workload YAML (NAME.infrarsi.yaml, here) and inits the study "
            "from it."
        },
    ),
    "seq_len": (
        None,
        ("--seq-len",),
        {
            "min": 1,
            "help": "With --script: tokens per sequence, when the script's arguments do not say.",
        },
    ),
    "request": ("", ("--request",), {"help": "The human request, kept verbatim in the contract."}),
    "space": (
        None,
        ("--space",),
        {
            "help": "Search-space YAML, or builtin:NAME for one shipped with infrarsi (builtin:deepspeed_dense, "
            "builtin:deepspeed_moe...); default: the workload's."
        },
    ),
    "memory_capacity": (
        None,
        ("--memory-capacity",),
        {"help": "Per-device memory capacity with units, e.g. 4GiB or 80GB."},
    ),
    "editable": (
        [],
        ("--editable",),
        {"help": "File glob a code patch may touch (repeatable; default workloads/**)."},
    ),
    "knob": (
        [],
        ("--knob",),
        {
            "help": "Knob a candidate may change (repeatable; default: every knob of the space "
            "but those of another arithmetic, which need --allow)."
        },
    ),
    "allow": (
        [],
        ("--allow",),
        {
            "help": "Knob of another arithmetic the study may search (repeatable, e.g. "
            "float8_linear; default: none, such knobs stay at the baseline)."
        },
    ),
    "trials": (
        None,
        ("--trials",),
        {"min": 1, "help": "Trial budget of the run stage (default 24)."},
    ),
    "time_budget": (
        None,
        ("--time-budget",),
        {"help": "Wall-time budget of the run stage, e.g. 10m."},
    ),
    "device_hours": (
        None,
        ("--device-hours",),
        {"help": "Device-hours budget (devices x hours, failed trials included)."},
    ),
    "loss_tolerance": (
        None,
        ("--loss-tolerance",),
        {
            "help": "Absolute per-step loss tolerance vs the baseline (default: calibrated by doctor)."
        },
    ),
    "analytic_prior": (None, ("--analytic-prior/--no-analytic-prior",), {"help": PRIOR_HELP}),
    "loss_guard": (None, ("--loss-guard/--no-loss-guard",), {"help": LOSS_GUARD_HELP}),
    "bank": (None, ("--bank",), {"help": BANK_HELP}),
    "long_check_budget": (
        None,
        ("--long-check-budget",),
        {
            "help": "Seconds the long check past the trial's horizon may take, e.g. 90s or 5m (recorded in the "
            "contract; default 90s)."
        },
    ),
    # doctor's
    "repeats": (3, ("--repeats",), {"min": 2, "help": "Baseline trials the doctor runs (>= 2)."}),
    "honest_change": (
        True,
        ("--honest-change/--no-honest-change",),
        {
            "help": "Also run the baseline with another micro-batch split and with another ZeRO stage, and let their "
            "loss differences widen the loss tolerance (recorded in doctor.json)."
        },
    ),
    # run's
    "seed": (0, ("--seed",), {"min": 0, "help": "Seed of the optimizer."}),
    "concurrency": (None, ("--concurrency",), {"min": 1, "help": CONCURRENCY_HELP}),
    # verify's
    "top_k": (
        3,
        ("--top-k",),
        {
            "min": 1,
            "help": "Candidates verify re-runs, by the posterior "
            "(the measured-fastest joins them when it is not among them).",
        },
    ),
    "pairs": (
        3,
        ("--pairs",),
        {
            "min": 2,
            "help": "Interleaved baseline/candidate pairs per verify round (>= 2; "
            "pairs x rounds >= 6 for a 95% interval).",
        },
    ),
    "rounds": (2, ("--rounds",), {"min": 1, "help": "Verify rounds a candidate must pass."}),
    # long-check's
    "horizon_factor": (
        10.0,
        ("--horizon-factor",),
        {
            "help": "The long check's horizon in trials' optimizer steps (> 1; the long-check budget caps it)."
        },
    ),
    "skip_checkpoint": (
        False,
        ("--skip-checkpoint",),
        {
            "help": "Do not run the long check's mid-horizon checkpoint round trip (the verdict says so)."
        },
    ),
    # report's
    "pdf": (
        False,
        ("--pdf",),
        {"help": env_help("Also write report.pdf (needs chromium).", "INFRARSI_CHROMIUM")},
    ),
    # every stage that talks to Ray
    "address": (None, ("--address",), {"help": ADDRESS_HELP}),
}
"""Options several commands take, defined once: name -> (default, flags, typer keywords)."""


def shared(name: str) -> Any:
    """A fresh typer option for the shared option ``name`` (``SHARED_OPTIONS``)."""
    default, flags, kw = SHARED_OPTIONS[name]
    return typer.Option(list(default) if isinstance(default, list) else default, *flags, **kw)


def wait_option() -> Any:
    """The ``--wait [TIMEOUT]`` option of the commands that write a study."""
    return typer.Option(None, "--wait", metavar="[TIMEOUT]", help=WAIT_HELP)


def wait_seconds(text: str | None) -> float | None:
    """``--wait``'s value in seconds: None (refuse at once), ``math.inf`` (bare ``--wait``), or a duration."""
    if text is None:
        return None
    if text == WAIT_FOREVER:
        return math.inf
    return parse_duration(text, what="--wait")


def expand_bare_wait(argv: list[str]) -> list[str]:
    """``--wait`` takes an optional TIMEOUT: a ``--wait`` not followed by a duration becomes
    ``--wait=forever`` (typer options cannot have an optional value)."""
    out = list(argv)
    for i, a in enumerate(out):
        if a == "--":
            break
        if a == "--wait":
            nxt = out[i + 1] if i + 1 < len(out) else None
            if nxt is None or not _is_duration(nxt):
                out[i] = f"--wait={WAIT_FOREVER}"
    return out


def _is_duration(text: str) -> bool:
    from infrarsi.errors import ConfigError

    if text == WAIT_FOREVER:
        return True
    try:
        parse_duration(text)
    except ConfigError:
        return False
    return True


def size_arg(text: str | None, what: str) -> int | None:
    """Option ``what``'s size in bytes (None when not given); its unit is required."""
    return parse_size(text, what=what, unit_required=True) if text else None


def duration_arg(text: str | None, what: str) -> float | None:
    """Option ``what``'s duration in seconds (None when not given)."""
    return parse_duration(text, what=what) if text else None


def job_files(
    workload: Path | None, script: str | None, space: Path | None, seq_len: int | None
) -> tuple[Path, Path | None]:
    """The workload YAML and search space of ``init`` and ``tune``: ``WORKLOAD`` as given, or the
    YAML written from ``--script`` (whose space it names)."""
    if script is None and workload is not None:
        return workload, space
    from infrarsi.stages.init_script import init_workload_argument

    path = init_workload_argument(
        workload,
        script,
        space=space,
        seq_len=seq_len,
        say=lambda t: console.print(t, highlight=False),
    )
    return path, (None if script is not None else space)
