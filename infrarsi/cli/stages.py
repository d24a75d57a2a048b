"""The stage commands of the ``infrarsi`` CLI: init, doctor, run, verify, long-check, report, apply, tune.

They register on ``infrarsi.cli.app`` with its ``command`` decorator, so they share its error
handling and exit codes (0 ok, 2 bad input, 1 any other failure). An option that several commands
take is defined once, in ``SHARED_OPTIONS`` (``shared``): ``tune`` takes every option of the stages
it runs. Each command prints a table, or one JSON object with ``--json``; the stages that run
trials draw a progress bar on stderr (``infrarsi.cli.progress``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from infrarsi.cli.app import command, console, env_help, err_console, json_option, print_json
from infrarsi.cli.progress import StageBars
from infrarsi.study.paths import StudyPaths
from infrarsi.units import format_bytes, parse_duration, parse_size

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
        {"help": "Knob a candidate may change (repeatable; default: every knob of the space)."},
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


"""What a bare ``--wait`` becomes (``expand_bare_wait``)."""


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


def _size(text: str | None, what: str) -> int | None:
    return parse_size(text, what=what, unit_required=True) if text else None


def _duration(text: str | None, what: str) -> float | None:
    return parse_duration(text, what=what) if text else None


def _table(title: str, rows: list[tuple[str, str]]) -> Table:
    t = Table(title=title, header_style="bold")
    t.add_column("measure")
    t.add_column("value")
    for k, v in rows:
        t.add_row(k, v)
    return t


def _job(
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


@command("init")
def init_cmd(
    workload: Path | None = typer.Argument(
        None, help="Workload YAML, e.g. workloads/dense_debug.yaml (or --script)."
    ),
    study: Path = typer.Option(..., "--study", help=STUDY_HELP),
    script: str | None = shared("script"),
    seq_len: int | None = shared("seq_len"),
    request: str = shared("request"),
    space: Path | None = shared("space"),
    memory_capacity: str | None = shared("memory_capacity"),
    editable: list[str] = shared("editable"),
    knob: list[str] = shared("knob"),
    trials: int | None = shared("trials"),
    time_budget: str | None = shared("time_budget"),
    device_hours: float | None = shared("device_hours"),
    loss_tolerance: float | None = shared("loss_tolerance"),
    analytic_prior: bool | None = shared("analytic_prior"),
    loss_guard: bool | None = shared("loss_guard"),
    bank: str | None = shared("bank"),
    long_check_budget: str | None = shared("long_check_budget"),
    as_json: bool = json_option(),
) -> None:
    """Lock the task contract of a new study (DIR/contract.yaml, frozen and hashed)."""
    from infrarsi.stages.init import init_stage

    workload, space = _job(workload, script, space, seq_len)
    c = init_stage(
        workload,
        study,
        request=request,
        space=space,
        memory_capacity_bytes=_size(memory_capacity, "--memory-capacity"),
        editable_globs=list(editable) or None,
        editable_knobs=list(knob) or None,
        trials=trials,
        wall_time_s=_duration(time_budget, "--time-budget"),
        device_hours=device_hours,
        loss_tolerance=loss_tolerance,
        analytic_prior=analytic_prior,
        loss_guard=loss_guard,
        bank=bank,
        long_check_budget_s=_duration(long_check_budget, "--long-check-budget"),
    )
    sw = c.switches_in_force()
    pins: dict[str, str] = {}
    if c.workload.get("script"):
        from infrarsi.execution.script_config import pinned_knobs
        from infrarsi.search import SearchSpace

        pins = pinned_knobs(list(SearchSpace.from_yaml(c.search_space_path).names))
    if as_json:
        print_json(
            {
                "contract": str(StudyPaths(study).contract),
                "contract_hash": c.contract_hash,
                "memory_capacity": c.memory_capacity.describe(),
                "switches": sw.model_dump(),
                "pinned": pins,
            }
        )
        return
    console.print(f"contract written: {StudyPaths(study).contract} (hash {c.contract_hash[:12]})")
    console.print(
        f"memory capacity: {c.memory_capacity.describe()}; analytic prior "
        f"{'on' if sw.analytic_prior else 'off'}, loss guard {'on' if sw.loss_guard else 'off'}, "
        f"bank {sw.bank or 'off'}",
        highlight=False,
    )
    for name, why in pins.items():
        console.print(
            f"pinned at the baseline (cannot reach a script): {name}: {why}", highlight=False
        )


@command("doctor")
def doctor_cmd(
    study: Path = typer.Argument(..., help=STUDY_HELP),
    repeats: int = shared("repeats"),
    address: str | None = shared("address"),
    honest_change: bool = shared("honest_change"),
    wait: str | None = wait_option(),
    as_json: bool = json_option(),
) -> None:
    """Run the untouched baseline several times: noise, stragglers, phases, peak, loss tolerance."""
    from infrarsi.stages.doctor import doctor_stage

    with StageBars(err_console, stage="doctor"):
        d = doctor_stage(
            study,
            repeats=repeats,
            address=address,
            honest_change=honest_change,
            wait_s=wait_seconds(wait),
        )
    if as_json:
        print_json(d.to_json())
        return
    rows: list[tuple[str, str]] = []
    st, tol = d.step_time_s, d.loss_tolerance_in_force
    if st is not None:
        rows.append(("step_time_s (median of trial medians)", f"{st.median:.4f} s"))
        rows.append(
            (
                "run-to-run CV / within-trial CV",
                f"{st.run_to_run_cv:.2%} / {st.within_trial_cv:.2%}",
            )
        )
    rows += [
        (
            "noise margin verify must clear",
            f"{d.noise_margin:.2%}" if d.noise_margin is not None else "-",
        ),
        ("straggler", str(d.stragglers.flag) if d.stragglers else "-"),
        ("phases (s per step)", ", ".join(f"{k}={v:.3f}" for k, v in d.phase_times_s.items())),
        ("peak memory per device", format_bytes(d.peak_memory_bytes)),
        ("device memory (as reported)", format_bytes(d.device_memory_capacity_bytes)),
        (
            "peak FLOP/s per device (measured)",
            f"{d.peak_flops_per_s:.3g}" if d.peak_flops_per_s else "-",
        ),
        ("baseline MFU", f"{d.mfu:.2%}" if d.mfu is not None else "-"),
    ]
    for c in d.honest_changes:
        rows.append(
            (
                f"honest change ({c.changed} {c.config.get(c.changed)})",
                f"max loss diff {c.loss_max_abs_diff:.3g}"
                if c.loss_max_abs_diff is not None
                else f"ended {c.status}, not used",
            )
        )
    rows.append(
        ("loss tolerance (abs, per step)", f"{tol.atol:.3g} ({tol.source})" if tol else "-")
    )
    console.print(_table("doctor: baseline", rows))


@command("run")
def run_cmd(
    study: Path = typer.Argument(..., help=STUDY_HELP),
    trials: int | None = typer.Option(
        None, "--trials", min=1, help="Trial budget (default: the contract's)."
    ),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Continue a study whose harness was killed; rebuilds the optimizer from the log.",
    ),
    time_budget: str | None = typer.Option(
        None, "--time-budget", help="Wall-time budget, e.g. 10m (default: the contract's)."
    ),
    address: str | None = shared("address"),
    seed: int = shared("seed"),
    concurrency: int | None = shared("concurrency"),
    wait: str | None = wait_option(),
    as_json: bool = json_option(),
) -> None:
    """Search: Ray Tune trials proposed by the censored-memory BoTorch optimizer."""
    from infrarsi.stages.run import run_stage

    s = run_stage(
        study,
        trials=trials,
        resume=resume,
        time_budget_s=_duration(time_budget, "--time-budget"),
        address=address,
        seed=seed,
        concurrency=concurrency,
        wait_s=wait_seconds(wait),
    )
    if as_json:
        print_json(s)
        return
    best, base, raw = s.get("best_step_time_s"), s.get("baseline_step_time_s"), s.get("raw_speedup")
    console.print(
        _table(
            "run",
            [
                (
                    "trials",
                    f"{s['trials']} ({', '.join(f'{k} {v}' for k, v in s['statuses'].items()) or '-'})",
                ),
                ("baseline step_time_s", f"{base:.4f} s" if base else "-"),
                (
                    "fastest clean trial",
                    f"{best:.4f} s ({raw:.2f}x, unverified)" if best and raw else "-",
                ),
                ("its config", json.dumps(s.get("best_config")) if s.get("best_config") else "-"),
                *_choice_rows(s.get("choice")),
                ("concurrency", str(s.get("concurrency"))),
            ],
        )
    )


def _choice_rows(choice: dict[str, Any] | None) -> list[tuple[str, str]]:
    """``run``'s table rows for the knob config to verify (``BestChoice.to_dict()``) and why."""
    if not choice:
        return [("to verify", "-")]
    return [
        ("to verify", json.dumps(choice["config"])),
        ("why", f"{choice['reason']}: {choice['why']}"),
    ]


