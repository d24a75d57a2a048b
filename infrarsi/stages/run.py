"""Stage 3, ``run``: Ray Tune schedules trials proposed by the infrarsi searcher.

Each Tune trial reserves its real resources: a ``PlacementGroupFactory`` with one bundle per rank
on one node (``STRICT_PACK``), or one per node across ``nodes`` nodes (``STRICT_SPREAD``), so Tune
runs as many trials at once as the cluster holds (``--concurrency N`` caps it; the default is
what the cluster holds, counted by ``infrarsi.execution.cluster.trial_slots``, and a cluster that
cannot hold one trial is a ``ClusterError`` before any trial). The trainable is thin: it hands its
config and its placement group to the study executor, a threaded actor pinned to the driver's
node, which runs the ranks in that placement group (a warm group per placement group: Tune reuses
the trial actor and its reservation for the next trial), checks the invariants and logs the row;
the trainable reports the row back to Tune, whose ``InfrarsiSearcher`` tells the optimizer. Each
``suggest`` asks the optimizer with the trials still in flight as pending, so concurrent asks
are a batch (qLogNEI with pending points), not copies.

Timed trials never share devices or reserved cores: two trials at once on the same 2 cores
distort step time by 1.63x (measured here), so the reservations, not a limiter, keep them apart.
``--resume`` rebuilds the optimizer from the log, logs trials that were in flight at the crash as
interrupted, and runs only the remaining budget. The ``surrogate`` backend reserves nothing (its
trials are simulated) and runs one trial at a time unless ``--concurrency`` says otherwise.
"""

from __future__ import annotations

import math
import os
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import structlog

from infrarsi.errors import StudyError
from infrarsi.orchestration.executor import StudyExecutor
from infrarsi.result import TrialExtra
from infrarsi.study.candidate import Candidate
from infrarsi.study.doctor_report import DoctorReport
from infrarsi.study.paths import StudyPaths

if TYPE_CHECKING:
    from infrarsi.study.contract import Contract

log = structlog.get_logger(__name__)

INFO_KEY = "__infrarsi_ask_info__"
"""Reserved config key carrying the optimizer's ``AskInfo`` (as ``to_dict()``) for a suggested
config to the trainable, which logs it in the row's ``extra.ask_info``."""

PROPOSAL_KEY = "__infrarsi_proposal__"
"""Reserved config key carrying a queued ``Proposal`` (as ``to_dict()``) that the searcher serves
instead of an asked config; the trainable logs it in the row's ``extra.proposal``."""

TRIAL_RETRIES = 3
"""Times Ray Tune restarts a trial whose trial actor died (killed, or its node lost): the
executor returns the first attempt's row to a retry (``attempt_key``), so nothing runs twice.
Any other error out of a trainable is the harness's and stops the run (``RunProgress``)."""

TOPUP_ROUNDS = 2
"""Further Ray Tune runs within one ``run`` for the budget left by trials whose actors died beyond
Tune's retries (Tune ends such a trial in error, and one whose actor dies as a reused actor is
handed to it may not be retried at all): each runs the trials still missing, while the wall-time
and device budgets last. What is still missing after them is ``run --resume``'s."""

_REPORTED = (
    "status",
    "step_time_s",
    "peak_memory_bytes",
    "memory_censored",
    "tokens_per_s",
    "mfu",
    "device_seconds",
    "trial_id",
    "error",
)


def _make_trainable(executor_name: str, namespace: str, *, reserved: bool, concurrency: int):
    def infrarsi_trial(config: dict[str, Any]) -> None:
        import ray
        from ray import tune
        from ray.util import get_current_placement_group

        from infrarsi.search.ask_info import AskInfo

        cfg = dict(config)
        raw = cfg.pop(INFO_KEY, None)
        proposal = cfg.pop(PROPOSAL_KEY, None)
        executor = ray.get_actor(executor_name, namespace=namespace)
        ctx = tune.get_context()
        extra = TrialExtra(
            tune_trial_id=ctx.get_trial_id(),
            concurrency=concurrency,
            ask_info=AskInfo.from_dict(raw).to_dict() if raw else None,
            proposal=dict(proposal) if proposal else None,
        )
        pg = get_current_placement_group() if reserved else None
        row = cast(
            dict[str, Any],
            ray.get(
                executor.run_trial.remote(
                    cfg,
                    "run",
                    extra=extra,
                    placement_group=pg,
                    patch_file=(proposal or {}).get("patch"),
                    attempt_key=ctx.get_trial_id(),
                )
            ),
        )
        metrics = {k: row.get(k) for k in _REPORTED}
        st = row.get("step_time_s")
        metrics["step_time_s"] = float(st) if st is not None else float("nan")
        tune.report(metrics)

    return infrarsi_trial


