"""``AskInfo``: why the optimizer asked for a config (phase, predictions, repair and warm-start origin).

An ``AskInfo`` is built for every config an ``Optimizer`` asks (``opt.last_ask_info``,
``opt.info(config)``), saved with its state, passed to the trial through Ray Tune's config and kept
in the trial log (``extra.ask_info``) as ``to_dict()``; ``from_dict`` reads it back, also from
states and logs written before this record existed.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from infrarsi.errors import UserInputError


class Phase(str, enum.Enum):
    """Why a config was asked: the schedule's step that picked it (``search.schedule``).

    The values are the strings logs, saved states and reports have always held, so a ``Phase``
    compares equal to its string and writes as it (JSON, Arrow).
    """

    BASELINE = "baseline"
    """The baseline config, asked first."""
    WARM_START = "warm_start"
    """A warm-start config given to the optimizer (``initial_configs``), or its memory-saving repair."""
    DESIGN = "design"
    """A space-filling design point."""
    BO = "bo"
    """The acquisition's best."""
    BO_LOCAL = "bo-local"
    """The acquisition's best near the incumbent (a local turn)."""
    EXPLORE = "explore"
    """An exploring local turn's pick (``OptimizerSettings.explore_every``): by ``explore_rule``,
    the acquisition's best among configs holding a knob value never measured near the incumbent,
    or far from every config tried, or the last pick of a greedy batch."""
    BO_PRIOR = "bo-prior"
    """The analytic prior's pick while trials are pending before the step-time model exists."""
    REPLICATE = "replicate"
    """A re-measurement of the incumbent."""
    REPAIR = "repair"
    """A memory-saving repair of a candidate that would not fit."""
    PROPOSAL = "proposal"
    """A config proposed from outside the optimizer (an agent or a person, ``Optimizer.add_pending``)."""

    def __str__(self) -> str:
        """The phase's string, as logs have always held it."""
        return self.value


PHASES = tuple(p.value for p in Phase)
"""Every phase's string (``Phase``), in schedule order."""

_OLD_PHASES = {"prior": Phase.WARM_START}
"""Phase strings written before ``AskInfo`` -> their ``Phase`` (a warm-start config was ``prior``)."""

_OLD_NAMES = {"predicted_memory_bytes": "predicted_peak_memory_bytes", "prior": "warm_start_origin"}
"""Keys of ask-info dicts written before ``AskInfo`` -> its field names."""


