"""Builds the study's optimizer from its log, and the Ray Tune searcher over it.

Warm start from the experience bank (``infrarsi.bank.store``): when the contract's bank switch is on
(``switches.bank``: ``--bank`` / ``$INFRARSI_BANK`` at init; ``off`` disables it) and it holds ok trials of a
similar workload (same model family and search space name) from OTHER studies (another
cluster, or this one with another model size or node count; never the study's own rows),
``build_optimizer`` gives them to the optimizer as warm-start configs (``initial_configs``), an
initial-design seeding, not transfer learning: after the baseline,
the first asks are the bank's best configs by step time relative to their own study's baseline
(``WARM_START_CONFIGS`` of them, most similar workload first, configs that ran out of memory or used
more than ``WARM_START_MAX_RELATIVE_MEMORY`` of their capacity left out). They are measured like any
other trial (one this study's memory model expects not to fit runs as its memory-saving repair:
``search.pickers.Pickers.warm_start``); nothing from the bank is told to the models as if it were
measured here. Once the
queue is used up (or a warm-start config was already tried), asks are the optimizer's own.
A bank config is re-validated in the new study's space first (``revalidate_config``): knobs the
space lacks are dropped, knobs it lacks take the baseline's value; one still invalid (a value
not allowed here, a broken constraint) is dropped. The choice, repairs and drops are kept in
``DIR/bank_warm_start.json`` and in each warm-start trial's ``AskInfo`` (``WarmStartOrigin.repairs``),
for the report's audit.

Transfer inside the models: with the bank on and an analytic prior, the bank's trials of similar
studies also reach the models (``infrarsi.bank.transfer`` reads them into a
``search.transfer.TransferPrior``: prior coefficients fitted on those studies, and a transferred
residual mean, each weighted by how well it ranks this study's own trials). What was used is
recorded under ``transfer`` in ``DIR/bank_warm_start.json``; each ask's weights are in its
``AskInfo.transfer_weights``. Without a bank (or with nothing similar in it) the optimizer is
exactly the cold one.

Analytic prior: the optimizer also gets the workload's analytic prior mean
(``infrarsi.workload_prior``: ZeRO / activation / FLOPs formulas whose coefficients are fitted on
the study's trials), unless the model shape is unknown or the contract's ``switches.analytic_prior`` is off.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from infrarsi.bank.transfer import bank_transfer_prior
from infrarsi.result import TrialResult
from infrarsi.search import AskInfo, Optimizer, Outcome, WarmStartOrigin
from infrarsi.search.ask_info import Phase
from infrarsi.search.settings import OptimizerSettings
from infrarsi.search.space import knob_distance
from infrarsi.workload_prior import prior_for_workload

if TYPE_CHECKING:
    from infrarsi.search import SearchSpace
    from infrarsi.study.contract import Contract
    from infrarsi.study.proposals import ProposalQueue

log = structlog.get_logger(__name__)

WARM_START_CONFIGS = 3
"""How many of the bank's best configs are tried first."""
WARM_START_MAX_RELATIVE_MEMORY = 0.9
"""A warm-start config must have used at most this fraction of its own study's memory capacity."""


def bank_disabled(contract: Contract) -> bool:
    """True when the contract's bank switch is off (``Contract.switches_in_force().bank`` is None)."""
    return contract.switches_in_force().bank is None


def study_hardware(rows: Sequence[TrialResult]) -> dict[str, Any] | None:
    """The hardware dict of the study's first measured trial (None before any)."""
    for r in rows:
        if r.hardware and not r.extra.interrupted:
            return dict(r.hardware)
    return None


def revalidate_config(
    space: SearchSpace, config: Mapping[str, Any], baseline: Mapping[str, Any]
) -> tuple[dict[str, Any] | None, tuple[str, ...], str | None]:
    """A bank config made valid in ``space``, when the repair is obvious: knobs the space lacks are
    dropped, knobs the config lacks take the ``baseline``'s value (else the space's default).
    Returns ``(full config, repair moves, None)``, or ``(None, moves, reason)`` when it is still
    invalid (a value the space does not allow, a broken constraint): the config is dropped."""
    from infrarsi.errors import SearchSpaceError

    names = list(space.names)
    moves = [f"dropped unknown knob {k}={v!r}" for k, v in config.items() if k not in names]
    cfg = {k: v for k, v in config.items() if k in names}
    for k in names:
        if k not in cfg and k in baseline:
            cfg[k] = baseline[k]
            moves.append(f"filled {k}={baseline[k]!r} from the baseline")
    try:
        return space.validate(cfg, where="bank config"), tuple(moves), None
    except SearchSpaceError as e:
        return None, tuple(moves), str(e)