def run_stage(
    study_dir: str | Path,
    *,
    trials: int | None = None,
    resume: bool = False,
    time_budget_s: float | None = None,
    address: str | None = None,
    seed: int = 0,
    progress: bool = True,
    concurrency: int | None = None,
    wait_s: float | None = None,
) -> dict[str, Any]:
    """``_run_stage`` holding the study lock, taken by this driver process (the executor actor
    never takes it); ``wait_s``: how long to wait for another writer (None: refuse at once with
    ``StudyLockedError``)."""
    from infrarsi.study.lock import hold_study

    with hold_study(study_dir, "run", wait_s=wait_s):
        return _run_stage(
            study_dir,
            trials=trials,
            resume=resume,
            time_budget_s=time_budget_s,
            address=address,
            seed=seed,
            progress=progress,
            concurrency=concurrency,
        )


def _run_stage(
    study_dir: str | Path,
    *,
    trials: int | None,
    resume: bool,
    time_budget_s: float | None,
    address: str | None,
    seed: int,
    progress: bool,
    concurrency: int | None,
) -> dict[str, Any]:
    """Run the search. Returns a summary: trials run, the fastest clean trial (config, patches,
    step time and raw speedup), the knob config to verify with its reason (``choice``,
    ``best_choice_summary``), and the concurrency used (``concurrency``: at most that many trials at once; None: as many
    as the cluster holds)."""
    import ray
    from ray import tune
    from ray.tune.search import ConcurrencyLimiter
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from infrarsi.errors import ConfigError
    from infrarsi.execution.cluster import alive_nodes, require_slots, trial_resources
    from infrarsi.execution.group import GroupSpec
    from infrarsi.execution.runner import init_ray as ensure_ray
    from infrarsi.orchestration.common import device_budget_s, raise_harness_errors
    from infrarsi.orchestration.optimizer_factory import build_optimizer, make_searcher
    from infrarsi.orchestration.progress import RunProgress, is_lost_actor
    from infrarsi.study.contract import Contract
    from infrarsi.study.proposals import ProposalQueue
    from infrarsi.study.trial_log import read_trials
    from infrarsi.study.trial_log import rows as rows_from_table

    paths = StudyPaths(Path(study_dir).resolve())
    contract = Contract.load(paths.root)
    doctor = DoctorReport.load(
        paths.root
    )  # run needs the doctor's calibration (StudyError: run doctor)
    _check_capacity(contract, doctor)
    history = rows_from_table(read_trials(paths.root))
    done_run = [r for r in history if r.stage == "run" and not r.extra.interrupted]
    if done_run and not resume:
        raise StudyError(
            f"{paths.root}: the study already has {len(done_run)} run trial(s). Pass --resume to "
            f"continue it, or start a new study directory."
        )
    budget = int(trials if trials is not None else (contract.budgets.trials or 24))
    remaining = max(0, budget - len(done_run))
    if concurrency is not None and concurrency < 1:
        raise ConfigError(
            f"--concurrency: rule: at least 1 trial at a time, got {concurrency}. "
            f"Fix: --concurrency 1 or more, or leave it out to use what the cluster holds."
        )
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    # Ray Tune prints nothing: RunProgress draws the bar and the study's log holds the detail. The
    # new output engine prints its configuration box, the results path and a TensorBoard hint
    # even at verbose=0; the legacy one (RAY_AIR_NEW_OUTPUT=0, Ray's documented switch) prints
    # nothing at verbose=0.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    ensure_ray(address)
    workload = contract.workload_model()
    spec = GroupSpec.from_resources(workload.resources)
    reserved = workload.backend != "surrogate"  # simulated trials hold no devices
    if reserved:
        slots = require_slots(
            spec, alive_nodes(), source=workload.path or "the contract's workload"
        )
        limit = concurrency or slots
        if limit > slots:
            log.warning(
                "run.concurrency_above_cluster",
                concurrency=limit,
                cluster_holds=slots,
                note="the extra trials wait for resources (an autoscaler may add nodes)",
            )
    else:
        limit = concurrency or 1
    namespace = "infrarsi"
    name = f"infrarsi-exec-{uuid.uuid4().hex[:8]}"
    Executor = ray.remote(num_cpus=0)(_LoggedExecutor)
    here = ray.get_runtime_context().get_node_id()  # the log is written on the driver's node
    executor = Executor.options(
        name=name,
        namespace=namespace,
        lifetime=None,
        max_concurrency=limit + 4,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False)
        if here
        else "DEFAULT",
    ).remote(str(paths.root), address=address, pin=False)  # each trial runs in its Tune reservation
    try:
        recovered = ray.get(executor.recover_inflight.remote())  # type: ignore[attr-defined]
        if recovered:
            log.warning("run.recovered_inflight", trials=[r["trial_id"] for r in recovered])
        history = rows_from_table(read_trials(paths.root))
        optimizer = build_optimizer(contract, history, seed=seed, study_dir=paths.root)
        if remaining == 0:
            log.info("run.budget_done", trials=len(done_run))
        else:
            baseline_s = _baseline_step(paths)
            prog = RunProgress(
                total=budget,
                done=len(done_run),
                baseline_step_time_s=baseline_s,
                enabled=progress,
                history=done_run,
            )
            wall = time_budget_s if time_budget_s is not None else contract.budgets.wall_time_s
            stopper = prog.stopper(device_budget_s(contract))
            t_start = time.monotonic()
            with prog:
                for round_ in range(1 + TOPUP_ROUNDS):
                    searcher = make_searcher(
                        optimizer,
                        info_key=INFO_KEY,
                        proposals=ProposalQueue(paths.root),
                        proposal_key=PROPOSAL_KEY,
                        study_dir=paths.root,
                    )
                    limiter = ConcurrencyLimiter(searcher, max_concurrent=limit)
                    log.info(
                        "run.start",
                        trials=remaining,
                        concurrency=limit,
                        reserved=reserved,
                        round=round_,
                    )
                    prog.set_done(budget - remaining)
                    wall_left = (
                        None if wall is None else max(1.0, wall - (time.monotonic() - t_start))
                    )
                    tuner = tune.Tuner(
                        tune.with_resources(
                            _make_trainable(name, namespace, reserved=reserved, concurrency=limit),
                            trial_resources(spec) if reserved else {"cpu": 0, "memory": 1},
                        ),
                        tune_config=tune.TuneConfig(
                            # the limiter alone caps trials in flight (max_concurrent_trials too
                            # would wrap it again: Tune warns and ignores it)
                            search_alg=limiter,
                            num_samples=remaining,
                            metric="step_time_s",
                            mode="min",
                            time_budget_s=wall_left,
                            reuse_actors=True,
                        ),
                        run_config=tune.RunConfig(
                            name=f"run-{int(time.time())}-{round_}",
                            storage_path=str(paths.root / "tune"),
                            verbose=0,
                            callbacks=[prog],
                            stop=stopper,
                            log_to_file=True,
                            failure_config=tune.FailureConfig(max_failures=TRIAL_RETRIES),
                        ),
                    )
                    grid = tuner.fit()
                    # a full disk or an unwritable log is an error, not a success (the first one
                    # stopped the run). A trial whose actor kept dying (killed, or its node lost,
                    # beyond Tune's retries) is not the harness's: its row is logged if the
                    # executor ran it, and the budget it left is run by another Tune run here.
                    raise_harness_errors(prog if prog.harness_errors else _HarnessOnly(grid))
                    optimizer = searcher.optimizer
                    lost = [e for e in (getattr(grid, "errors", None) or []) if is_lost_actor(e)]
                    remaining = budget - _counted_run_rows(paths)
                    wall_spent = wall is not None and time.monotonic() - t_start >= wall
                    if not topup_needed(
                        lost_actors=len(lost),
                        remaining=remaining,
                        round_=round_,
                        wall_spent=wall_spent,
                        device_spent=stopper.stop_all(),
                    ):
                        break
                    log.warning(
                        "run.topup",
                        trials=remaining,
                        lost_actors=len(lost),
                        round=round_ + 1,
                        note="trial actors died beyond Tune's retries; running the budget they left",
                    )
            if lost and remaining > 0:
                log.warning(
                    "run.trial_actors_lost",
                    trials=len(lost),
                    left=remaining,
                    note="their Tune actors died after retries; `infrarsi run DIR --resume` runs the budget left",
                )
        optimizer.save(str(paths.optimizer_state))
        choice = best_choice_summary(optimizer)
    finally:
        try:
            ray.get(executor.close.remote(), timeout=120)  # type: ignore[attr-defined]
        except Exception as e:  # pragma: no cover - best effort cleanup
            log.warning("run.close_failed", error=str(e))
        ray.kill(executor)  # type: ignore[arg-type]
    final = [r for r in rows_from_table(read_trials(paths.root)) if r.stage == "run"]
    best = fastest_clean_row(final)
    base = _baseline_step(paths)
    from infrarsi.bank.feed import add_to_bank

    add_to_bank(paths.root, stage="run")  # the experience bank (never fails the stage)
    return {
        "trials": len([r for r in final if not r.extra.interrupted]),
        "statuses": {
            s: sum(1 for r in final if r.status == s) for s in sorted({r.status for r in final})
        },
        "best_config": best.config if best else None,
        "best_patches": [p.to_dict() for p in Candidate.from_row(best).patches] if best else [],
        "best_step_time_s": best.step_time_s if best else None,
        "baseline_step_time_s": base,
        "raw_speedup": (base / best.step_time_s) if (best and base and best.step_time_s) else None,
        "choice": choice,
        "concurrency": limit,
    }


