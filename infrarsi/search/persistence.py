"""Saving, restoring and rebuilding an ``Optimizer`` (mixed into it).

- ``state_dict()`` / ``load_state_dict(state)``: a JSON-able dict with the space's YAML, the
  options, every observation, the pending configs, the RNG state and the models' warm-start
  parameters, so a restored optimizer gives the same next ``ask`` as the original.
- ``save(path)`` / ``Optimizer.load(path)``: the same, as a JSON file (written atomically).
- ``Optimizer.from_trials(space, rows, memory_capacity=...)``: rebuild from trial-log rows.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from infrarsi.errors import InfrarsiError, SearchSpaceError
from infrarsi.search.outcome import Outcome

if TYPE_CHECKING:
    from infrarsi.search.optimizer import Optimizer

STATE_VERSION = 1


class PersistenceMixin:
    """State methods of ``Optimizer``."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly where this optimizer is (JSON-able)."""
        opt: Any = self
        return {
            "version": STATE_VERSION,
            "space_source": opt.space.source,
            "space_file": opt.space.file,
            "memory_capacity": opt.memory_capacity,
            "seed": opt.seed,
            "baseline": opt.baseline,
            "censoring": opt.censoring,
            "pairing": opt.pairing,
            "n_init": opt.n_init,
            "candidate_cap": opt.candidate_cap,
            "num_threads": opt.num_threads,
            "local_every": opt.local_every,
            "intensify": opt.intensify,
            "observations": [{"config": o.config, "outcome": o.outcome.to_dict()} for o in opt.observations],
            "pending": list(opt.pending.values()),
            "ask_infos": list(opt.ask_infos.values()),
            "rng": opt.rng.bit_generator.state,
            "n_asks": opt.n_asks,
            "models": opt.models.state_dict(),
            "prior": None if opt.prior is None else opt.prior.spec(),
            "prior_coefficients": {k: None if v is None else [float(x) for x in v] for k, v in opt.prior_coef.items()},
            "prior_fit_keys": dict(opt.prior_fit_keys),
            "time_outliers": sorted(opt.time_outliers),
            "time_trim_key": opt.time_trim_key,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore observations, pending configs, RNG and model state (the space and options stay)."""
        opt: Any = self
        if state.get("version") != STATE_VERSION:
            raise InfrarsiError(f"optimizer state: rule: version must be {STATE_VERSION}; got {state.get('version')!r}.")
        opt.observations = []
        opt.feasibility.clear()
        for raw in state["observations"]:
            opt.tell(raw["config"], Outcome.from_dict(raw["outcome"]))
        opt.pending = {opt.space.key(c): opt.space.validate(c) for c in state.get("pending", [])}
        opt.ask_infos = {opt.space.key(i["config"]): i for i in state.get("ask_infos", [])}
        opt.rng.bit_generator.state = state["rng"]
        opt.n_asks = int(state["n_asks"])
        opt.models.load_state_dict(state.get("models") or {})
        opt.time_outliers = {int(i) for i in state.get("time_outliers") or []}
        opt.time_trim_key = state.get("time_trim_key")
        if opt.prior is not None:
            import numpy as np

            coef = state.get("prior_coefficients") or {}
            n_terms = {"time": len(opt.prior.time_names), "memory": len(opt.prior.memory_names)}
            # coefficients saved for another set of terms (an older prior) are refitted from the trials
            opt.prior_coef = {k: None if coef.get(k) is None or len(coef[k]) != n_terms[k]
                              else np.asarray(coef[k], dtype=float) for k in ("time", "memory")}
            keys = state.get("prior_fit_keys") or {}
            opt.prior_fit_keys = {k: keys.get(k) if opt.prior_coef[k] is not None else None for k in ("time", "memory")}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Optimizer:
        """A new optimizer (space included) from ``state_dict()``."""
        from infrarsi.search.priors.registry import prior_from_spec
        from infrarsi.search.space import SearchSpace

        space = SearchSpace.from_yaml(state["space_source"])
        space.file = state.get("space_file", space.file)
        opt = cast("Any", cls)(space, memory_capacity=state["memory_capacity"], seed=state["seed"],
                               baseline=state.get("baseline"), censoring=state["censoring"], pairing=state["pairing"],
                               n_init=state["n_init"], candidate_cap=state["candidate_cap"],
                               num_threads=state.get("num_threads", 1), local_every=state.get("local_every", 2),
                               intensify=state.get("intensify", True),
                               prior=None if state.get("prior") is None else prior_from_spec(state["prior"]))
        opt.load_state_dict(state)
        return cast("Optimizer", opt)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write ``state_dict()`` as JSON to ``path`` (atomically: a temp file, then ``os.replace``)."""
        p = Path(path)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(json.dumps(cast("Optimizer", self).state_dict()))
        os.replace(tmp, p)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Optimizer:
        """Inverse of ``save``."""
        return cls.from_state(json.loads(Path(path).read_text()))

    @classmethod
    def from_trials(cls, space: Any, rows: Iterable[Mapping[str, Any]] | Any, *, memory_capacity: float,
                    stages: tuple[str, ...] | None = None, **kwargs: Any) -> Optimizer:
        """Rebuild from trial-log rows (dicts, or a ``pyarrow.Table``).

        Each row needs ``config`` (a JSON string or a dict) and ``status``; ``step_time_s``,
        ``peak_memory_bytes`` and ``memory_censored`` are used when present. Rows whose config is
        not valid in ``space`` are skipped with a warning. ``stages`` keeps only rows of those stages.
        """
        if hasattr(rows, "to_pylist"):
            rows = rows.to_pylist()
        opt = cast("Any", cls)(space, memory_capacity=memory_capacity, **kwargs)
        for row in rows:
            if stages is not None and row.get("stage") not in stages:
                continue
            raw = row.get("config")
            cfg = json.loads(raw) if isinstance(raw, str) else raw
            try:
                cfg = space.validate(cfg, where=f"trial {row.get('trial_id', '?')}")
            except SearchSpaceError as exc:
                warnings.warn(f"from_trials: skipped a row: {exc}", stacklevel=2)
                continue
            opt.tell(cfg, Outcome.from_row(row))
        return cast("Optimizer", opt)
