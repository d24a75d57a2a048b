"""Reading and writing an ``Optimizer``'s saved state, and reading trial-log history into outcomes.

``Optimizer.state_dict()`` is a JSON-able dict: the space's YAML, ``OptimizerSettings``, every
observation, the pending configs, the ask infos, the warm-start queue, the RNG state and the
models' warm-start parameters, so a restored optimizer gives the same next ``ask`` as the original.
This module holds what does not need the optimizer itself: the version rule, the settings of a
state (also of a version-1 state, which kept the options at the top level), atomic JSON files and
the trial-log rows (history) an optimizer is rebuilt from.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from infrarsi.errors import InfrarsiError, SearchSpaceError
from infrarsi.search.outcome import Outcome
from infrarsi.search.settings import OptimizerSettings
from infrarsi.search.space import SearchSpace

if TYPE_CHECKING:
    import numpy as np

    from infrarsi.search.encoding import Encoder
    from infrarsi.search.history import History
    from infrarsi.search.modelset import ModelSet
    from infrarsi.search.priors.mean import PriorMean
    from infrarsi.search.transfer import TransferModel

STATE_VERSION = 2
"""Version of ``Optimizer.state_dict()`` (1: options at the top level, ask infos as plain dicts)."""
READABLE_VERSIONS = (1, 2)
"""Versions ``Optimizer.load_state_dict`` reads."""
_V1_OPTIONS = (
    "censoring",
    "pairing",
    "n_init",
    "candidate_cap",
    "num_threads",
    "local_every",
    "intensify",
)


def check_version(state: Mapping[str, Any]) -> int:
    """The state's version, or an ``InfrarsiError`` when it cannot be read."""
    version = state.get("version")
    if version not in READABLE_VERSIONS:
        raise InfrarsiError(
            f"optimizer state: rule: version must be one of {list(READABLE_VERSIONS)}; got {version!r}."
        )
    return int(version)


def settings_of(state: Mapping[str, Any]) -> OptimizerSettings:
    """The ``OptimizerSettings`` a state was saved with."""
    if check_version(state) == 1:
        return OptimizerSettings.from_dict({k: state[k] for k in _V1_OPTIONS if k in state})
    return OptimizerSettings.from_dict(state.get("settings") or {})


def space_of(state: Mapping[str, Any]) -> SearchSpace:
    """The search space a state was saved with."""
    space = SearchSpace.from_yaml(state["space_source"])
    space.file = state.get("space_file", space.file)
    return space


class Saved(Protocol):
    """What of an ``Optimizer`` its state holds (the optimizer is one; typed here so that this
    module does not import it)."""

    space: SearchSpace
    memory_capacity: float
    seed: int
    baseline: dict[str, Any] | None
    settings: OptimizerSettings
    encoder: Encoder
    history: History
    rng: np.random.Generator
    models: ModelSet
    prior: PriorMean | None
    transfer: TransferModel | None


def state_of(opt: Saved) -> dict[str, Any]:
    """``opt.state_dict()``: each part's state through its own ``to_dict``."""
    return {
        "version": STATE_VERSION,
        "space_source": opt.space.source,
        "space_file": opt.space.file,
        "memory_capacity": opt.memory_capacity,
        "seed": opt.seed,
        "baseline": opt.baseline,
        "settings": opt.settings.to_dict(),
        **opt.history.to_dict(),
        "rng": opt.rng.bit_generator.state,
        **opt.models.to_dict(),
        "prior": None if opt.prior is None else opt.prior.spec(),
        "transfer": None if opt.transfer is None else opt.transfer.to_dict(),
    }


def constructor_args(state: Mapping[str, Any]) -> dict[str, Any]:
    """The ``Optimizer`` keyword arguments (all but the space) a state was saved with."""
    from infrarsi.search.priors.registry import prior_from_spec

    return {
        "memory_capacity": state["memory_capacity"],
        "seed": state["seed"],
        "baseline": state.get("baseline"),
        "settings": settings_of(state),
        "prior": None if state.get("prior") is None else prior_from_spec(state["prior"]),
    }


def restore(opt: Saved, state: Mapping[str, Any]) -> None:
    """``opt.load_state_dict(state)``: the history, the RNG, the bank transfer's saved fit (not a
    refit: the same asks as before) and the models' state."""
    from infrarsi.search.history import History
    from infrarsi.search.transfer import TransferModel

    check_version(state)
    opt.history = History.from_dict(opt.space, state, warm_queue=opt.history.warm_queue)
    opt.models.feasibility.clear()
    for o in opt.history.observations:
        opt.models.observe(o.config, o.outcome)
    opt.rng.bit_generator.state = state["rng"]
    saved = state.get("transfer")
    if saved and opt.prior is not None and opt.settings.transfer:
        opt.transfer = TransferModel.from_dict(saved, opt.encoder, opt.prior, opt.settings)
        opt.models.features.transfer = opt.transfer
    opt.models.load_dict(state)


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    """Write ``data`` as JSON to ``path`` atomically (a temp file, then ``os.replace``)."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, p)


def read_json(path: str | os.PathLike[str]) -> Any:
    """The JSON in ``path``."""
    return json.loads(Path(path).read_text())


def history_outcomes(
    space: SearchSpace,
    rows: Iterable[Mapping[str, Any]] | Any,
    stages: tuple[str, ...] | None = None,
) -> Iterator[tuple[dict[str, Any], Outcome]]:
    """``(config, outcome)`` of each trial-log row (dicts, or a ``pyarrow.Table``), in order.

    Each row needs ``config`` (a JSON string or a dict); the outcome follows ``Outcome.from_row``.
    Rows whose config is not valid in ``space`` are skipped with a warning; ``stages`` keeps only
    rows of those stages.
    """
    if hasattr(rows, "to_pylist"):
        rows = rows.to_pylist()
    for row in rows:
        if stages is not None and row.get("stage") not in stages:
            continue
        raw = row.get("config")
        cfg: Any = json.loads(raw) if isinstance(raw, str) else raw
        try:
            cfg = space.validate(cfg, where=f"trial {row.get('trial_id', '?')}")
        except SearchSpaceError as exc:
            warnings.warn(f"from_trials: skipped a row: {exc}", stacklevel=3)
            continue
        yield cfg, Outcome.from_row(row)
