"""The stage commands of the ``infrarsi`` CLI: init, doctor, run, verify, long-check, report, apply, tune.

They register on ``infrarsi.cli.app`` with its ``command`` decorator, so they share its error
handling and exit codes (0 ok, 2 bad input, 1 any other failure). An option that several commands
take is defined once (``infrarsi.cli.options``): ``tune`` takes every option of the stages it
runs. Each command prints a table (``infrarsi.cli.summaries``), or one JSON object with ``--json``;
the stages that run trials draw a progress bar on stderr (``infrarsi.cli.progress``).
"""

from __future__ import annotations

from pathlib import Path

import typer

from infrarsi.cli.app import command, console, err_console, json_option, print_json
from infrarsi.cli.options import (
    STUDY_HELP,
    duration_arg,
    job_files,
    shared,
    size_arg,
    wait_option,
    wait_seconds,
)
from infrarsi.cli.progress import StageBars
from infrarsi.cli.summaries import (
    print_doctor,
    print_long_check,
    print_run,
    print_verify,
    speedup_line,
    table,
    tune_summary,
)
from infrarsi.study.paths import StudyPaths


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
    allow: list[str] = shared("allow"),
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

    workload, space = job_files(workload, script, space, seq_len)
    c = init_stage(
        workload,
        study,
        request=request,
        space=space,
        memory_capacity_bytes=size_arg(memory_capacity, "--memory-capacity"),
        editable_globs=list(editable) or None,
        editable_knobs=list(knob) or None,
        allow=list(allow),
        trials=trials,
        wall_time_s=duration_arg(time_budget, "--time-budget"),
        device_hours=device_hours,
        loss_tolerance=loss_tolerance,
        analytic_prior=analytic_prior,
        loss_guard=loss_guard,
        bank=bank,
        long_check_budget_s=duration_arg(long_check_budget, "--long-check-budget"),
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
    print_doctor(d)


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
        time_budget_s=duration_arg(time_budget, "--time-budget"),
        address=address,
        seed=seed,
        concurrency=concurrency,
        wait_s=wait_seconds(wait),
    )
    if as_json:
        print_json(s)
        return
    print_run(s)


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
    print_verify(v)
    console.print(speedup_line(v.get("best")), highlight=False)


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
            budget_s=duration_arg(budget, "--budget"),
            address=address,
            checkpoint=not skip_checkpoint,
            wait_s=wait_seconds(wait),
        )
    if as_json:
        print_json(res.to_json())
        return
    print_long_check(res)


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
    allow: list[str] = shared("allow"),
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

    workload, space = job_files(workload, script, space, seq_len)
    with StageBars(err_console):
        out = tune_stage(
            workload,
            study,
            trials=trials,
            time_budget_s=duration_arg(time_budget, "--time-budget"),
            memory_capacity_bytes=size_arg(memory_capacity, "--memory-capacity"),
            address=address,
            request=request,
            space=space,
            editable_globs=list(editable) or None,
            editable_knobs=list(knob) or None,
            allow=list(allow),
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
            long_check_budget_s=duration_arg(long_check_budget, "--long-check-budget"),
            horizon_factor=horizon_factor,
            checkpoint=not skip_checkpoint,
            pdf=pdf,
        )
    if as_json:
        print_json(out)
        return
    from infrarsi.structlog_config import STUDY_LOG, is_verbose

    if is_verbose():
        print_verify(out["verify"])
    console.print(table("infrarsi tune: summary", tune_summary(out, study / STUDY_LOG)))