def best_choice_summary(optimizer: Any) -> dict[str, Any] | None:
    """``optimizer.best_choice()`` as ``run``'s summary names it (``BestChoice.to_dict()``: the
    knob config to verify, its posterior mean, measured median and count, the other pick when
    the posterior and the measurements disagree, the reason and a sentence); None before any ok
    trial, or when the models cannot say (logged: the summary never fails the stage)."""
    try:
        choice = optimizer.best_choice()
    except Exception as e:  # the trials are logged; a failed fit must not lose the run
        log.warning("run.best_choice_failed", error=str(e))
        return None
    return None if choice is None else choice.to_dict()


class _LoggedExecutor(StudyExecutor):
    """The study executor as ``run``'s actor: its events (each trial's start and end) go to the
    study's ``DIR/logs/infrarsi.jsonl`` like the driver's, instead of only the actor's stderr
    (which Ray keeps in its session logs: ``log_to_driver=False``)."""

    def __init__(self, study_dir: str | Path, **kwargs: Any) -> None:
        from infrarsi.structlog_config import attach_study_log, configure_logging

        configure_logging(verbose=False)  # the actor's stderr is Ray's worker log, not a terminal
        attach_study_log(study_dir)
        super().__init__(study_dir, **kwargs)


def fastest_clean_row(rows: list[Any]) -> Any:
    """The fastest ``ok`` run row of a candidate (config + patches) none of whose run trials
    broke an invariant (None when there is none): what ``run``'s summary names as the best."""
    broke = {Candidate.from_row(r).key for r in rows if r.status == "invariant_violation"}
    ok = [
        r
        for r in rows
        if r.status == "ok" and r.step_time_s and Candidate.from_row(r).key not in broke
    ]
    return min(ok, key=lambda r: r.step_time_s or math.inf) if ok else None