@command("verify")
def verify_cmd(
    study: Path = typer.Argument(..., help=STUDY_HELP),
    top_k: int = shared("top_k"),
    pairs: int = shared("pairs"),
    rounds: int = shared("rounds"),
    address: str | None = shared("address"),
    wait: str | None = wait_option(),
    as_json: bool = json_option(),
) -> None:
    """Re-run the top candidates against the baseline, interleaved; keep wins that clear the noise."""
    from infrarsi.stages.verify import verify_stage

    with StageBars(err_console, stage="verify"):
        v = verify_stage(
            study,
            top_k=top_k,
            pairs=pairs,
            rounds=rounds,
            address=address,
            wait_s=wait_seconds(wait),
        )
    if as_json:
        print_json(v)
        return
    _print_verify(v)
    console.print(_speedup_line(v.get("best")), highlight=False)


def _print_verify(v: dict) -> None:
    t = Table(title="verify", header_style="bold")
    for col in (
        "#",
        "accepted",
        "speedup",
        "interval (coverage)",
        "changes vs baseline",
        "why not",
    ):
        t.add_column(col)
    for i, c in enumerate(v.get("candidates", [])):
        sp = f"{c['speedup']:.2f}x" if c.get("speedup") is not None else "-"
        t.add_row(
            str(i),
            "yes" if c["accepted"] else "no",
            sp,
            _interval(c),
            _changes(c),
            (c.get("reason") or "")[:120],
        )
    console.print(t)


