"""One picker per phase of the ask schedule (``schedule.next_phase`` names the phase, a picker picks).

``Pickers`` holds what every picker uses (the space, the settings, the models, the candidate pool
and the random generator) and each method makes the picks of one phase, returning their
``AskInfo``: ``baseline``, ``warm_start``, ``design``, ``prior`` (``bo-prior``), ``replicate`` and
``bo`` (``bo``, ``bo-local`` or ``explore``, with memory-saver pairing: ``repair``); ``fill`` makes
an ask's model-based picks, each by the phase the schedule names. A ``Round`` carries the state of
one ask across its picks: the keys already taken (pending, or picked by this ask), the failed keys,
and whether the warm starts' fit was made.

Why one module: the pickers share one state (``Pickers``) and one candidate pool per ask, and a
picker hands off to another (a replicate to a local step, a pick to its repair) within one ``fill``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from infrarsi.errors import InfrarsiError
from infrarsi.search import acquisition, design, pairing
from infrarsi.search.ask_info import AskInfo, Phase, WarmStartOrigin
from infrarsi.search.candidates import CandidatePool
from infrarsi.search.encoding import Encoder
from infrarsi.search.history import History
from infrarsi.search.modelset import ModelSet
from infrarsi.search.schedule import Turn, next_phase
from infrarsi.search.settings import OptimizerSettings
from infrarsi.search.space import SearchSpace, knob_distance


class SearchExhausted(InfrarsiError):
    """Every config of the space has been told as a failure (nothing is left to propose)."""


@dataclass
class Round:
    """The state of one ask across its picks."""

    taken: set[str]
    """Keys of configs pending or already picked by this ask (never picked again)."""
    failed: set[str]
    """Keys of configs told as failures (never proposed again)."""
    warm_fitted: bool = False
    """Whether the models were fitted for the warm starts of this ask (once per ask)."""
    infos: list[AskInfo] = field(default_factory=list)
    """The picks of this ask so far, in order."""

    def add(self, info: AskInfo, space: SearchSpace) -> None:
        """Record a pick: its key is taken."""
        self.infos.append(info)
        self.taken.add(space.key(info.config))


class Pickers:
    """The per-phase pickers of one optimizer."""

    def __init__(
        self,
        space: SearchSpace,
        settings: OptimizerSettings,
        encoder: Encoder,
        models: ModelSet,
        pool: CandidatePool,
        rng: np.random.Generator,
        seed: int,
        memory_capacity: float,
        baseline: Mapping[str, Any] | None,
    ) -> None:
        self.space = space
        self.settings = settings
        """Design, pairing, batch and intensification settings."""
        self.encoder = encoder
        """Encodes the configs the design spreads away from."""
        self.models = models
        """The fitted models that score candidates."""
        self.pool = pool
        """The configs each pick scores."""
        self.rng = rng
        """The optimizer's random generator (design subsets, candidate samples)."""
        self.seed = seed
        """Seeds the batch acquisition's sampler (with the ask's index)."""
        self.memory_capacity = memory_capacity
        """Bytes per device (predicted peaks are reported in bytes)."""
        self.baseline_config = dict(baseline) if baseline is not None else space.default_config()
        """The baseline, or the space's default config when none was given."""

    # ------------------------------------------------------------ helpers
    def info(
        self,
        history: History,
        config: Mapping[str, Any],
        phase: Phase,
        scores: acquisition.Scores | None = None,
        i: int | None = None,
        *,
        repair_of: Mapping[str, Any] | None = None,
        repair_moves: Sequence[str] = (),
        original_p_fit: float | None = None,
        paired: str | None = None,
        warm_start_origin: WarmStartOrigin | None = None,
    ) -> AskInfo:
        """The ``AskInfo`` of ``config`` asked now, with the predictions at row ``i`` of ``scores``."""
        predictions: dict[str, float | None] = {}
        if scores is not None and i is not None:
            has_memory = self.models.memory.model is not None or self.models.has_prior
            predictions = {
                "predicted_step_time_s": _exp(scores.time_mean[i]),
                "step_time_sd_log": _finite(scores.time_sd[i]),
                "p_fit": _finite(scores.p_fit[i]),
                "predicted_peak_memory_bytes": self.memory_capacity
                * math.exp(float(scores.mem_mean[i]))
                if has_memory
                else None,
                "p_ok": _finite(scores.p_ok[i]),
                "log_acquisition": _finite(scores.log_score[i]),
            }
        transfer = self.models.features.transfer
        return AskInfo(
            config=dict(config),
            phase=phase,
            ask_index=history.n_asks,
            repair_of=None if repair_of is None else dict(repair_of),
            repair_moves=tuple(repair_moves),
            original_p_fit=original_p_fit,
            paired=paired,
            warm_start_origin=warm_start_origin,
            transfer_weights=None
            if transfer is None
            else (transfer.centre_weight, transfer.residual_weight),
            **predictions,
        )

    def scorer(
        self, history: History
    ) -> Callable[[Sequence[Mapping[str, Any]]], acquisition.Scores]:
        """``configs -> Scores`` under the current models (what ``pairing.best_repair`` calls)."""
        return lambda configs: self.models.scores(history, configs)

    def candidates(
        self, history: History, exclude: set[str]
    ) -> tuple[list[dict[str, Any]], torch.Tensor]:
        """Allowed candidates (keys not in ``exclude``) and their model inputs (``candidates``)."""
        return self.pool.candidates(exclude, self.models.ok(history), self.rng)

    def baseline_available(
        self, history: History, rnd: Round, configs: Sequence[Mapping[str, Any]]
    ) -> bool:
        """Nothing told or taken, and the baseline is valid and among ``configs``."""
        if history.observations or rnd.taken or self.space.violated(self.baseline_config):
            return False
        key = self.space.key(self.baseline_config)
        return any(self.space.key(c) == key for c in configs)

    def fill(self, history: History, rnd: Round, k: int, turn: Callable[[bool, int], Turn]) -> None:
        """Fill ``rnd`` to ``k`` picks after its warm starts, each by the phase ``next_phase`` names.

        ``turn(baseline_available, model_picks)`` states the schedule's view before a pick. Raises
        ``SearchExhausted`` when no config is left and this call picked none.
        """
        start, s = len(rnd.infos), self.settings
        failed, ok_told = self.models.excluded(history)
        while len(rnd.infos) < k:
            configs, X = self.candidates(history, failed | ok_told | rnd.taken)
            if not configs:  # every config tried once: allow ok ones again
                configs, X = self.candidates(history, failed | rnd.taken)
                if not configs:
                    if len(rnd.infos) > start:
                        break
                    raise SearchExhausted(
                        f"search space '{self.space.name}': every valid config has been tried "
                        "and failed or is pending."
                    )
            phase = next_phase(
                turn(self.baseline_available(history, rnd, configs), len(rnd.infos) - start)
            )
            if phase in (Phase.BASELINE, Phase.DESIGN, Phase.BO_PRIOR):
                info = (
                    self.baseline(history)
                    if phase == Phase.BASELINE
                    else self.design(history, rnd, configs, X)
                    if phase == Phase.DESIGN
                    else self.prior(history, configs, X)
                )
                rnd.add(info, self.space)
                continue
            if (
                ok_told
                and self.models.memory.model is not None
                and len(configs) <= s.repeat_check_max
            ):
                sc = self.models.scores(history, configs, X)
                if (
                    float(np.max(sc.p_fit * sc.p_ok)) < s.repeat_below_p
                ):  # only likely failures are left
                    configs, X = self.candidates(history, failed | rnd.taken)
            if phase == Phase.REPLICATE:
                replicate = self.replicate(history, rnd)
                if replicate is not None:
                    rnd.add(replicate, self.space)
                    break
                phase = Phase.BO_LOCAL
            for info in self.bo(history, rnd, configs, X, k - len(rnd.infos), phase):
                rnd.add(info, self.space)

    def warm_starts(self, history: History, rnd: Round, k: int, turn: Callable[[], Turn]) -> None:
        """Add queued warm starts to ``rnd`` while it has fewer than ``k`` picks and the schedule
        (``turn()``, read before each) names ``Phase.WARM_START``."""
        while len(rnd.infos) < k and next_phase(turn()) == Phase.WARM_START:
            info = self.warm_start(history, rnd)
            if info is not None:
                rnd.add(info, self.space)

    def baseline_due(self, history: History) -> bool:
        """Nothing is told or pending and the baseline is a valid config."""
        return (
            not history.observations
            and not history.pending
            and not self.space.violated(self.baseline_config)
        )

    # ------------------------------------------------------------ pickers
    def baseline(self, history: History) -> AskInfo:
        """The baseline, asked first (``Phase.BASELINE``)."""
        return self.info(history, self.baseline_config, Phase.BASELINE)

    def warm_start(self, history: History, rnd: Round) -> AskInfo | None:
        """The next queued warm-start config (``Phase.WARM_START``), or None when it is skipped;
        on a mapped turn (``mapped_turn``) the mapped config instead.

        A config already told or taken is skipped. With memory knowledge (the analytic prior, or a
        memory model), a config this study's model expects not to fit (P(fit) < ``pairing_trigger``:
        measured on a larger card or for a smaller model) is asked as its best memory-saving repair
        instead (``repair_of`` the bank's config), or skipped when none is expected to fit.
        """
        if self.mapped_turn(history, rnd):  # it takes the turn of the bank's last queued config
            return self.mapped_warm_start(history, rnd, history.warm_queue.pop()[1])
        spread = self.settings.warm_start_pool > 1
        cfg, origin = history.warm_queue.pop(self.farthest_queued(history, rnd) if spread else 0)
        if self.bank_dropped():
            return None
        if self.space.key(cfg) in history.seen_keys() | rnd.taken:
            return None
        self._fit_for_warm_starts(history, rnd)
        if not self.models.has_prior and self.models.memory.model is None:
            return self.info(history, cfg, Phase.WARM_START, warm_start_origin=origin)
        scores = self.models.scores(history, [cfg])
        p_fit = float(scores.p_fit[0])
        s = self.settings
        if not s.pairing or p_fit >= s.pairing_trigger:
            return self.info(history, cfg, Phase.WARM_START, scores, 0, warm_start_origin=origin)
        rep = pairing.best_repair(
            self.space,
            cfg,
            self.scorer(history),
            excluded=history.seen_keys() | rnd.taken | rnd.failed,
            max_steps=s.repair_max_steps,
            target=s.pairing_target,
        )
        if rep is None:
            return None
        r, rep_scores, j = rep
        return self.info(
            history,
            r.config,
            Phase.WARM_START,
            rep_scores,
            j,
            repair_of=cfg,
            repair_moves=r.moves,
            original_p_fit=p_fit,
            paired="warm_start",
            warm_start_origin=origin,
        )

    def farthest_queued(self, history: History, rnd: Round) -> int:
        """Index in ``history.warm_queue`` of the config farthest from the warm starts this study
        has asked, mapped or copied (the fewest knob values in common with its nearest one; ties:
        the earlier, i.e. the bank's better one; 0 before any): copies hedge the warm starts
        already asked instead of repeating their region."""
        asked = [
            i.config
            for i in (*history.ask_infos.values(), *rnd.infos)
            if i.phase == Phase.WARM_START
        ]
        names = [k.name for k in self.space.knobs]

        def nearest(cfg: dict[str, Any]) -> int:
            return min((knob_distance(cfg, a, names) for a in asked), default=len(names))

        return max(
            range(len(history.warm_queue)), key=lambda j: (nearest(history.warm_queue[j][0]), -j)
        )

    def _fit_for_warm_starts(self, history: History, rnd: Round) -> None:
        """Fit the models once per ask: the memory model (or the prior) judges every queued config."""
        if not rnd.warm_fitted and (self.models.has_prior or history.observations):
            self.models.fit(history)
            rnd.warm_fitted = True

    def mapped_turn(self, history: History, rnd: Round) -> bool:
        """Whether this warm-start turn asks the mapped config (``warm_start_rule``): a bank
        transfer holds weight under an analytic prior, and the rule is ``mapped``, or
        ``alternate`` with an even number of warm starts asked so far."""
        rule = self.settings.warm_start_rule
        transfer = self.models.features.transfer
        if rule == "copy" or not self.models.has_prior or transfer is None:
            return False
        self._fit_for_warm_starts(history, rnd)  # the fit re-chooses the transfer's weights
        if not transfer.active:
            return False
        if rule == "mapped":
            return True
        asked = [*history.ask_infos.values(), *rnd.infos]
        if rule == "portfolio":
            return not any(i.phase == Phase.WARM_START for i in asked)
        asked = [*history.ask_infos.values(), *rnd.infos]
        return sum(i.phase == Phase.WARM_START for i in asked) % 2 == 0

    def bank_dropped(self) -> bool:
        """Whether a rule other than ``copy`` holds and this study's trials ranked the bank
        transfer down to weight 0: its remaining warm-start turns are dropped, not copied (the
        bank that lost its weight is the one whose configs would be copied)."""
        transfer = self.models.features.transfer
        return (
            self.settings.warm_start_rule != "copy"
            and self.models.has_prior
            and transfer is not None
            and not transfer.active
        )

    def mapped_warm_start(
        self, history: History, rnd: Round, origin: WarmStartOrigin | None
    ) -> AskInfo | None:
        """This study's best untried config under the bank transfer's prior (``Phase.WARM_START``,
        origin ``rule="mapped"``): constrained log-EI of the prior column, which holds the
        sources' coefficients on this study's formulas plus their residual (``prior``'s scoring).
        None when every config is taken."""
        self._fit_for_warm_starts(history, rnd)
        configs, X = self.candidates(history, history.seen_keys() | rnd.taken | rnd.failed)
        if not configs:
            return None
        scores = self.models.prior_scores(history, configs, X, self.baseline_config)
        i = int(np.argmax(scores.log_score))
        mapped = WarmStartOrigin(
            source_study=None if origin is None else origin.source_study,
            similarity=None if origin is None else origin.similarity,
            rule="mapped",
        )
        return self.info(history, configs[i], Phase.WARM_START, scores, i, warm_start_origin=mapped)

    def design(
        self, history: History, rnd: Round, configs: list[dict[str, Any]], X: torch.Tensor
    ) -> AskInfo:
        """A space-filling design point (``Phase.DESIGN``), weighted by P(fit) and P(ok)."""
        pool_size = self.settings.design_pool
        if len(configs) > pool_size:
            sel = self.rng.choice(len(configs), size=pool_size, replace=False)
            configs, X = [configs[i] for i in sel.tolist()], X[torch.as_tensor(sel)]
        seen = [o.config for o in history.observations] + [
            history.config_of(t) for t in sorted(rnd.taken)
        ]
        existing = self.encoder.encode(seen)
        scores = self.models.scores(history, configs, X)
        weights = scores.p_fit * scores.p_ok
        features = X[:, : self.models.columns.n_features]
        if self.settings.design_rule == "maximin":
            i = design.maximin_pick(features, existing, self.rng, weights=weights)
        else:
            i = design.coverage_pick(
                configs,
                features,
                seen,
                existing,
                self.space.names,
                self.rng,
                weights=weights,
                distance_weight=self.settings.design_distance_weight,
            )
        return self.info(history, configs[i], Phase.DESIGN, scores, i)

    def prior(self, history: History, configs: list[dict[str, Any]], X: torch.Tensor) -> AskInfo:
        """The best config by constrained log-EI under the analytic prior alone (``Phase.BO_PRIOR``)."""
        scores = self.models.prior_scores(history, configs, X, self.baseline_config)
        i = int(np.argmax(scores.log_score))
        return self.info(history, configs[i], Phase.BO_PRIOR, scores, i)

    def replicate(self, history: History, rnd: Round) -> AskInfo | None:
        """A re-measurement of the incumbent (``Phase.REPLICATE``) when ``intensify`` is on and it
        has exactly one trusted measurement; None otherwise, or when it failed or is taken (a
        failed replicate is never asked again; a pending one is already re-measuring it), or when
        the runner-up is less likely than ``replicate_min_p`` to be faster."""
        inc = self.models.incumbent(history) if self.settings.intensify else None
        if inc is None:
            return None
        key = self.space.key(inc)
        if (
            sum(self.space.key(o.config) == key for o in self.models.ok(history)) != 1
            or key in rnd.failed | rnd.taken
        ):
            return None
        if self.models.runner_up_p(history, inc) < self.settings.replicate_min_p:
            return None  # the incumbent is clearly ahead: a replicate would not change the decision
        return self.info(history, inc, Phase.REPLICATE, self.models.scores(history, [inc]), 0)

    def bo(
        self,
        history: History,
        rnd: Round,
        configs: list[dict[str, Any]],
        X: torch.Tensor,
        q: int,
        phase: Phase,
    ) -> list[AskInfo]:
        """``q`` picks of the constrained acquisition (``Phase.BO``): near the incumbent on a local
        turn (``Phase.BO_LOCAL``, when it has neighbours among ``configs``); on an exploring turn
        (``Phase.EXPLORE``, else local) among its neighbours holding a value never tried near it,
        among configs far from every config tried, or a greedy batch's last pick
        (``explore_rule``). A pick unlikely to fit
        is asked as its memory-saving repair (``Phase.REPAIR``, ``pairing``)."""
        models, s = self.models, self.settings
        scores = models.scores(history, configs, X)
        ranked, n_top = scores.log_score, s.batch_choices
        allowed = None  # a local or exploring turn's mask over ``configs``
        batch_last = phase == Phase.EXPLORE and s.explore_rule == "batch"
        if phase == Phase.EXPLORE and not batch_last:
            tried = [o.config for o in history.observations] + [
                history.config_of(t) for t in sorted(rnd.taken)
            ]
            allowed = (
                self.pool.far(configs, tried)
                if s.explore_rule == "far"
                else self.pool.untried_near(configs, models.incumbent(history), tried)
            )
            if not allowed.any():
                phase, allowed = Phase.BO_LOCAL, None
        if phase == Phase.BO_LOCAL:
            allowed = self.pool.near(configs, models.incumbent(history))
            if not allowed.any():
                phase, allowed = Phase.BO, None
        if allowed is not None:
            ranked = np.where(allowed, scores.log_score, -np.inf)
            n_top = min(n_top, int(allowed.sum()))
        ok_keys = models.excluded(history)[1]
        if batch_last:  # the last of a greedy batch: the pick the others' fantasies push away
            picks = self.batch_picks(history, rnd, X, ranked, n_top, s.explore_batch)[-1:]
        elif q == 1 and not rnd.taken:
            picks = [int(np.argmax(ranked))]
            if s.pairing and phase == Phase.BO and not self.pool.scores_every_config:
                paired = self.pair_before_pick(
                    history, configs, scores, picks[0], rnd.failed | rnd.taken | ok_keys
                )
                if paired is not None:
                    return [paired]
        else:
            picks = self.batch_picks(history, rnd, X, ranked, n_top, q)
        out: list[AskInfo] = []
        used = set(rnd.taken)
        for i in picks:
            info = self.info(history, configs[i], phase, scores, i)
            if (
                s.pairing
                and scores.p_fit[i] < s.pairing_trigger
                and models.memory.model is not None
            ):
                rep = pairing.best_repair(
                    self.space,
                    configs[i],
                    self.scorer(history),
                    excluded=rnd.failed | used | models.excluded(history)[1],
                    max_steps=s.repair_max_steps,
                    target=s.pairing_target,
                )
                if rep is not None:
                    r, rep_scores, j = rep
                    info = self.info(
                        history,
                        r.config,
                        Phase.REPAIR,
                        rep_scores,
                        j,
                        repair_of=configs[i],
                        repair_moves=r.moves,
                        original_p_fit=float(scores.p_fit[i]),
                        paired="after_pick",
                    )
            used.add(self.space.key(info.config))
            out.append(info)
        return out

    def batch_picks(
        self,
        history: History,
        rnd: Round,
        X: torch.Tensor,
        ranked: np.ndarray,
        n_top: int,
        q: int,
    ) -> list[int]:
        """Rows of ``q`` greedy batch picks (qLogNEI, the pending configs fantasised) among the
        ``n_top`` best by ``ranked``, in pick order."""
        models = self.models
        top = np.argsort(-ranked, kind="stable")[:n_top]
        X_base = models.inputs([o.config for o in models.ok(history)])
        # sorted: a set's order of strings changes with PYTHONHASHSEED, and X_pending's row order moves the picks
        pend = [history.config_of(t) for t in sorted(rnd.taken)]
        X_pend = models.inputs(pend) if pend else None
        sub = acquisition.select_batch(
            models.time.model,
            models.memory.model,
            X[torch.as_tensor(top)],
            q,
            X_base,
            X_pend,
            seed=self.seed * 7919 + history.n_asks,
        )
        return [int(top[j]) for j in sub]

    def pair_before_pick(
        self,
        history: History,
        configs: list[dict[str, Any]],
        scores: acquisition.Scores,
        pick: int,
        excluded: set[str],
    ) -> AskInfo | None:
        """Pairing before the pick (``pairing``): the best repairs of the sample's fast-but-too-big
        candidates that are not in the sample, if one scores above the sample's best (``pick``)."""
        if self.models.memory.model is None:
            return None
        s = self.settings
        sources = pairing.fast_but_too_big(
            scores.log_score,
            scores.p_fit,
            sources=s.pair_sources,
            scan=s.pair_source_scan,
            trigger=s.pairing_trigger,
        )
        if not sources:
            return None
        in_pool = {self.space.key(c) for c in configs}
        found: dict[str, tuple[pairing.Repair, int]] = {}
        for i in sources:
            rep = pairing.best_repair(
                self.space,
                configs[i],
                self.scorer(history),
                excluded=excluded | in_pool,
                max_steps=s.repair_max_steps,
                target=s.pairing_target,
            )
            if rep is not None:
                found.setdefault(self.space.key(rep[0].config), (rep[0], i))
        if not found:
            return None
        reps = list(found.values())
        rep_scores = self.models.scores(history, [r.config for r, _ in reps])
        j = int(np.argmax(rep_scores.log_score))
        if not float(rep_scores.log_score[j]) > float(scores.log_score[pick]):
            return None
        r, src = reps[j]
        return self.info(
            history,
            r.config,
            Phase.REPAIR,
            rep_scores,
            j,
            repair_of=configs[src],
            repair_moves=r.moves,
            original_p_fit=float(scores.p_fit[src]),
            paired="before_pick",
        )


def _exp(x: float) -> float | None:
    """``exp(x)``, None when ``x`` is not finite (no prediction yet)."""
    return None if not math.isfinite(float(x)) else math.exp(float(x))


def _finite(x: float) -> float | None:
    """``x`` as a float, None when it is not finite (no prediction yet)."""
    return float(x) if math.isfinite(float(x)) else None