def topup_needed(
    *, lost_actors: int, remaining: int, round_: int, wall_spent: bool, device_spent: bool
) -> bool:
    """Whether ``run`` starts another Tune run after round ``round_`` (0 = the first): only when trial
    actors were lost, run trials are still missing from the budget, rounds are left
    (``TOPUP_ROUNDS``) and neither the wall-time nor the device budget is spent."""
    return (
        lost_actors > 0
        and remaining > 0
        and round_ < TOPUP_ROUNDS
        and not wall_spent
        and not device_spent
    )


def _counted_run_rows(paths: StudyPaths) -> int:
    """Run rows that count against the budget (every run row but those logged as interrupted)."""
    from infrarsi.study.trial_log import read_trials
    from infrarsi.study.trial_log import rows as rows_from_table

    return sum(
        1
        for r in rows_from_table(read_trials(paths.root))
        if r.stage == "run" and not r.extra.interrupted
    )


class _HarnessOnly:
    """A Tune ``ResultGrid`` whose ``errors`` leave out trial actors that died (not the harness's)."""

    def __init__(self, grid: Any) -> None:
        from infrarsi.orchestration.progress import is_lost_actor

        self.errors = [e for e in (getattr(grid, "errors", None) or []) if not is_lost_actor(e)]


def _check_capacity(contract: Contract, doctor: DoctorReport) -> None:
    """A memory capacity above the device's own would make every real OOM a lie ("peak >= the
    capacity" when the device ran out below it): a ``ClusterError`` before any trial."""
    from infrarsi.errors import ClusterError

    cap = contract.memory_capacity.memory_capacity_bytes
    device = doctor.device_memory_capacity_bytes
    if (
        cap
        and device
        and contract.workload_model().backend != "surrogate"
        and int(cap) > int(device)
    ):
        raise ClusterError(
            f"contract.yaml: field `memory_capacity`: rule: at most the device's memory; the study says "
            f"{int(cap) / 2**30:.2f} GiB per device, the doctor measured devices of {int(device) / 2**30:.2f} GiB "
            f"({doctor.hardware.get('device_name') or doctor.hardware.get('device') or 'this cluster'}). Fix: run "
            f"the study on devices that large, or init a new study with --memory-capacity at most "
            f"{int(device) / 2**30:.2f}GiB (or none: the device's own)."
        )


def _baseline_step(paths: StudyPaths) -> float | None:
    doctor = DoctorReport.load_if_present(paths.root)
    return doctor.baseline_step_time_s if doctor is not None else None