def _interval(c: dict) -> str:
    """A candidate's interval and its real coverage, e.g. ``[1.10, 1.31] (94.5%)``."""
    if c.get("ci_low") is None or c.get("ci_coverage") is None:
        return "-"
    return f"[{c['ci_low']:.2f}, {c['ci_high']:.2f}] ({c['ci_coverage']:.1%})"


def _changes(c: dict) -> str:
    """What a candidate changes from the baseline: its knobs, then its patches."""
    diff = [f"{k}={b}" for k, (_a, b) in c.get("diff_vs_baseline", {}).items()]
    diff += [f"patch {Path(p['path']).name} ({p['sha256'][:12]})" for p in c.get("patches") or []]
    return ", ".join(diff) or "-"


def _speedup_line(best: dict | None) -> str:
    if not best:
        return (
            "no candidate was accepted: no win cleared the measured noise with every invariant kept"
        )
    cov = best.get("ci_coverage")
    return (
        f"verified speedup: {best['speedup']:.2f}x (lower bound {best['ci_low']:.2f}x of the "
        f"{best.get('ci_method') or 'interval'}"
        + (f"; it covers the median {cov:.1%} of the time" if cov is not None else "")
        + ")"
    )


@command("long-check")
def long_check_cmd(
    study: Path = typer.Argument(..., help=STUDY_HELP),
    horizon_factor: float = shared("horizon_factor"),
    budget: str | None = typer.Option(
        None,
        "--budget",
        help="Seconds the check may take, e.g. 90s (default: the contract's budgets.long_check_s).",
    ),
    skip_checkpoint: bool = shared("skip_checkpoint"),
    address: str | None = shared("address"),
    wait: str | None = wait_option(),
    as_json: bool = json_option(),
) -> None:
    """Train verify's accepted candidate and the baseline side by side past the trial's horizon,
    and round-trip a DeepSpeed checkpoint at mid-horizon (DIR/long_check.json)."""
    from infrarsi.stages.long_check import accepted_candidate, long_check_stage

    with StageBars(err_console, stage="long-check"):
        res = long_check_stage(
            study,
            candidate=accepted_candidate(study),
            horizon_factor=horizon_factor,
            budget_s=_duration(budget, "--budget"),
            address=address,
            checkpoint=not skip_checkpoint,
            wait_s=wait_seconds(wait),
        )
    if as_json:
        print_json(res.to_json())
        return
    rows = [
        (
            "horizon (optimizer steps)",
            f"{res.horizon_steps} (trial {res.trial_steps}; factor {res.horizon_factor:g}"
            + (", capped by the budget)" if res.capped_by_budget else ")"),
        ),
        (
            "budget / estimated / wall",
            f"{res.budget_s:.0f} s / {res.estimated_cost_s:.0f} s / {res.wall_s:.0f} s",
        ),
        (
            "loss tolerance (abs, per step)",
            f"{res.loss_atol:.3g} (contract {res.contract_loss_atol:.3g})",
        ),
    ]
    if res.calibration is not None:
        d = res.calibration.loss_max_abs_diff
        rows.append(
            (
                f"calibration ({res.calibration.changed} {res.calibration.config.get(res.calibration.changed)})",
                f"max loss diff {d:.3g}"
                if d is not None
                else f"ended {res.calibration.status}, not used",
            )
        )
    rows.append(
        (
            "max |candidate - baseline|",
            "-"
            if res.max_abs_diff is None
            else f"{res.max_abs_diff:.3g} at step {res.max_abs_diff_step}",
        )
    )
    rows.append(
        (
            "first step out of tolerance",
            "none" if res.first_step_out is None else str(res.first_step_out),
        )
    )
    ck = res.checkpoint
    rows.append(
        (
            "checkpoint round trip",
            f"{ck.status} (step {ck.step}, max diff "
            f"{'-' if ck.max_abs_diff is None else f'{ck.max_abs_diff:.3g}'}, tolerance {ck.atol:.3g})",
        )
    )
    console.print(_table(f"long check: {res.status}", rows))
    if res.reason:
        console.print(f"reason: {res.reason}", highlight=False)
    for note in res.notes:
        console.print(f"note: {note}", highlight=False)


