"""``Optimizer``: ask/tell Bayesian search over a ``SearchSpace`` with a censored memory model.

::

    opt = Optimizer(space, memory_capacity=80e9, seed=0, baseline={...})
    cfg = opt.ask()                     # dict; opt.last_ask_info (an AskInfo) says why
    opt.tell(cfg, Outcome(status="ok", step_time=1.9, peak_memory=6.1e10))
    opt.best()                          # posterior-mean best among observed ok configs

Phases: the baseline, then the warm-start configs given as ``initial_configs`` (in order, each
once), then a space-filling design (memory-aware once a memory model exists), then constrained
log-EI (``acquisition``) with memory-saver pairing (``pairing``). A config told
oom/failed/timeout/nan/invariant_violation is never proposed again; a config told ok is proposed
again once every other config has been tried or is predicted to fail (``repeat_below_p``), and
as a replicate while it is the incumbent with a single trusted measurement (``intensify``).
A single ``ask()`` keeps that schedule (local turns, the replicate) while other trials are
pending; with pending configs its model-based pick is qLogNEI with them as ``X_pending``. With
an analytic prior, an ask with trials pending before the step-time model exists gives one design
turn to the prior's own pick (``bo-prior``), and takes the prior's pick instead of more design
points once the design is asked but too few results are in (``_prior_turn``).
Slow outliers among the step times (stragglers) are left out of the step-time model
(``models/outliers``); a config measured only as an outlier may be proposed again.

Every tunable is a field of ``OptimizerSettings`` (``settings``). The optimizer holds its
collaborators and hands them what they need: the model inputs and the analytic prior's
coefficient fits (``priors.features.PriorFeatures``), the candidate pool
(``candidates.CandidatePool``), the models (``modelset.ModelSet``, ``models.feasibility``);
``persistence`` reads and writes its saved state. A bank transfer prior (``transfer``) enters the
models through ``PriorFeatures``.
"""

from __future__ import annotations

import contextlib
import enum
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from infrarsi.errors import InfrarsiError, SearchSpaceError, UserInputError
from infrarsi.search import acquisition, design, pairing, persistence
from infrarsi.search.ask_info import AskInfo, WarmStartOrigin
from infrarsi.search.candidates import CandidatePool
from infrarsi.search.encoding import Encoder
from infrarsi.search.models import outliers
from infrarsi.search.models.feasibility import FeasibilityModel
from infrarsi.search.modelset import ModelSet
from infrarsi.search.outcome import FAILURE_STATUSES, Observation, Outcome
from infrarsi.search.priors.features import PriorFeatures
from infrarsi.search.priors.mean import PriorMean
from infrarsi.search.settings import OptimizerSettings
from infrarsi.search.space import SearchSpace
from infrarsi.search.transfer import TransferModel, TransferPrior


class _Unset(enum.Enum):
    UNSET = "unset"


_UNSET: Literal[_Unset.UNSET] = _Unset.UNSET
"""An option not given to the constructor: its value comes from ``settings``."""