@dataclass(frozen=True)
class WarmStartOrigin:
    """Where a warm-start config was measured before: a trial of an earlier study (for example
    one found in the experience bank, measured by another study)."""

    source_study: str | None = None
    """The earlier study's name or directory."""
    trial_id: str | None = None
    """The trial of that study that measured the config."""
    relative_step_time: float | None = None
    """Its step time over that study's baseline step time (< 1: faster than the baseline)."""
    similarity: float | None = None
    """How similar that study's workload is to this one (1: the same; the bank's score)."""
    hardware_fingerprint: str | None = None
    """The hardware it was measured on."""
    repairs: tuple[str, ...] = ()
    """How the bank's config was made valid in this study's space (``dropped unknown knob x=1``,
    ``filled y='a' from the baseline``); empty when it was valid as measured."""
    rule: Literal["copy", "mapped"] = "copy"
    """``copy``: the bank's config itself (the fields above say where it was measured).
    ``mapped``: not a bank config but this study's best under the bank transfer's prior
    (``OptimizerSettings.warm_start_rule``); ``source_study`` and ``similarity`` then name the
    study whose queued config this turn replaced, and nothing else is set (no trial measured it)."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (``from_dict`` inverts it)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["repairs"] = list(self.repairs)
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> WarmStartOrigin:
        """Inverse of ``to_dict``; unknown keys are ignored."""

        def text(k: str) -> str | None:
            return None if raw.get(k) is None else str(raw[k])

        return cls(
            source_study=text("source_study"),
            trial_id=text("trial_id"),
            relative_step_time=_float(raw.get("relative_step_time")),
            similarity=_float(raw.get("similarity")),
            hardware_fingerprint=text("hardware_fingerprint"),
            repairs=tuple(str(m) for m in raw.get("repairs") or ()),
            rule="mapped" if raw.get("rule") == "mapped" else "copy",
        )


@dataclass(frozen=True)
class AskInfo:
    """Provenance of one asked config. Predictions are the models' at the time of the ask (None
    where there is none: the baseline and warm-start configs are asked without scoring, and a
    step-time prediction needs a step-time model)."""

    config: dict[str, Any]
    """The full config asked."""
    phase: Phase
    """Why it was asked (a ``Phase``; equal to its string)."""
    ask_index: int
    """Which ``ask()`` call asked it (0 for the first; a batch shares one index)."""
    repair_of: dict[str, Any] | None = None
    """For a repair: the candidate it repairs (fast, but predicted not to fit)."""
    repair_moves: tuple[str, ...] = ()
    """For a repair: the memory-saving moves from that candidate, e.g. ``"zero_stage: 1 -> 2"``."""
    original_p_fit: float | None = None
    """For a repair: the repaired candidate's P(peak <= capacity)."""
    paired: str | None = None
    """For a repair: ``before_pick`` (a repair from outside a sampled pool beat the pool's best),
    ``after_pick`` (the chosen candidate was unlikely to fit) or ``warm_start`` (a warm-start config,
    measured elsewhere, was unlikely to fit here)."""
    predicted_step_time_s: float | None = None
    """exp of the posterior mean of log step time, seconds."""
    step_time_sd_log: float | None = None
    """Posterior sd of log step time (log seconds)."""
    p_fit: float | None = None
    """P(peak memory <= capacity)."""
    predicted_peak_memory_bytes: float | None = None
    """exp of the posterior mean of log peak memory, bytes per device (None without a memory model
    or an analytic prior)."""
    p_ok: float | None = None
    """P(no non-OOM failure), from the feasibility model."""
    log_acquisition: float | None = None
    """The constrained log expected improvement the config scored (higher is better)."""
    warm_start_origin: WarmStartOrigin | None = None
    """For a warm-start config: where it was measured before (None if the caller gave no origin)."""
    transfer_weights: tuple[float, float] | None = None
    """The bank transfer's weights in the models when the config was asked, each in [0, 1]:
    (prior-coefficient centre, transferred residual) (``search.transfer``; None: no transfer prior)."""

    def __post_init__(self) -> None:
        """Hold the phase as a ``Phase`` (it may be given as its string)."""
        object.__setattr__(self, "phase", _phase(self.phase))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict with every field (``from_dict`` inverts it)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["config"] = dict(self.config)
        out["phase"] = self.phase.value
        out["repair_of"] = None if self.repair_of is None else dict(self.repair_of)
        out["repair_moves"] = list(self.repair_moves)
        out["warm_start_origin"] = (
            None if self.warm_start_origin is None else self.warm_start_origin.to_dict()
        )
        out["transfer_weights"] = (
            None if self.transfer_weights is None else list(self.transfer_weights)
        )
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> AskInfo:
        """Inverse of ``to_dict``. Also reads dicts written before ``AskInfo`` (``prior`` for the
        warm-start origin, ``predicted_memory_bytes``); unknown keys are ignored."""
        if (
            not isinstance(raw, Mapping)
            or not isinstance(raw.get("config"), Mapping)
            or "phase" not in raw
        ):
            raise UserInputError(
                f"ask info: rule: needs 'config' (a mapping) and 'phase'; got {raw!r}."
            )
        raw = {_OLD_NAMES.get(k, k): v for k, v in raw.items()}
        origin = raw.get("warm_start_origin")
        repair_of = raw.get("repair_of")
        return cls(
            config=dict(raw["config"]),
            phase=_phase(raw["phase"]),
            ask_index=int(raw.get("ask_index") or 0),
            repair_of=None if repair_of is None else dict(repair_of),
            repair_moves=tuple(str(m) for m in raw.get("repair_moves") or ()),
            original_p_fit=_float(raw.get("original_p_fit")),
            paired=None if raw.get("paired") is None else str(raw["paired"]),
            predicted_step_time_s=_float(raw.get("predicted_step_time_s")),
            step_time_sd_log=_float(raw.get("step_time_sd_log")),
            p_fit=_float(raw.get("p_fit")),
            predicted_peak_memory_bytes=_float(raw.get("predicted_peak_memory_bytes")),
            p_ok=_float(raw.get("p_ok")),
            log_acquisition=_float(raw.get("log_acquisition")),
            warm_start_origin=WarmStartOrigin.from_dict(origin)
            if isinstance(origin, Mapping) and origin
            else None,
            transfer_weights=_weights(raw.get("transfer_weights")),
        )


def _phase(value: Any) -> Phase:
    """A saved phase string as a ``Phase`` (a ``UserInputError`` naming the known ones otherwise)."""
    if value in _OLD_PHASES:
        return _OLD_PHASES[value]
    try:
        return Phase(value)
    except ValueError:
        raise UserInputError(
            f"ask info: phase: rule: must be one of {list(PHASES)}; got {value!r}."
        ) from None


def _weights(value: Any) -> tuple[float, float] | None:
    """A saved ``transfer_weights`` pair (None when absent or malformed)."""
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        return None
    a, b = _float(value[0]), _float(value[1])
    return None if a is None or b is None else (a, b)


def _float(value: Any) -> float | None:
    """``value`` as a finite float (None for None, a non-finite value or one that is not a number)."""
    if value is None:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None
