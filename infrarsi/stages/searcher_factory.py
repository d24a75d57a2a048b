"""Builds the study's optimizer from its log, and the Ray Tune searcher over it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infrarsi.result import TrialResult

UNLIMITED_CAPACITY_BYTES = 10**15
"""Stand-in capacity when the contract leaves it to the device and none was measured."""


def outcome_of(row: TrialResult) -> Any:
    """The optimizer's view of one logged trial."""
    from infrarsi.search import Outcome

    if row.status == "ok":
        return Outcome(status="ok", step_time=row.step_time_s, peak_memory=row.peak_memory_bytes)
    if row.status == "oom":
        return Outcome(status="oom", peak_memory=row.peak_memory_bytes)
    return Outcome(status=row.status)


def build_optimizer(contract: Any, rows: list[TrialResult], *, study_dir: str | Path,
                    seed: int = 0) -> Any:
    """An ``Optimizer`` over the study's space, told every logged trial except interrupted ones
    (doctor baselines included, so the search never re-measures the baseline)."""
    from infrarsi.search import Optimizer
    from infrarsi.stages.common import baseline_config, load_space

    d = Path(study_dir)
    space = load_space(contract, d)
    cap = contract.memory_capacity_bytes or UNLIMITED_CAPACITY_BYTES
    opt = Optimizer(space, memory_capacity=float(cap), seed=seed, baseline=baseline_config(contract, d))
    for r in rows:
        if r.extra.get("interrupted") or not r.config:
            continue
        opt.tell(dict(r.config), outcome_of(r))
    return opt


def make_searcher(optimizer: Any, *, info_key: str) -> Any:
    """An ``InfrarsiSearcher`` that also passes the optimizer's prediction for each suggested
    config to the trainable under ``info_key`` (the report draws predicted vs measured memory)."""
    from infrarsi.tune import InfrarsiSearcher

    class _StudySearcher(InfrarsiSearcher):  # type: ignore[misc, valid-type]
        def suggest(self, trial_id: str) -> dict[str, Any] | None:
            cfg = super().suggest(trial_id)
            if cfg is None or not isinstance(cfg, dict):
                return cfg
            info = dict(getattr(self.optimizer, "last_ask_info", None) or {})
            out = dict(cfg)
            out[info_key] = {k: _jsonable(v) for k, v in info.items()}
            return out

    return _StudySearcher(optimizer=optimizer, metric="step_time_s", mode="min")


def _jsonable(v: Any) -> Any:
    try:
        import numpy as np

        if isinstance(v, np.generic):
            return v.item()
        if isinstance(v, np.ndarray):
            return v.tolist()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(v, (dict,)):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v