@command("report")
def report_cmd(
    study: Path = typer.Argument(..., help=STUDY_HELP),
    pdf: bool = shared("pdf"),
    wait: str | None = wait_option(),
    as_json: bool = json_option(),
) -> None:
    """Write report.md and a self-contained report.html (plots embedded, audit trail)."""
    from infrarsi.stages.report import write_report

    out = write_report(study, pdf=pdf, wait_s=wait_seconds(wait))
    if as_json:
        print_json(out)
        return
    console.print(f"report: {out}")


@command("apply")
def apply_cmd(
    study: Path = typer.Argument(..., help=STUDY_HELP),
    repo: Path = typer.Option(
        ..., "--repo", help="Git repository to promote the winner into (a new branch, never main)."
    ),
    branch: str | None = typer.Option(
        None, "--branch", help="Branch name (default infrarsi/<study>-<hash>)."
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Overwrite an existing branch of that name and allow a dirty tree (never main/master).",
    ),
    wait: str | None = wait_option(),
    skip_long_check: bool = typer.Option(
        False,
        "--skip-long-check",
        help="Promote without a passed long check of the candidate (the commit message and DIR/apply.json say so).",
    ),
    as_json: bool = json_option(),
) -> None:
    """Promote exactly the verified candidate (its knobs, and the patches verify ran, checked by sha256)
    to a new git branch, after a passed long check."""
    from infrarsi.stages.apply import apply

    out = apply(
        study,
        repo,
        branch=branch,
        force=force,
        wait_s=wait_seconds(wait),
        skip_long_check=skip_long_check,
    )
    if as_json:
        print_json(out)
        return
    console.print(out.summary())