def bank_warm_start_selection(
    contract: Contract,
    space: SearchSpace,
    rows: Sequence[TrialResult],
    *,
    bank_root: str | Path | None = None,
    limit: int = WARM_START_CONFIGS,
    baseline: Mapping[str, Any] | None = None,
    pool: int = 4,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(used, dropped)``: the bank's best configs for this study (module docstring), best
    first, as ``warm_start_rows`` dicts whose ``config`` is re-validated in ``space``
    (``revalidate_config``; ``repairs`` lists the moves), and the candidates dropped because no
    obvious repair makes them valid (``reason``). Both empty when the bank is off, missing or
    has nothing similar. ``pool`` > 1 (``OptimizerSettings.warm_start_pool``): the ``limit``
    are chosen for spread among the ``limit * pool`` best (``spread_out``), the best first."""
    if bank_disabled(contract) or limit <= 0:
        return [], []
    from infrarsi.bank.store import Bank

    try:
        bank = Bank(bank_root if bank_root is not None else contract.switches_in_force().bank)
        if not bank.files():
            return [], []
        num_params = next((r.extra.num_params for r in rows if r.extra.num_params), None)
        candidates = bank.warm_start_rows(
            contract, space, study_hardware(rows), num_params=num_params
        )
    except Exception as e:  # a damaged or unreachable bank must not stop a study
        log.warning(
            "bank.warm_start_failed",
            bank=str(bank_root or contract.switches_in_force().bank),
            error=str(e),
        )
        return [], []
    base = dict(baseline) if baseline is not None else dict(contract.workload.get("baseline") or {})
    ok = [
        p
        for p in candidates
        if p["status"] == "ok"
        and p["relative_step_time"] is not None
        and (
            p["relative_peak_memory"] is None
            or p["relative_peak_memory"] <= WARM_START_MAX_RELATIVE_MEMORY
        )
    ]
    best_sim = max((p["similarity"] for p in ok), default=0.0)
    ok = [p for p in ok if p["similarity"] >= best_sim * 0.5]  # the most similar workloads only
    ok.sort(key=lambda p: (p["relative_step_time"], -p["similarity"]))
    out: list[dict[str, Any]] = []
    dropped: list[dict[str, Any]] = []
    keys: set[str] = set()
    for p in ok:
        full, moves, reason = revalidate_config(space, p.get("bank_config") or p["config"], base)
        if full is None:
            dropped.append({**p, "repairs": list(moves), "reason": (reason or "")[:400]})
            continue
        key = space.key(full)
        if key in keys:
            continue
        keys.add(key)
        out.append({**p, "config": full, "repairs": list(moves)})
        if len(out) >= limit * pool:
            break
    return (spread_out(out, limit, [k.name for k in space.knobs]) if pool > 1 else out), dropped


def spread_out(
    rows: list[dict[str, Any]], limit: int, names: Sequence[str]
) -> list[dict[str, Any]]:
    """``limit`` of ``rows`` (best first): the best, then each time the row farthest from those
    chosen (the fewest knobs in common with its nearest; ties: the better), in the order chosen."""
    if not rows:
        return []
    chosen = [0]
    while len(chosen) < min(limit, len(rows)):

        def nearest(j: int) -> int:
            c = rows[j]["config"]
            return min(knob_distance(c, rows[i]["config"], names) for i in chosen)

        rest = [j for j in range(len(rows)) if j not in chosen]
        chosen.append(max(rest, key=lambda j: (nearest(j), -j)))
    return [rows[j] for j in chosen]


def bank_warm_start_configs(
    contract: Contract,
    space: SearchSpace,
    rows: Sequence[TrialResult],
    *,
    bank_root: str | Path | None = None,
    limit: int = WARM_START_CONFIGS,
    baseline: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The used half of ``bank_warm_start_selection``."""
    return bank_warm_start_selection(
        contract, space, rows, bank_root=bank_root, limit=limit, baseline=baseline
    )[0]


def record_warm_start(
    study_dir: str | Path,
    used: list[dict[str, Any]],
    dropped: list[dict[str, Any]],
    bank: str | None,
    transfer: dict[str, Any] | None = None,
) -> None:
    """Write ``DIR/bank_warm_start.json`` (the report's audit reads it) when the selection
    differs from the recorded one; never raises (a read-only study only loses the record).
    ``transfer``: the bank's studies used inside the models (``bank_transfer_prior``'s summary).
    The record is a ``WarmStartRecord``; a bank entry's keys it does not name are left out."""
    from infrarsi.errors import StudyError
    from infrarsi.study.paths import StudyPaths, write_json_atomic
    from infrarsi.study.warm_start_record import WarmStartRecord

    path = StudyPaths(Path(study_dir)).bank_warm_start
    try:
        record = WarmStartRecord.model_validate(
            {
                "bank": bank,
                "used": [{k: v for k, v in p.items() if k != "reason"} for p in used],
                "dropped": dropped,
                "transfer": transfer,
            }
        )
        if path.exists():
            try:
                if WarmStartRecord.read(path).same_choice(record):
                    return
            except StudyError:  # a damaged record: written again below
                pass
        elif not (used or dropped or transfer):
            return
        record.at = time.time()
        write_json_atomic(path, record.to_dict())
    except (OSError, ValueError) as e:  # pydantic's ValidationError is a ValueError
        log.warning("bank.warm_start_record_failed", path=str(path), error=str(e))


def build_optimizer(
    contract: Contract,
    rows: list[TrialResult],
    *,
    study_dir: str | Path,
    seed: int = 0,
    bank_root: str | Path | None = None,
    settings: OptimizerSettings | None = None,
) -> Optimizer:
    """An ``Optimizer`` over the study's space, told every logged trial except interrupted ones
    (doctor baselines included, so the search never re-measures the baseline). With a bank
    holding similar trials of other studies, the bank's best configs are its warm-start
    configs, tried first (module docstring)."""
    from infrarsi.errors import SearchSpaceError
    from infrarsi.orchestration.common import baseline_config, scoped_space

    d = Path(study_dir)
    space = scoped_space(
        contract, d
    )  # the contract's editable knobs vary, the others stay at the baseline
    cap = contract.memory_capacity.optimizer_memory_capacity_bytes
    baseline = baseline_config(contract, d)
    settings = settings if settings is not None else OptimizerSettings()
    warm, dropped = bank_warm_start_selection(
        contract, space, rows, bank_root=bank_root, baseline=baseline, pool=settings.warm_start_pool
    )
    analytic = prior_for_workload(
        contract.workload_model(), enabled=contract.switches_in_force().analytic_prior
    )
    transfer, transfer_summary = None, None
    switched_bank = contract.switches_in_force().bank  # None: the bank is off (bank_disabled)
    if analytic is not None and switched_bank is not None:
        transfer, transfer_summary = bank_transfer_prior(
            contract,
            space,
            bank_root=bank_root if bank_root is not None else switched_bank,
            baseline=baseline,
            hardware=study_hardware(rows),
            revalidate=revalidate_config,
            num_params=next((r.extra.num_params for r in rows if r.extra.num_params), None),
        )
    if warm or dropped:
        log.info(
            "bank.warm_start",
            configs=len(warm),
            dropped=len(dropped),
            repaired=sum(1 for p in warm if p["repairs"]),
            sources=sorted({str(p["source_study"]) for p in warm}),
        )
    queued = remaining_warm_starts(warm, rows, space)
    warm_start: list[Mapping[str, Any]] = [p["config"] for p in queued]
    opt = Optimizer(
        space,
        memory_capacity=float(cap),
        seed=seed,
        baseline=baseline,
        prior=analytic,
        initial_configs=warm_start,
        transfer=transfer,
        initial_origins=[WarmStartOrigin.from_dict(p) for p in queued],
        settings=settings,
    )
    check = opt.transfer.rank_check if opt.transfer is not None else None
    if transfer_summary is not None and check is not None:
        transfer_summary = {**transfer_summary, "time_rank_check": check.to_dict()}
    if not bank_disabled(contract) and d.is_dir():
        record_warm_start(
            d, warm, dropped, str(bank_root or contract.switches_in_force().bank), transfer_summary
        )
    for r in rows:
        if r.extra.interrupted or not r.config:
            continue
        if has_proposal_patch(r):  # another candidate than its knobs alone (study.candidate)
            continue
        if not set(contract.editable.knobs) >= set(space.names):
            try:
                space.validate(dict(r.config), where=f"trial {r.trial_id}")
            except SearchSpaceError as e:
                log.warning("trial.out_of_scope_skipped", trial_id=r.trial_id, reason=str(e)[:300])
                continue
        opt.tell(dict(r.config), Outcome.from_row(r))
    return opt


def remaining_warm_starts(
    warm: list[dict[str, Any]], rows: Sequence[TrialResult], space: SearchSpace
) -> list[dict[str, Any]]:
    """The bank's warm starts a resumed study still has: those whose config it has not measured,
    at most ``len(warm)`` less the warm-start trials its log already holds (a mapped warm start
    asks a config no bank entry names, so its turn is counted, not its config). A study's warm
    starts thus run once, over however many ``run`` calls."""
    done = sum(
        1
        for r in rows
        if not r.extra.interrupted
        and isinstance(r.extra.ask_info, dict)
        and r.extra.ask_info.get("phase") == Phase.WARM_START
    )

    def key(config: Mapping[str, Any]) -> tuple[str, ...]:  # a logged row may lack a knob
        return tuple(repr(config.get(n)) for n in space.names)

    seen = {key(r.config) for r in rows if r.config and not r.extra.interrupted}
    left = [p for p in warm if key(p["config"]) not in seen]
    return left[: max(0, len(warm) - done)]


def has_proposal_patch(row: TrialResult) -> bool:
    """True when a row ran a proposal's code patch: the knob models only know knobs, so the
    outcome of that patched code is not told to them as the knobs' (a cheat's violation would
    deter the search from honest knobs, a real win would credit knobs with the patch's speed).
    Verify still weighs it as its own candidate (``infrarsi.study.candidate``)."""
    from infrarsi.study.candidate import patch_source

    return any(patch_source(str(p)) == "proposal" for p in row.patches or [])


def logged_row(study_dir: str | Path, tune_trial_id: str) -> TrialResult | None:
    """The run row the executor logged for Ray Tune trial ``tune_trial_id`` (``extra.tune_trial_id``;
    rows logged as interrupted do not count), or None when it never ran."""
    from infrarsi.study.trial_log import read_trials
    from infrarsi.study.trial_log import rows as rows_from_table

    for r in rows_from_table(read_trials(Path(study_dir))):
        if r.stage == "run" and r.extra.tune_trial_id == tune_trial_id and not r.extra.interrupted:
            return r
    return None


def make_searcher(
    optimizer: Optimizer,
    *,
    info_key: str,
    proposals: ProposalQueue | None = None,
    proposal_key: str = "",
    study_dir: str | Path | None = None,
) -> Any:
    """An ``InfrarsiSearcher`` that also passes the optimizer's ``AskInfo`` for each suggested
    config to the trainable under ``info_key``, as ``AskInfo.to_dict()`` (the report draws
    predicted vs measured memory). With ``proposals`` (a ``ProposalQueue``), each suggestion
    first takes the oldest queued proposal, if any: it runs instead of an asked config, marked
    pending in the optimizer, its ``Proposal.to_dict()`` under ``proposal_key``.

    With ``study_dir``, a Tune trial that ended in error without a result (its trial actor died
    beyond Tune's retries) is told what the study log says of it: the row the executor logged
    for that Tune trial, if it ran; else nothing (``Optimizer.drop_pending``), since its config
    never ran and ``failed`` would deter the search from it."""
    from infrarsi.integrations.ray_tune import InfrarsiSearcher

    class _StudySearcher(InfrarsiSearcher):  # type: ignore[misc, valid-type]
        untold: set[str] = set()
        """Tune trial ids of patched proposals: run and logged, never told to the knob models."""

        def on_trial_complete(
            self, trial_id: str, result: dict | None = None, error: bool = False
        ) -> None:
            if trial_id in self.untold:
                self.untold.discard(trial_id)
                self.live.pop(trial_id, None)
                return
            if study_dir is None or not (error or result is None) or trial_id not in self.live:
                super().on_trial_complete(trial_id, result=result, error=error)
                return
            row = logged_row(study_dir, trial_id)
            if row is not None:  # the executor ran it: its own outcome
                super().on_trial_complete(trial_id, result=row.to_dict(), error=False)
                return
            config = self.live.pop(trial_id)
            self.optimizer.drop_pending(config)
            log.warning(
                "run.trial_never_ran",
                tune_trial_id=trial_id,
                note="its Tune actor died before the executor ran it; not told as failed",
            )

        def suggest(self, trial_id: str) -> dict[str, Any] | None:
            proposal = proposals.take() if proposals is not None else None
            if proposal is not None:
                from infrarsi.errors import UserInputError

                try:
                    if proposal.patch:  # patched code: not a point of the knob models
                        full = self.optimizer.space.validate(
                            proposal.config, where=f"proposal {proposal.proposal_id}"
                        )
                        self.untold.add(trial_id)
                    else:
                        full = self.optimizer.add_pending(proposal.config)
                except (
                    UserInputError
                ) as e:  # checked when queued; a study edited since may refuse it
                    log.warning(
                        "run.proposal_refused", proposal_id=proposal.proposal_id, error=str(e)[:300]
                    )
                    return self.suggest(trial_id)
                self.live[trial_id] = full
                proposed = self.optimizer.info(full)
                log.info(
                    "run.proposal", proposal_id=proposal.proposal_id, proposer=proposal.proposer
                )
                return {
                    **full,
                    info_key: proposed.to_dict() if proposed is not None else {},
                    proposal_key: proposal.to_dict(),
                }
            cfg = super().suggest(trial_id)
            if cfg is None or not isinstance(cfg, dict):
                return cfg
            info = self.optimizer.last_ask_info
            out = dict(cfg)
            out[info_key] = info.to_dict() if isinstance(info, AskInfo) else {}
            return out

    searcher = _StudySearcher(optimizer=optimizer, metric="step_time_s", mode="min")
    searcher.untold = set()  # per instance, not the class attribute
    return searcher