class _PriorOnly:
    """A predictor that returns an input column (the prior's log value) with a fixed variance."""

    def __init__(self, column: int, sd: float) -> None:
        self.column, self.var = column, sd**2

    def __call__(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return X[:, self.column], torch.full((X.shape[0],), self.var, dtype=torch.float64)


class SearchExhausted(InfrarsiError):
    """Every config of the space has been told as a failure (nothing is left to propose)."""


@contextlib.contextmanager
def _threads(n: int | None) -> Iterator[None]:
    if n is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


class Optimizer:
    """Ask/tell optimizer minimising step time under ``peak memory <= memory_capacity`` (bytes per device).

    Args:
        space: the search space.
        memory_capacity: bytes per device.
        seed: seeds every random choice (same seed and same tells: same asks).
        baseline: the first config asked (None: the space's default config, when it is valid).
        settings: every tunable (``OptimizerSettings``; None: the defaults).
        prior: analytic prior mean of both models (``priors.mean.PriorMean``), or None.
        initial_configs: warm-start configs (e.g. good configs of an earlier study on other
            hardware), asked right after the baseline, in order, each once. Configs not valid in
            ``space``, repeated, or already told or pending when their turn comes are skipped.
        initial_origins: where each initial config was measured before (same order; may be
            shorter, and an entry may be None), recorded in its ``AskInfo.warm_start_origin``.
        transfer: similar studies' trials from the experience bank, used inside the models
            (``transfer``: prior coefficients and a rank-weighted residual mean); needs ``prior``
            (ignored without one). None or no sources: the optimizer is exactly the cold one.
        censoring, pairing, n_init, candidate_cap, num_threads, local_every, intensify: the
            ``OptimizerSettings`` fields of the same names; given here, they override ``settings``.
    """

    def __init__(self, space: SearchSpace, memory_capacity: float, seed: int = 0,
                 baseline: Mapping[str, Any] | None = None, *, settings: OptimizerSettings | None = None,
                 prior: PriorMean | None = None, initial_configs: Sequence[Mapping[str, Any]] = (),
                 initial_origins: Sequence[WarmStartOrigin | None] = (),
                 transfer: TransferPrior | None = None,
                 censoring: bool | _Unset = _UNSET, pairing: bool | _Unset = _UNSET,
                 n_init: int | _Unset | None = _UNSET, candidate_cap: int | _Unset = _UNSET,
                 num_threads: int | _Unset | None = _UNSET, local_every: int | _Unset = _UNSET,
                 intensify: bool | _Unset = _UNSET) -> None:
        if not (isinstance(memory_capacity, (int, float)) and math.isfinite(memory_capacity) and memory_capacity > 0):
            raise UserInputError(f"Optimizer: memory_capacity: rule: must be bytes per device > 0; got {memory_capacity!r}.")
        options: dict[str, Any] = {
            "censoring": censoring, "pairing": pairing, "n_init": n_init, "candidate_cap": candidate_cap,
            "num_threads": num_threads, "local_every": local_every, "intensify": intensify}
        self.settings = replace(settings or OptimizerSettings(),
                                **{k: v for k, v in options.items() if v is not _UNSET})
        """Every tunable of this optimizer (saved with its state)."""
        self.space = space
        self.memory_capacity = float(memory_capacity)
        self.seed = int(seed)
        self.baseline = None if baseline is None else space.validate(baseline, where="baseline")
        self.encoder = Encoder(space)
        self.n_init = design.default_n_init(self.encoder.dim) if self.settings.n_init is None else self.settings.n_init
        """Distinct configs in the initial design (``settings.n_init`` or its default for this space)."""
        self.observations: list[Observation] = []
        self.pending: dict[str, dict[str, Any]] = {}
        """Configs asked and not yet told, by ``space.key``."""
        self.last_ask_info: AskInfo | list[AskInfo] | None = None
        """Provenance of the last ask: an ``AskInfo`` for ``ask()``, a list of them for ``ask(n)``."""
        self.ask_infos: dict[str, AskInfo] = {}
        """Provenance of every config asked so far, by ``space.key(config)``."""
        self.rng = np.random.default_rng(self.seed)
        self.n_asks = 0
        self.feasibility = FeasibilityModel(settings=self.settings)
        self.prior = prior
        """Analytic prior mean of both models (``infrarsi.search.priors.mean``), or None."""
        self.transfer: TransferModel | None = None
        """The bank transfer inside the models (``transfer``), or None."""
        if transfer is not None and transfer.sources and prior is not None and self.settings.transfer:
            self.transfer = TransferModel(transfer, self.encoder, prior, self.settings)
        self.prior_features = PriorFeatures(space, self.encoder, prior, self.memory_capacity, self.settings,
                                            transfer=self.transfer)
        """Model inputs of configs and the prior's fitted coefficients."""
        self.pool = CandidatePool(space, self.prior_features, self.baseline, self.settings)
        """The configs each ask scores."""
        self.time_outliers: set[int] = set()
        """Indices into ``observations`` of ok step times left out as slow outliers (stragglers)."""
        self.time_trim_key: str | None = None
        """Fingerprint of the ok step times ``time_outliers`` was computed on."""
        idx, signs = [], []
        col = 0
        for b in self.encoder.blocks:
            if b.knob.memory != "neutral" and b.width == 1:
                idx.append(col)
                signs.append(1.0 if b.knob.memory == "hungry" else -1.0)
            col += b.width
        self.models = ModelSet(mean_indices=idx, mean_signs=signs,
                               prior_dim=None if prior is None else self.encoder.dim, settings=self.settings)
        self.initial_queue: list[tuple[dict[str, Any], WarmStartOrigin | None]] = []
        """Warm-start configs not yet asked, first first, with where each was measured before."""
        self._queue_initial(initial_configs, initial_origins)

    def _queue_initial(self, configs: Sequence[Mapping[str, Any]], origins: Sequence[WarmStartOrigin | None]) -> None:
        if len(origins) > len(configs):
            raise UserInputError(f"Optimizer: initial_origins: rule: at most one per initial config "
                                 f"({len(configs)}); got {len(origins)}.")
        queued = {self.space.key(c) for c, _ in self.initial_queue}
        for i, raw in enumerate(configs):
            try:
                cfg = self.space.validate(raw, where=f"initial_configs[{i}]")
            except SearchSpaceError:
                continue  # a config of another version of the space: skipped
            key = self.space.key(cfg)
            if key not in queued:
                queued.add(key)
                self.initial_queue.append((cfg, origins[i] if i < len(origins) else None))

    # ------------------------------------------------------------------ tell
    def tell(self, config: Mapping[str, Any], outcome: Outcome | Mapping[str, Any]) -> None:
        """Record the outcome of a trial of ``config``."""
        if not isinstance(outcome, Outcome):
            outcome = Outcome.from_dict(outcome)
        cfg = self.space.validate(config, where="tell(config)")
        self.pending.pop(self.space.key(cfg), None)
        self.observations.append(Observation(cfg, outcome))
        if outcome.status in FAILURE_STATUSES:
            self.feasibility.add(cfg, failed=True, weight=self.settings.failure_weight[outcome.status])
        else:
            self.feasibility.add(cfg, failed=False, completed=outcome.status == "ok")

    # -------------------------------------------------------------- helpers
    def _excluded(self) -> tuple[set[str], set[str]]:
        failed = {self.space.key(o.config) for o in self.observations if o.outcome.status != "ok"}
        ok = {self.space.key(o.config) for o in self._ok()}  # a config measured only as a straggler may come again
        return failed, ok - failed

    def _ok(self) -> list[Observation]:
        """The ok observations the step-time model learns from (trimmed stragglers left out)."""
        return [o for i, o in enumerate(self.observations) if o.outcome.status == "ok" and i not in self.time_outliers]

    def _X(self, configs: Sequence[Mapping[str, Any]]) -> torch.Tensor:
        return self.prior_features.inputs(configs)

    def _candidates(self, exclude: set[str]) -> tuple[list[dict[str, Any]], torch.Tensor]:
        return self.pool.candidates(exclude, self._ok(), self.rng)

    def _fit_time_on(self, ok: list[Observation]) -> Any:
        """Fit the prior's time coefficients and the step-time GP on ``ok``; the GP (or None)."""
        self.prior_features.fit_time([o.config for o in ok], [o.outcome.step_time for o in ok])  # type: ignore[misc]
        if not ok:
            self.models.time.model = self.models.time.pred = None
            return None
        X = self._X([o.config for o in ok])
        y = torch.tensor([math.log(o.outcome.step_time) for o in ok], dtype=torch.float64)  # type: ignore[arg-type]
        self.models.update_time(X, y)
        return self.models.time.model

    def _fit(self) -> None:
        rows, ys, cens = self._memory_rows()
        self.prior_features.fit_memory(rows, ys, cens)  # first: the memory column is part of every input
        idx = [i for i, o in enumerate(self.observations) if o.outcome.status == "ok"]
        key = repr([(self.space.key(self.observations[i].config), self.observations[i].outcome.step_time) for i in idx])
        if key != self.time_trim_key:  # new step times: look for stragglers again (models/outliers.py)
            y = torch.tensor([math.log(self.observations[i].outcome.step_time) for i in idx],  # type: ignore[arg-type]
                             dtype=torch.float64)
            drop = outliers.trim_slow_outliers(
                y, lambda keep: self._fit_time_on([self.observations[idx[j]] for j in keep]),
                lambda js: self._X([self.observations[idx[j]].config for j in js]), self.settings)
            self.time_outliers = {idx[j] for j in drop}
            self.time_trim_key = key
        self._fit_time_on(self._ok())
        if len(rows) >= 2:
            self.models.update_memory(self._X(rows), torch.tensor(ys, dtype=torch.float64),
                                      torch.tensor(cens, dtype=torch.bool))
        else:
            self.models.memory.model = self.models.memory.pred = None

    def _memory_rows(self) -> tuple[list[dict[str, Any]], list[float], list[bool]]:
        """Configs, log(peak / capacity) (the log lower bound for OOMs) and the censoring mask."""
        rows: list[dict[str, Any]] = []
        ys: list[float] = []
        cens: list[bool] = []
        for o in self.observations:
            if o.outcome.status == "ok" and o.outcome.peak_memory is not None:
                rows.append(o.config)
                ys.append(math.log(o.outcome.peak_memory / self.memory_capacity))
                cens.append(False)
            elif o.outcome.status == "oom" and self.settings.censoring:
                lb = max(o.outcome.peak_memory or 0.0, self.memory_capacity)
                rows.append(o.config)
                ys.append(math.log(lb / self.memory_capacity))
                cens.append(True)
        return rows, ys, cens

    def _best_log_time(self) -> float | None:
        ok = self._ok()
        if not ok or self.models.time.pred is None:
            return None
        mean, _ = acquisition.predict_time(self.models.time.pred, self._X([o.config for o in ok]))
        return float(mean.min())

    def _scores(self, configs: Sequence[Mapping[str, Any]], X: torch.Tensor | None = None) -> acquisition.Scores:
        X = self._X(configs) if X is None else X
        mem = self.models.memory
        noise = float(mem.model.likelihood.noise_sd.detach()) if mem.model is not None else 0.0
        mem_pred = mem.pred
        if mem_pred is None and self.prior is not None:  # no memory model yet: the prior alone
            mem_pred = _PriorOnly(self.encoder.dim + 1, self.settings.prior_only_memory_sd)
        return acquisition.analytic_scores(self.models.time.pred, mem_pred, noise, X, self._best_log_time(),
                                           self.feasibility.p_ok(configs), sd_scale=self.settings.acquisition_sd_scale)

    def _ask_info(self, config: Mapping[str, Any], phase: str, scores: acquisition.Scores | None = None,
                  i: int | None = None, *, repair_of: Mapping[str, Any] | None = None,
                  repair_moves: Sequence[str] = (), original_p_fit: float | None = None, paired: str | None = None,
                  warm_start_origin: WarmStartOrigin | None = None) -> AskInfo:
        """The ``AskInfo`` of ``config`` asked now, with the predictions at row ``i`` of ``scores``."""
        predictions: dict[str, float | None] = {}
        if scores is not None and i is not None:
            has_memory = self.models.memory.model is not None or self.prior is not None
            predictions = {
                "predicted_step_time_s": _exp(scores.time_mean[i]), "step_time_sd_log": _finite(scores.time_sd[i]),
                "p_fit": _finite(scores.p_fit[i]),
                "predicted_peak_memory_bytes": self.memory_capacity * math.exp(float(scores.mem_mean[i]))
                if has_memory else None,
                "p_ok": _finite(scores.p_ok[i]), "log_acquisition": _finite(scores.log_score[i])}
        return AskInfo(config=dict(config), phase=phase, ask_index=self.n_asks,
                       repair_of=None if repair_of is None else dict(repair_of), repair_moves=tuple(repair_moves),
                       original_p_fit=original_p_fit, paired=paired, warm_start_origin=warm_start_origin,
                       transfer_weights=None if self.transfer is None else
                       (self.transfer.centre_weight, self.transfer.residual_weight), **predictions)

    # ------------------------------------------------------------------- ask
    def ask(self, n: int | None = None) -> dict[str, Any] | list[dict[str, Any]]:
        """One config (``n`` None) or a list of ``n`` distinct configs, all valid and not yet failed."""
        k = 1 if n is None else int(n)
        if k < 1:
            raise UserInputError(f"ask(n): rule: n must be >= 1; got {n!r}.")
        with _threads(self.settings.num_threads):
            torch.manual_seed(self.seed * 100_003 + self.n_asks)
            infos = self._warm_start_picks(k)
        for info in infos:
            self.pending[self.space.key(info.config)] = dict(info.config)
        if len(infos) < k:
            with _threads(self.settings.num_threads):
                torch.manual_seed(self.seed * 100_003 + self.n_asks)
                self._fit()
                try:
                    infos += self._ask_batch(k - len(infos))
                except SearchExhausted:
                    if not infos:
                        raise
        for info in infos:
            key = self.space.key(info.config)
            self.pending[key] = dict(info.config)
            self.ask_infos[key] = info
        self.n_asks += 1
        self.last_ask_info = infos[0] if n is None else infos
        configs = [dict(i.config) for i in infos]
        return configs[0] if n is None else configs

    def add_pending(self, config: Mapping[str, Any], phase: str = "proposal") -> dict[str, Any]:
        """Record ``config`` (from outside the optimizer: a proposal) as in flight, so later asks
        treat it as pending; returns the validated full config. Tell its outcome as usual."""
        full = dict(self.space.validate(config, where="add_pending(config)"))
        key = self.space.key(full)
        self.pending[key] = full
        self.ask_infos[key] = AskInfo(config=full, phase=phase, ask_index=self.n_asks)
        return full

    def drop_pending(self, config: Mapping[str, Any]) -> bool:
        """Forget an asked config without telling an outcome: its trial never ran (a scheduler gave
        up on it before it started), so nothing is known of it and a later ask may propose it again.
        Returns whether it was pending."""
        key = self.space.key(dict(self.space.validate(config, where="drop_pending(config)")))
        return self.pending.pop(key, None) is not None

    def _baseline_turn(self) -> bool:
        """Whether this ask starts with the baseline (nothing told or pending, and it is valid)."""
        if self.observations or self.pending:
            return False
        base = self.baseline if self.baseline is not None else self.space.default_config()
        return not self.space.violated(base)

    def _warm_start_picks(self, k: int) -> list[AskInfo]:
        """Up to ``k`` configs of the warm-start queue not yet told or pending (none on the
        baseline's turn). With memory knowledge here (the analytic prior, or a memory model), a
        queued config this study's model expects not to fit (P(fit) < ``pairing_trigger``: measured
        on a larger card or for a smaller model) is asked as its best memory-saving repair instead
        (``repair_of`` the bank's config), or skipped when none is expected to fit."""
        if not self.initial_queue or self._baseline_turn():
            return []
        seen = {self.space.key(o.config) for o in self.observations} | set(self.pending)
        failed = self._excluded()[0]
        picks: list[AskInfo] = []
        fitted = False
        while len(picks) < k and self.initial_queue:
            cfg, origin = self.initial_queue.pop(0)
            key = self.space.key(cfg)
            if key in seen:
                continue
            if not fitted and (self.prior is not None or self.observations):
                self._fit()  # once per ask: the memory model (or the prior) judges every queued config
                fitted = True
            info = self._warm_start_fitting(cfg, origin, seen | failed)
            if info is None:
                continue
            seen.add(self.space.key(info.config))
            picks.append(info)
        return picks

    def _warm_start_fitting(self, cfg: dict[str, Any], origin: WarmStartOrigin | None,
                            excluded: set[str]) -> AskInfo | None:
        """A warm-start config as asked (``_warm_start_picks``): itself when it is expected to fit,
        else its best repair, else None."""
        if self.prior is None and self.models.memory.model is None:
            return self._ask_info(cfg, "warm_start", warm_start_origin=origin)
        scores = self._scores([cfg])
        p_fit = float(scores.p_fit[0])
        s = self.settings
        if not s.pairing or p_fit >= s.pairing_trigger:
            return self._ask_info(cfg, "warm_start", scores, 0, warm_start_origin=origin)
        rep = pairing.best_repair(self.space, cfg, self._scores, excluded=excluded,
                                  max_steps=s.repair_max_steps, target=s.pairing_target)
        if rep is None:
            return None
        r, rep_scores, j = rep
        return self._ask_info(r.config, "warm_start", rep_scores, j, repair_of=cfg, repair_moves=r.moves,
                              original_p_fit=p_fit, paired="warm_start", warm_start_origin=origin)

    def _ask_batch(self, k: int) -> list[AskInfo]:
        failed, ok_told = self._excluded()
        taken = set(self.pending)
        infos: list[AskInfo] = []
        while len(infos) < k:
            exclude = failed | ok_told | taken
            configs, X = self._candidates(exclude)
            if not configs:  # every config tried once: allow ok ones again
                configs, X = self._candidates(failed | taken)
                if not configs:
                    if infos:
                        break
                    raise SearchExhausted(f"search space '{self.space.name}': every valid config has been tried and failed or is pending.")
            # distinct configs: replicates (the doctor's baseline runs) do not use up the design
            n_seen = len({self.space.key(o.config) for o in self.observations} | taken)
            time_ready = self.models.time.model is not None
            if n_seen < self._n_init() or not time_ready:
                prior_turn = self._prior_turn(taken, design_done=n_seen >= self._n_init())
                info = self._prior_pick(configs, X) if prior_turn else self._design_pick(configs, X, taken)
                infos.append(info)
                taken.add(self.space.key(info.config))
                continue
            if ok_told and self.models.memory.model is not None and len(configs) <= self.settings.repeat_check_max:
                s = self._scores(configs, X)
                if float(np.max(s.p_fit * s.p_ok)) < self.settings.repeat_below_p:  # only likely failures are left
                    configs, X = self._candidates(failed | taken)
            # one config at a time (trials running, or not): the local/replicate turn as when sequential
            if k == 1 and not infos and n_seen >= self._n_init() + 2 and self._local_turn():
                inc = self._unconfirmed_incumbent()
                # a failed replicate is never asked again; a pending one is already re-measuring it
                if inc is not None and self.space.key(inc) not in failed | taken:
                    # provenance with the model's predictions, as for any ask
                    infos.append(self._ask_info(inc, "replicate", self._scores([inc]), 0))
                    break
            for info in self._bo_picks(configs, X, k - len(infos), taken, failed):
                infos.append(info)
                taken.add(self.space.key(info.config))
        return infos

    def _prior_turn(self, taken: set[str], design_done: bool) -> bool:
        """Whether a design-stage ask with trials pending goes to the analytic prior's pick.

        Sequentially the first model-based pick comes after the design's results. With trials
        pending, the asks of the first wave are made before any result, so the analytic prior (the
        only model there is) gets its pick within that wave rather than a wave later: once (the
        first ask with a trial pending and no prior pick yet), and for every ask that finds the
        design complete (pending configs counted) but too few ok results for a step-time model.
        Never without pending trials (the sequential schedule is unchanged) or without a prior."""
        if self.prior is None or not taken:
            return False
        return design_done or not any(i.phase == "bo-prior" for i in self.ask_infos.values())

    def _prior_pick(self, configs: list[dict[str, Any]], X: torch.Tensor) -> AskInfo:
        """The best config by constrained log-EI under the analytic prior alone (``_PriorOnly``):
        its log step time with sd ``prior_time_noise_sd``, against the best of the prior's step
        times of the baseline and of the configs told ok."""
        base = self.baseline if self.baseline is not None else self.space.default_config()
        refs = [base, *(o.config for o in self._ok())]
        ref = float(self._X(refs)[:, self.encoder.dim].min())
        mem = self.models.memory
        noise = float(mem.model.likelihood.noise_sd.detach()) if mem.model is not None else 0.0
        mem_pred = mem.pred if mem.pred is not None else _PriorOnly(self.encoder.dim + 1, self.settings.prior_only_memory_sd)
        scores = acquisition.analytic_scores(_PriorOnly(self.encoder.dim, self.settings.prior_time_noise_sd), mem_pred,
                                             noise, X, ref, self.feasibility.p_ok(configs))
        i = int(np.argmax(scores.log_score))
        return self._ask_info(configs[i], "bo-prior", scores, i)

    def _n_init(self) -> int:
        """The design's size now: ``settings.transfer_n_init`` while a bank transfer holds weight."""
        if self.transfer is not None and self.transfer.active and self.settings.transfer_n_init is not None:
            return min(self.n_init, self.settings.transfer_n_init)
        return self.n_init

    def _local_turn(self) -> bool:
        every = self.settings.local_every
        return bool(every) and self.n_asks % every == every - 1

    def _unconfirmed_incumbent(self) -> dict[str, Any] | None:
        """The incumbent, when ``intensify`` is on and it has exactly one trusted measurement."""
        inc = self.best() if self.settings.intensify else None
        if inc is None:
            return None
        key = self.space.key(inc)
        return inc if sum(self.space.key(o.config) == key for o in self._ok()) == 1 else None

    def _design_pick(self, configs: list[dict[str, Any]], X: torch.Tensor, taken: set[str]) -> AskInfo:
        keys = {self.space.key(c) for c in configs}
        if not self.observations and not taken:
            base = self.baseline if self.baseline is not None else self.space.default_config()
            if not self.space.violated(base) and self.space.key(base) in keys:
                return self._ask_info(base, "baseline")
        pool_size = self.settings.design_pool
        if len(configs) > pool_size:
            sel = self.rng.choice(len(configs), size=pool_size, replace=False)
            configs, X = [configs[i] for i in sel.tolist()], X[torch.as_tensor(sel)]
        seen = [o.config for o in self.observations] + [self.pending.get(t) or _config_of_key(self.space, t) for t in sorted(taken)]
        existing = self.encoder.encode(seen)
        scores = self._scores(configs, X)
        weights = scores.p_fit * scores.p_ok
        features = X[:, : self.encoder.dim]
        if self.settings.design_rule == "maximin":
            i = design.maximin_pick(features, existing, self.rng, weights=weights)
        else:
            i = design.coverage_pick(configs, features, seen, existing, self.space.names, self.rng, weights=weights,
                                     distance_weight=self.settings.design_distance_weight)
        return self._ask_info(configs[i], "design", scores, i)

    def _bo_picks(self, configs: list[dict[str, Any]], X: torch.Tensor, q: int, taken: set[str],
                  failed: set[str]) -> list[AskInfo]:
        scores = self._scores(configs, X)
        phase = "bo"
        s = self.settings
        if q == 1 and not taken:
            masked = scores.log_score
            if self._local_turn():
                near = self.pool.near(configs, self.best())
                if near.any():
                    masked, phase = np.where(near, scores.log_score, -np.inf), "bo-local"
            picks = [int(np.argmax(masked))]
            if s.pairing and phase == "bo" and not self.pool.scores_every_config:
                paired = self._pair_before_pick(configs, scores, picks[0], failed | taken | self._excluded()[1])
                if paired is not None:
                    return [paired]
        else:
            ranked, n_top = scores.log_score, s.batch_choices
            if q == 1 and self._local_turn():  # one pick while trials run: its local turn, as when sequential
                near = self.pool.near(configs, self.best())
                if near.any():
                    ranked, phase = np.where(near, scores.log_score, -np.inf), "bo-local"
                    n_top = min(n_top, int(near.sum()))
            top = np.argsort(-ranked, kind="stable")[:n_top]
            ok = self._ok()
            X_base = self._X([o.config for o in ok])
            # sorted: a set's order of strings changes with PYTHONHASHSEED, and X_pending's row order moves the picks
            pend = [self.pending.get(t) or _config_of_key(self.space, t) for t in sorted(taken)]
            X_pend = self._X(pend) if pend else None
            sub = acquisition.select_batch(self.models.time.model, self.models.memory.model, X[torch.as_tensor(top)],
                                           q, X_base, X_pend, seed=self.seed * 7919 + self.n_asks)
            picks = [int(top[j]) for j in sub]
        out: list[AskInfo] = []
        used = set(taken)
        for i in picks:
            info = self._ask_info(configs[i], phase, scores, i)
            if s.pairing and scores.p_fit[i] < s.pairing_trigger and self.models.memory.model is not None:
                rep = pairing.best_repair(self.space, configs[i], self._scores,
                                          excluded=failed | used | self._excluded()[1],
                                          max_steps=s.repair_max_steps, target=s.pairing_target)
                if rep is not None:
                    r, rep_scores, j = rep
                    info = self._ask_info(r.config, "repair", rep_scores, j, repair_of=configs[i],
                                          repair_moves=r.moves, original_p_fit=float(scores.p_fit[i]),
                                          paired="after_pick")
            used.add(self.space.key(info.config))
            out.append(info)
        return out

    def _pair_before_pick(self, configs: list[dict[str, Any]], scores: acquisition.Scores, pick: int,
                          excluded: set[str]) -> AskInfo | None:
        """Pairing before the pick (``pairing``): the best repairs of the sample's fast-but-too-big
        candidates that are not in the sample, if one scores above the sample's best (``pick``)."""
        if self.models.memory.model is None:
            return None
        s = self.settings
        sources = pairing.fast_but_too_big(scores.log_score, scores.p_fit, sources=s.pair_sources,
                                           scan=s.pair_source_scan, trigger=s.pairing_trigger)
        if not sources:
            return None
        in_pool = {self.space.key(c) for c in configs}
        found: dict[str, tuple[pairing.Repair, int]] = {}
        for i in sources:
            rep = pairing.best_repair(self.space, configs[i], self._scores, excluded=excluded | in_pool,
                                      max_steps=s.repair_max_steps, target=s.pairing_target)
            if rep is not None:
                found.setdefault(self.space.key(rep[0].config), (rep[0], i))
        if not found:
            return None
        reps = list(found.values())
        rep_scores = self._scores([r.config for r, _ in reps])
        j = int(np.argmax(rep_scores.log_score))
        if not float(rep_scores.log_score[j]) > float(scores.log_score[pick]):
            return None
        r, src = reps[j]
        return self._ask_info(r.config, "repair", rep_scores, j, repair_of=configs[src], repair_moves=r.moves,
                              original_p_fit=float(scores.p_fit[src]), paired="before_pick")

    # ------------------------------------------------------------ results
    def best(self) -> dict[str, Any] | None:
        """The observed ok config with the best posterior-mean step time (None before any ok trial)."""
        if not any(o.outcome.status == "ok" for o in self.observations):
            return None
        with _threads(self.settings.num_threads):
            self._fit()
            ok = self._ok()  # after the fit: stragglers trimmed
            if self.models.time.model is None:
                return dict(min(ok, key=lambda o: o.outcome.step_time or math.inf).config)
            mean, _ = acquisition.predict_time(self.models.time.pred, self._X([o.config for o in ok]))
        return dict(ok[int(torch.argmin(mean))].config)

    def predict(self, configs: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
        """Posterior predictions: ``step_time_mean_s`` (exp of the mean log time), ``step_time_sd_log``,
        ``memory_mean_bytes``, ``p_fit`` and ``p_ok``, each an array of shape ``(len(configs),)``."""
        full = [self.space.validate(c, where="predict(config)") for c in configs]
        with _threads(self.settings.num_threads):
            self._fit()
            s = self._scores(full)
        has_mem = self.models.memory.model is not None or self.prior is not None
        return {"step_time_mean_s": np.exp(s.time_mean), "step_time_sd_log": s.time_sd,
                "memory_mean_bytes": self.memory_capacity * np.exp(s.mem_mean) if has_mem else np.full(len(full), np.nan),
                "p_fit": s.p_fit, "p_ok": s.p_ok}

    def info(self, config: Mapping[str, Any]) -> AskInfo | None:
        """Provenance recorded when ``config`` was asked (None if it never was)."""
        return self.ask_infos.get(self.space.key(self.space.validate(config)))

    # ---------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly where this optimizer is (JSON-able; ``persistence``)."""
        features = self.prior_features.state_dict()
        return {
            "version": persistence.STATE_VERSION,
            "space_source": self.space.source,
            "space_file": self.space.file,
            "memory_capacity": self.memory_capacity,
            "seed": self.seed,
            "baseline": self.baseline,
            "settings": self.settings.to_dict(),
            "observations": [{"config": o.config, "outcome": o.outcome.to_dict()} for o in self.observations],
            "pending": list(self.pending.values()),
            "ask_infos": [i.to_dict() for i in self.ask_infos.values()],
            "initial_queue": [{"config": c, "origin": None if o is None else o.to_dict()} for c, o in self.initial_queue],
            "rng": self.rng.bit_generator.state,
            "n_asks": self.n_asks,
            "models": self.models.state_dict(),
            "prior": None if self.prior is None else self.prior.spec(),
            "prior_coefficients": features["coefficients"],
            "prior_fit_keys": features["fit_keys"],
            "time_outliers": sorted(self.time_outliers),
            "time_trim_key": self.time_trim_key,
            "transfer": None if self.transfer is None else {
                "record": self.transfer.record.to_dict(), "residual_state": self.transfer.residual_state,
                "weights": [self.transfer.centre_weight, self.transfer.residual_weight],
                "weight_history": [list(h) for h in self.transfer.weight_history]},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore observations, pending configs, ask infos, the warm-start queue, RNG and model
        state (the space and settings stay those of this optimizer)."""
        persistence.check_version(state)
        self.observations = []
        self.feasibility.clear()
        for raw in state["observations"]:
            self.tell(raw["config"], Outcome.from_dict(raw["outcome"]))
        self.pending = {self.space.key(c): self.space.validate(c) for c in state.get("pending", [])}
        infos = [AskInfo.from_dict(i) for i in state.get("ask_infos", [])]
        self.ask_infos = {self.space.key(i.config): i for i in infos}
        if "initial_queue" in state:
            self.initial_queue = []
            entries = list(state["initial_queue"] or [])
            self._queue_initial([e["config"] for e in entries],
                                [None if e.get("origin") is None else WarmStartOrigin.from_dict(e["origin"])
                                 for e in entries])
        self.rng.bit_generator.state = state["rng"]
        self.n_asks = int(state["n_asks"])
        self.models.load_state_dict(state.get("models") or {})
        self.time_outliers = {int(i) for i in state.get("time_outliers") or []}
        self.time_trim_key = state.get("time_trim_key")
        saved = state.get("transfer")
        if saved and self.prior is not None and self.settings.transfer:  # the saved fit, not a refit: the same asks as before
            self.transfer = TransferModel(TransferPrior.from_dict(saved["record"]), self.encoder, self.prior,
                                          self.settings, residual_state=saved.get("residual_state"))
            self.transfer.centre_weight, self.transfer.residual_weight = (float(w) for w in saved["weights"])
            self.transfer.weight_history = [(int(n), float(c), float(r)) for n, c, r in saved.get("weight_history") or []]
            self.prior_features.transfer = self.transfer
        self.prior_features.load_state_dict(state.get("prior_coefficients"), state.get("prior_fit_keys"))

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Optimizer:
        """A new optimizer (space and settings included) from ``state_dict()``."""
        from infrarsi.search.priors.registry import prior_from_spec

        opt = cls(persistence.space_of(state), memory_capacity=state["memory_capacity"], seed=state["seed"],
                  baseline=state.get("baseline"), settings=persistence.settings_of(state),
                  prior=None if state.get("prior") is None else prior_from_spec(state["prior"]))
        opt.load_state_dict(state)
        return opt

    def save(self, path: str | Path) -> None:
        """Write ``state_dict()`` as JSON to ``path`` (atomically: a temp file, then ``os.replace``)."""
        persistence.write_json(path, self.state_dict())

    @classmethod
    def load(cls, path: str | Path) -> Optimizer:
        """Inverse of ``save``."""
        return cls.from_state(persistence.read_json(path))

    @classmethod
    def from_trials(cls, space: SearchSpace, rows: Iterable[Mapping[str, Any]] | Any, *, memory_capacity: float,
                    stages: tuple[str, ...] | None = None, **kwargs: Any) -> Optimizer:
        """Rebuild from trial-log rows (the history: dicts, or a ``pyarrow.Table``).

        Each row needs ``config`` (a JSON string or a dict) and is told as ``Outcome.from_row``
        reads it. Rows whose config is not valid in ``space`` are skipped with a warning.
        ``stages`` keeps only rows of those stages; ``kwargs`` go to the constructor.
        """
        opt = cls(space, memory_capacity=memory_capacity, **kwargs)
        for cfg, outcome in persistence.history_outcomes(space, rows, stages):
            opt.tell(cfg, outcome)
        return opt


def _config_of_key(space: SearchSpace, key: str) -> dict[str, Any]:
    """Inverse of ``SearchSpace.key``."""
    return space.as_config(json.loads(key))


def _exp(x: float) -> float | None:
    return None if not math.isfinite(float(x)) else math.exp(float(x))


def _finite(x: float) -> float | None:
    """``x`` as a float, None when it is not finite (no prediction yet)."""
    return float(x) if math.isfinite(float(x)) else None
