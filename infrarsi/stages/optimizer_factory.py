"""Builds the study's optimizer from its log, and the Ray Tune searcher over it.

Warm start from the experience bank (``infrarsi.study.bank``): when the contract's bank switch is on
(``switches.bank``: ``--bank`` / ``$INFRARSI_BANK`` at init; ``off`` disables it) and it holds ok trials of a
similar workload (same model family and search space name) measured on OTHER hardware,
``build_optimizer`` gives them to the optimizer as warm-start configs (``initial_configs``), an
initial-design seeding, not transfer learning: after the baseline,
the first asks are the bank's best configs by step time relative to their own study's baseline
(``WARM_START_CONFIGS`` of them, most similar workload first, configs that ran out of memory or used
more than ``WARM_START_MAX_RELATIVE_MEMORY`` of their capacity left out). They are measured like any
other trial; nothing from the bank is told to the models as if it were measured here. Once the
queue is used up (or a warm-start config was already tried), asks are the optimizer's own.

Analytic prior: the optimizer also gets the workload's analytic prior mean
(``infrarsi.workload_prior``: ZeRO / activation / FLOPs formulas whose coefficients are fitted on
the study's trials), unless the model shape is unknown or the contract's ``switches.analytic_prior`` is off.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from infrarsi.result import TrialResult
from infrarsi.search import AskInfo, Optimizer, Outcome, WarmStartOrigin
from infrarsi.workload_prior import prior_for_workload

log = structlog.get_logger(__name__)

WARM_START_CONFIGS = 3
"""How many of the bank's best configs are tried first."""
WARM_START_MAX_RELATIVE_MEMORY = 0.9
"""A warm-start config must have used at most this fraction of its own study's memory capacity."""


def bank_disabled(contract: Any) -> bool:
    """True when the contract's bank switch is off (``Contract.switches_in_force().bank`` is None)."""
    return contract.switches_in_force().bank is None


def study_hardware(rows: Sequence[TrialResult]) -> dict[str, Any] | None:
    """The hardware dict of the study's first measured trial (None before any)."""
    for r in rows:
        if r.hardware and not r.extra.get("interrupted"):
            return dict(r.hardware)
    return None


def bank_warm_start_configs(contract: Any, space: Any, rows: Sequence[TrialResult], *,
                            bank_root: str | Path | None = None, limit: int = WARM_START_CONFIGS) -> list[dict[str, Any]]:
    """The bank's best configs for this study (see the module docstring), best first, as
    ``warm_start_rows`` dicts. Empty when the bank is off, missing or has nothing similar."""
    if bank_disabled(contract) or limit <= 0:
        return []
    from infrarsi.study.bank import Bank

    bank = Bank(bank_root if bank_root is not None else contract.switches_in_force().bank)
    if not bank.files():
        return []
    num_params = next((r.extra.get("num_params") for r in rows if r.extra.get("num_params")), None)
    try:
        candidates = bank.warm_start_rows(contract, space, study_hardware(rows), num_params=num_params)
    except Exception as e:  # a damaged bank must not stop a study
        log.warning("bank.warm_start_failed", bank=str(bank.root), error=str(e))
        return []
    ok = [p for p in candidates if p["status"] == "ok" and p["relative_step_time"] is not None
          and (p["relative_peak_memory"] is None or p["relative_peak_memory"] <= WARM_START_MAX_RELATIVE_MEMORY)]
    best_sim = max((p["similarity"] for p in ok), default=0.0)
    ok = [p for p in ok if p["similarity"] >= best_sim * 0.5]  # the most similar workloads only
    ok.sort(key=lambda p: (p["relative_step_time"], -p["similarity"]))
    out, keys = [], set()
    for p in ok:
        if not space.is_valid(p["config"]):
            continue
        key = space.key(space.validate(p["config"]))
        if key in keys:
            continue
        keys.add(key)
        out.append(p)
        if len(out) >= limit:
            break
    return out


def build_optimizer(contract: Any, rows: list[TrialResult], *, study_dir: str | Path,
                    seed: int = 0, bank_root: str | Path | None = None) -> Optimizer:
    """An ``Optimizer`` over the study's space, told every logged trial except interrupted ones
    (doctor baselines included, so the search never re-measures the baseline). With a bank
    holding similar trials from other hardware, the bank's best configs are its warm-start
    configs, tried first (module docstring)."""
    from infrarsi.errors import SearchSpaceError
    from infrarsi.stages.common import baseline_config, scoped_space

    d = Path(study_dir)
    space = scoped_space(contract, d)  # the contract's editable knobs vary, the others stay at the baseline
    cap = contract.memory_capacity.optimizer_memory_capacity_bytes
    warm = bank_warm_start_configs(contract, space, rows, bank_root=bank_root)
    analytic = prior_for_workload(contract.workload_model(), enabled=contract.switches_in_force().analytic_prior)
    if warm:
        log.info("bank.warm_start", configs=len(warm), sources=sorted({str(p["source_study"]) for p in warm}))
    warm_start: list[Mapping[str, Any]] = [p["config"] for p in warm]
    opt = Optimizer(space, memory_capacity=float(cap), seed=seed, baseline=baseline_config(contract, d),
                    prior=analytic, initial_configs=warm_start,
                    initial_origins=[WarmStartOrigin.from_dict(p) for p in warm])
    for r in rows:
        if r.extra.get("interrupted") or not r.config:
            continue
        if not set(contract.editable.knobs) >= set(space.names):
            try:
                space.validate(dict(r.config), where=f"trial {r.trial_id}")
            except SearchSpaceError as e:
                log.warning("trial.out_of_scope_skipped", trial_id=r.trial_id, reason=str(e)[:300])
                continue
        opt.tell(dict(r.config), Outcome.from_row(r))
    return opt


def make_searcher(optimizer: Any, *, info_key: str, proposals: Any = None, proposal_key: str = "") -> Any:
    """An ``InfrarsiSearcher`` that also passes the optimizer's ``AskInfo`` for each suggested
    config to the trainable under ``info_key``, as ``AskInfo.to_dict()`` (the report draws
    predicted vs measured memory). With ``proposals`` (a ``ProposalQueue``), each suggestion
    first takes the oldest queued proposal, if any: it runs instead of an asked config, marked
    pending in the optimizer, its ``Proposal.to_dict()`` under ``proposal_key``."""
    from infrarsi.tune import InfrarsiSearcher

    class _StudySearcher(InfrarsiSearcher):  # type: ignore[misc, valid-type]
        def suggest(self, trial_id: str) -> dict[str, Any] | None:
            proposal = proposals.take() if proposals is not None else None
            if proposal is not None:
                from infrarsi.errors import UserInputError

                try:
                    full = self.optimizer.add_pending(proposal.config)
                except UserInputError as e:  # checked when queued; a study edited since may refuse it
                    log.warning("run.proposal_refused", proposal_id=proposal.proposal_id, error=str(e)[:300])
                    return self.suggest(trial_id)
                self.live[trial_id] = full
                proposed = self.optimizer.info(full)
                log.info("run.proposal", proposal_id=proposal.proposal_id, proposer=proposal.proposer)
                return {**full, info_key: proposed.to_dict() if proposed is not None else {},
                        proposal_key: proposal.to_dict()}
            cfg = super().suggest(trial_id)
            if cfg is None or not isinstance(cfg, dict):
                return cfg
            info = self.optimizer.last_ask_info
            out = dict(cfg)
            out[info_key] = info.to_dict() if isinstance(info, AskInfo) else {}
            return out

    return _StudySearcher(optimizer=optimizer, metric="step_time_s", mode="min")

