"""The experience bank's trials as a ``TransferPrior`` for the search core's models.

``bank_transfer_prior`` reads the bank rows of similar studies (``Bank.warm_start_rows``: the same
model family and search-space name, other studies; the most similar studies, those with at
least half the best similarity) and hands the core, per source study, its trials in absolute
units and its own analytic prior (rebuilt from the source study's contract when its directory is
readable here; otherwise the new study's prior stands in). Each config is re-validated in the new
space (the caller's ``revalidate``, ``optimizer_factory.revalidate_config``: unknown knobs dropped,
missing ones filled from the baseline); one still invalid is dropped and counted. The core
(``infrarsi.search.transfer``) decides how much the sources count.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from infrarsi.search.transfer import SourceStudy, TransferPrior

if TYPE_CHECKING:
    from infrarsi.search import SearchSpace
    from infrarsi.study.contract import Contract

log = structlog.get_logger(__name__)

TRANSFER_MAX_ROWS = 400
"""At most this many bank rows (most similar first) enter the transfer."""


def _source_prior(study_dir: str | None) -> Any:
    """The analytic prior of the study in ``study_dir`` (None when it cannot be rebuilt here)."""
    if not study_dir or not Path(study_dir).is_dir():
        return None
    try:
        from infrarsi.study.contract import Contract
        from infrarsi.workload_prior import prior_for_workload

        return prior_for_workload(
            Contract.load(study_dir, check_files=False).workload_model(), enabled=True
        )
    except Exception as e:  # a moved or newer study: the new study's prior stands in
        log.info("bank.transfer_source_prior_unavailable", study_dir=study_dir, error=str(e)[:200])
        return None


Revalidate = Callable[
    [Any, Mapping[str, Any], Mapping[str, Any]], tuple[dict[str, Any] | None, Any, Any]
]
"""``(space, config, baseline) -> (full config or None, repair moves, reason)``."""


def bank_transfer_prior(
    contract: Contract,
    space: SearchSpace,
    *,
    bank_root: str | Path,
    baseline: Mapping[str, Any],
    hardware: Mapping[str, Any] | None,
    num_params: int | None,
    revalidate: Revalidate,
) -> tuple[TransferPrior | None, dict[str, Any] | None]:
    """``(record, summary)``: the bank's similar studies as a ``TransferPrior`` (None when the
    bank is missing, damaged or holds nothing similar) and what was used, for
    ``bank_warm_start.json``: ``{"sources": [{"study", "key", "similarity", "rows", "dropped",
    "own_prior"}]}``. ``hardware``: this study's (None: unknown yet)."""
    from infrarsi.bank.store import Bank

    root = bank_root
    try:
        bank = Bank(root)
        if not bank.files():
            return None, None
        cands = bank.warm_start_rows(
            contract, space, hardware, num_params=num_params, max_rows=TRANSFER_MAX_ROWS
        )
    except Exception as e:  # a damaged or unreachable bank must not stop a study
        log.warning("bank.transfer_failed", bank=str(root), error=str(e))
        return None, None
    best_sim = max((p["similarity"] for p in cands), default=0.0)
    by_source: dict[str, list[dict[str, Any]]] = {}
    for p in cands:
        if p["similarity"] >= best_sim * 0.5:
            by_source.setdefault(str(p["source_key"]), []).append(p)
    sources: list[SourceStudy] = []
    summary: list[dict[str, Any]] = []
    for key, ps in by_source.items():
        kept: list[tuple[dict[str, Any], dict[str, Any]]] = []
        dropped = 0
        for p in ps:
            full, _moves, _reason = revalidate(space, p.get("bank_config") or p["config"], baseline)
            if full is None:
                dropped += 1
            else:
                kept.append((p, full))
        if not kept:
            continue
        prior = _source_prior(ps[0].get("study_dir"))
        caps = {p.get("memory_capacity_bytes") for p, _ in kept}
        cap = next(iter(caps)) if len(caps) == 1 else None
        sources.append(
            SourceStudy(
                name=str(ps[0]["source_study"]),
                similarity=float(ps[0]["similarity"]),
                configs=tuple(full for _, full in kept),
                source_configs=tuple(dict(p.get("bank_config") or p["config"]) for p, _ in kept),
                step_times_s=tuple(
                    p.get("step_time_s") if p["status"] == "ok" else None for p, _ in kept
                ),
                peak_memory_bytes=tuple(p.get("peak_memory_bytes") for p, _ in kept),
                memory_censored=tuple(bool(p.get("memory_censored")) for p, _ in kept),
                memory_capacity_bytes=None if cap is None else float(cap),
                prior=prior,
                trial_ids=tuple(str(p.get("trial_id")) for p, _ in kept),
            )
        )
        summary.append(
            {
                "study": str(ps[0]["source_study"]),
                "key": key,
                "similarity": float(ps[0]["similarity"]),
                "rows": len(kept),
                "dropped": dropped,
                "own_prior": prior is not None,
            }
        )
    if not sources:
        return None, None
    return TransferPrior(tuple(sources)), {"sources": summary}


__all__ = ["TRANSFER_MAX_ROWS", "bank_transfer_prior"]