@command("tune")
def tune_cmd(
    workload: Path | None = typer.Argument(
        None, help="Workload YAML, e.g. workloads/dense_debug.yaml (or --script)."
    ),
    study: Path = typer.Option(..., "--study", help=STUDY_HELP),
    script: str | None = shared("script"),
    seq_len: int | None = shared("seq_len"),
    trials: int | None = shared("trials"),
    time_budget: str | None = shared("time_budget"),
    memory_capacity: str | None = shared("memory_capacity"),
    address: str | None = shared("address"),
    request: str = shared("request"),
    space: Path | None = shared("space"),
    editable: list[str] = shared("editable"),
    knob: list[str] = shared("knob"),
    device_hours: float | None = shared("device_hours"),
    loss_tolerance: float | None = shared("loss_tolerance"),
    repeats: int = shared("repeats"),
    honest_change: bool = shared("honest_change"),
    top_k: int = shared("top_k"),
    pairs: int = shared("pairs"),
    rounds: int = shared("rounds"),
    seed: int = shared("seed"),
    analytic_prior: bool | None = shared("analytic_prior"),
    loss_guard: bool | None = shared("loss_guard"),
    bank: str | None = shared("bank"),
    concurrency: int | None = shared("concurrency"),
    wait: str | None = wait_option(),
    long_check: bool = typer.Option(
        True,
        "--long-check/--no-long-check",
        help="After verify accepts a candidate, train it beside the baseline past the trial's horizon and "
        "round-trip a checkpoint (apply requires it).",
    ),
    long_check_budget: str | None = shared("long_check_budget"),
    horizon_factor: float = shared("horizon_factor"),
    skip_checkpoint: bool = shared("skip_checkpoint"),
    pdf: bool = shared("pdf"),
    as_json: bool = json_option(),
) -> None:
    """Every stage: init, doctor, run, verify, long check, report (resumes a study directory where
    it stopped; the init options apply only to a new study)."""
    from infrarsi.stages.tune import tune_stage

    workload, space = _job(workload, script, space, seq_len)
    with StageBars(err_console):
        out = tune_stage(
            workload,
            study,
            trials=trials,
            time_budget_s=_duration(time_budget, "--time-budget"),
            memory_capacity_bytes=_size(memory_capacity, "--memory-capacity"),
            address=address,
            request=request,
            space=space,
            editable_globs=list(editable) or None,
            editable_knobs=list(knob) or None,
            device_hours=device_hours,
            loss_tolerance=loss_tolerance,
            doctor_repeats=repeats,
            honest_change=honest_change,
            top_k=top_k,
            pairs=pairs,
            rounds=rounds,
            seed=seed,
            analytic_prior=analytic_prior,
            loss_guard=loss_guard,
            bank=bank,
            concurrency=concurrency,
            wait_s=wait_seconds(wait),
            long_check=long_check,
            long_check_budget_s=_duration(long_check_budget, "--long-check-budget"),
            horizon_factor=horizon_factor,
            checkpoint=not skip_checkpoint,
            pdf=pdf,
        )
    if as_json:
        print_json(out)
        return
    from infrarsi.structlog_config import STUDY_LOG, is_verbose

    if is_verbose():
        _print_verify(out["verify"])
    console.print(_table("infrarsi tune: summary", tune_summary(out, study / STUDY_LOG)))


def tune_summary(out: dict[str, Any], log_file: Path) -> list[tuple[str, str]]:
    """The rows of ``tune``'s closing table: the baseline, the verified best, its speed-up with
    the interval and its real coverage, the long check's verdict, and where the report and the
    full log are."""
    base = (out.get("run") or {}).get("baseline_step_time_s")
    best = (out.get("verify") or {}).get("best")
    rows = [("baseline", f"{base:.4f} s/step" if base else "-")]
    if best and best.get("accepted"):
        step = f"{base / best['speedup']:.4f} s/step, " if base and best.get("speedup") else ""
        cand = next(
            (
                c
                for c in out["verify"].get("candidates", [])
                if (c.get("config"), c.get("patches")) == (best.get("config"), best.get("patches"))
            ),
            best,
        )
        rows.append(("verified best", f"{step}{_changes(cand)}"))
        cov = best.get("ci_coverage")
        rows.append(
            (
                "speed-up",
                f"{best['speedup']:.2f}x, interval [{best['ci_low']:.2f}, {best['ci_high']:.2f}]"
                + (f" (coverage {cov:.1%})" if cov is not None else ""),
            )
        )
    else:
        rows.append(
            (
                "verified best",
                "none: no candidate cleared the measured noise with every invariant kept",
            )
        )
    lc = out.get("long_check")
    rows.append(
        (
            "long check",
            f"{lc['status']} over {lc['horizon_steps']} steps (a trial: {lc['trial_steps']})"
            + (f": {lc['reason']}" if lc.get("reason") else "")
            if lc
            else "not run (nothing accepted, or --no-long-check)",
        )
    )
    rows.append(("report", str(out["report_html"])))
    rows.append(("full log", str(log_file)))
    return rows
