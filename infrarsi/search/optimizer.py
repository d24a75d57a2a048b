"""``Optimizer``: ask/tell Bayesian search over a ``SearchSpace`` with a censored memory model.

::

    opt = Optimizer(space, memory_capacity=80e9, seed=0, baseline={...})
    cfg = opt.ask()                     # dict; opt.last_ask_info says why
    opt.tell(cfg, Outcome(status="ok", step_time=1.9, peak_memory=6.1e10))
    opt.best()                          # posterior-mean best among observed ok configs

Phases: the baseline, then a space-filling design (memory-aware once a memory model exists), then
constrained log-EI (``acquisition``) with memory-saver pairing (``pairing``). A config told
oom/failed/timeout/nan/invariant_violation is never proposed again; a config told ok is proposed
again once every other config has been tried or is predicted to fail (``REPEAT_BELOW_P``), and
as a replicate while it is the incumbent with a single trusted measurement (``intensify``).
Slow outliers among the step times (stragglers) are left out of the step-time model
(``models/outliers``); a config measured only as an outlier may be proposed again. The analytic
prior's inputs and coefficient fits live in ``priors.features``, the candidate pool in
``candidates``, persistence in ``persistence``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from infrarsi.errors import InfrarsiError
from infrarsi.search import acquisition, design, pairing
from infrarsi.search.candidates import CANDIDATE_CAP, CandidatePoolMixin
from infrarsi.search.encoding import Encoder
from infrarsi.search.models import outliers
from infrarsi.search.models.feasibility import FAILURE_WEIGHT, FeasibilityModel
from infrarsi.search.modelset import ModelSet
from infrarsi.search.outcome import Observation, Outcome
from infrarsi.search.persistence import PersistenceMixin
from infrarsi.search.priors.features import PriorInputsMixin
from infrarsi.search.priors.mean import PriorMean
from infrarsi.search.space import SearchSpace

REPEAT_BELOW_P = 0.05
"""When every untried config is this unlikely to run (P(fit) x P(no failure)), configs told ok
compete again (a replicate of a near-best config is worth more than a near-certain OOM)."""
REPEAT_CHECK_MAX = 1000
"""The check above runs only while at most this many configs are untried (it scores them once
more; in a larger space an untried config that may fit is almost always left)."""


PRIOR_ONLY_MEMORY_SD = 0.3
"""Sd of log peak memory around the analytic prior before a memory model exists (< 2 trials)."""


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


class Optimizer(CandidatePoolMixin, PriorInputsMixin, PersistenceMixin):
    """Ask/tell optimizer minimising step time under ``peak memory <= memory_capacity`` (bytes per device)."""

    def __init__(self, space: SearchSpace, memory_capacity: float, seed: int = 0,
                 baseline: Mapping[str, Any] | None = None, censoring: bool = True, pairing: bool = True,
                 n_init: int | None = None, candidate_cap: int = CANDIDATE_CAP, num_threads: int | None = 1,
                 local_every: int = 2, prior: PriorMean | None = None, intensify: bool = True) -> None:
        if not (isinstance(memory_capacity, (int, float)) and math.isfinite(memory_capacity) and memory_capacity > 0):
            raise InfrarsiError(f"Optimizer: memory_capacity: rule: must be bytes per device > 0; got {memory_capacity!r}.")
        self.space = space
        self.memory_capacity = float(memory_capacity)
        self.seed = int(seed)
        self.baseline = None if baseline is None else space.validate(baseline, where="baseline")
        self.censoring = bool(censoring)
        self.pairing = bool(pairing)
        self.encoder = Encoder(space)
        self.n_init = design.default_n_init(self.encoder.dim) if n_init is None else int(n_init)
        self.candidate_cap = int(candidate_cap)
        self.num_threads = num_threads
        self.local_every = int(local_every)
        """Every ``local_every``-th model-based ask is a local step around the incumbent (0: never)."""
        self.intensify = bool(intensify)
        """A local step re-measures the incumbent instead while it has only one trusted measurement
        (SMAC-style intensification: a single lucky draw must not decide ``best()``)."""
        self.observations: list[Observation] = []
        self.pending: dict[str, dict[str, Any]] = {}
        self.last_ask_info: dict[str, Any] | list[dict[str, Any]] = {}
        """Provenance of the last ask: a dict for ``ask()``, a list of dicts for ``ask(n)``."""
        self.ask_infos: dict[str, dict[str, Any]] = {}
        """Provenance of every config asked so far, by ``space.key(config)``."""
        self.rng = np.random.default_rng(self.seed)
        self.n_asks = 0
        self.feasibility = FeasibilityModel()
        idx, signs = [], []
        col = 0
        for b in self.encoder.blocks:
            if b.knob.memory != "neutral" and b.width == 1:
                idx.append(col)
                signs.append(1.0 if b.knob.memory == "hungry" else -1.0)
            col += b.width
        self.prior = prior
        """Analytic prior mean of both models (``infrarsi.search.priors.mean``), or None."""
        self.prior_coef: dict[str, np.ndarray | None] = {"time": None, "memory": None}
        """Fitted log coefficients of the prior's time and memory terms (None: nominal)."""
        self.prior_fit_keys: dict[str, str | None] = {"time": None, "memory": None}
        """Fingerprint of the data each coefficient set was fitted on."""
        self._prior_rows: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.time_outliers: set[int] = set()
        """Indices into ``observations`` of ok step times left out as slow outliers (stragglers)."""
        self.time_trim_key: str | None = None
        """Fingerprint of the ok step times ``time_outliers`` was computed on."""
        self._all_terms: tuple[np.ndarray, np.ndarray] | None = None
        self.models = ModelSet(mean_indices=idx, mean_signs=signs,
                               prior_dim=None if prior is None else self.encoder.dim)
        self._all = space.enumerate_values()
        self._all_keys = None if self._all is None else [json_key(v) for v in self._all]
        self._all_X: torch.Tensor | None = None
        self._all_configs: list[dict[str, Any]] | None = None
        self._all_index: dict[str, int] | None = None

    # ------------------------------------------------------------------ tell
    def tell(self, config: Mapping[str, Any], outcome: Outcome | Mapping[str, Any]) -> None:
        """Record the outcome of a trial of ``config``."""
        if not isinstance(outcome, Outcome):
            outcome = Outcome.from_dict(outcome)
        cfg = self.space.validate(config, where="tell(config)")
        self.pending.pop(self.space.key(cfg), None)
        self.observations.append(Observation(cfg, outcome))
        if outcome.status in FAILURE_WEIGHT:
            self.feasibility.add(cfg, failed=True, weight=FAILURE_WEIGHT[outcome.status])
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

    def _fit_time_on(self, ok: list[Observation]) -> Any:
        """Fit the prior's time coefficients and the step-time GP on ``ok``; the GP (or None)."""
        self._fit_prior_time(ok)
        if not ok:
            self.models.time.model = self.models.time.pred = None
            return None
        X = self._X([o.config for o in ok])
        y = torch.tensor([math.log(o.outcome.step_time) for o in ok], dtype=torch.float64)  # type: ignore[arg-type]
        self.models.update_time(X, y)
        return self.models.time.model

    def _fit(self) -> None:
        rows, ys, cens = self._memory_rows()
        self._fit_prior_memory(rows, ys, cens)  # first: the memory column is part of every input
        idx = [i for i, o in enumerate(self.observations) if o.outcome.status == "ok"]
        key = repr([(self.space.key(self.observations[i].config), self.observations[i].outcome.step_time) for i in idx])
        if key != self.time_trim_key:  # new step times: look for stragglers again (models/outliers.py)
            y = torch.tensor([math.log(self.observations[i].outcome.step_time) for i in idx],  # type: ignore[arg-type]
                             dtype=torch.float64)
            drop = outliers.trim_slow_outliers(
                y, lambda keep: self._fit_time_on([self.observations[idx[j]] for j in keep]),
                lambda js: self._X([self.observations[idx[j]].config for j in js]))
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
            elif o.outcome.status == "oom" and self.censoring:
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
            mem_pred = _PriorOnly(self.encoder.dim + 1, PRIOR_ONLY_MEMORY_SD)
        return acquisition.analytic_scores(self.models.time.pred, mem_pred, noise, X,
                                           self._best_log_time(), self.feasibility.p_ok(configs))

    def _info(self, cfg: dict[str, Any], phase: str, scores: acquisition.Scores | None, i: int | None) -> dict[str, Any]:
        info: dict[str, Any] = {"config": dict(cfg), "phase": phase, "ask_index": self.n_asks, "repair_of": None}
        if scores is not None and i is not None:
            info.update(predicted_step_time_s=_exp(scores.time_mean[i]), step_time_sd_log=float(scores.time_sd[i]),
                        p_fit=float(scores.p_fit[i]),
                        predicted_memory_bytes=self.memory_capacity * math.exp(float(scores.mem_mean[i]))
                        if self._has_memory_prediction() else None,
                        p_ok=float(scores.p_ok[i]), log_acquisition=float(scores.log_score[i]))
        return info

    # ------------------------------------------------------------------- ask
    def ask(self, n: int | None = None) -> dict[str, Any] | list[dict[str, Any]]:
        """One config (``n`` None) or a list of ``n`` distinct configs, all valid and not yet failed."""
        k = 1 if n is None else int(n)
        if k < 1:
            raise InfrarsiError(f"ask(n): rule: n must be >= 1; got {n!r}.")
        with _threads(self.num_threads):
            torch.manual_seed(self.seed * 100_003 + self.n_asks)
            self._fit()
            infos = self._ask_batch(k)
        for info in infos:
            key = self.space.key(info["config"])
            self.pending[key] = info["config"]
            self.ask_infos[key] = info
        self.n_asks += 1
        self.last_ask_info = infos[0] if n is None else infos
        configs = [dict(i["config"]) for i in infos]
        return configs[0] if n is None else configs

    def _ask_batch(self, k: int) -> list[dict[str, Any]]:
        failed, ok_told = self._excluded()
        taken = set(self.pending)
        infos: list[dict[str, Any]] = []
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
            if n_seen < self.n_init or not time_ready:
                info = self._design_pick(configs, X, taken)
                infos.append(info)
                taken.add(self.space.key(info["config"]))
                continue
            if ok_told and self.models.memory.model is not None and len(configs) <= REPEAT_CHECK_MAX:
                s = self._scores(configs, X)
                if float(np.max(s.p_fit * s.p_ok)) < REPEAT_BELOW_P:  # only likely failures are left
                    configs, X = self._candidates(failed | taken)
            if k == 1 and not taken and n_seen >= self.n_init + 2 and self._local_turn():
                inc = self._unconfirmed_incumbent()
                if inc is not None:  # provenance with the model's predictions, as for any ask
                    infos.append(self._info(inc, "replicate", self._scores([inc]), 0))
                    break
            for info in self._bo_picks(configs, X, k - len(infos), taken, failed):
                infos.append(info)
                taken.add(self.space.key(info["config"]))
        return infos

    def _local_turn(self) -> bool:
        return bool(self.local_every) and self.n_asks % self.local_every == self.local_every - 1

    def _unconfirmed_incumbent(self) -> dict[str, Any] | None:
        """The incumbent, when ``intensify`` is on and it has exactly one trusted measurement."""
        inc = self.best() if self.intensify else None
        if inc is None:
            return None
        key = self.space.key(inc)
        return inc if sum(self.space.key(o.config) == key for o in self._ok()) == 1 else None

    def _design_pick(self, configs: list[dict[str, Any]], X: torch.Tensor, taken: set[str]) -> dict[str, Any]:
        keys = {self.space.key(c) for c in configs}
        if not self.observations and not taken:
            base = self.baseline if self.baseline is not None else self.space.default_config()
            if not self.space.violated(base) and self.space.key(base) in keys:
                return self._info(base, "baseline", None, None)
        if len(configs) > design.DESIGN_POOL:
            sel = self.rng.choice(len(configs), size=design.DESIGN_POOL, replace=False)
            configs, X = [configs[i] for i in sel.tolist()], X[torch.as_tensor(sel)]
        seen = [o.config for o in self.observations] + [self.pending.get(t) or json_config(self.space, t) for t in taken]
        existing = self.encoder.encode(seen)
        scores = self._scores(configs, X)
        weights = scores.p_fit * scores.p_ok
        i = design.coverage_pick(configs, X[:, : self.encoder.dim], seen, existing, self.space.names, self.rng,
                                 weights=weights)
        return self._info(configs[i], "design", scores, i)

    def _bo_picks(self, configs: list[dict[str, Any]], X: torch.Tensor, q: int, taken: set[str],
                  failed: set[str]) -> list[dict[str, Any]]:
        scores = self._scores(configs, X)
        phase = "bo"
        if q == 1 and not taken:
            masked = scores.log_score
            if self._local_turn():
                near = self._near_incumbent(configs)
                if near.any():
                    masked, phase = np.where(near, scores.log_score, -np.inf), "bo-local"
            picks = [int(np.argmax(masked))]
            if self.pairing and phase == "bo" and not self._scores_every_config():
                paired = self._pair_before_pick(configs, scores, picks[0], failed | taken | self._excluded()[1])
                if paired is not None:
                    return [paired]
        else:
            top = np.argsort(-scores.log_score, kind="stable")[: acquisition.BATCH_CHOICES]
            ok = self._ok()
            X_base = self._X([o.config for o in ok])
            pend = [self.pending.get(t) or json_config(self.space, t) for t in taken]
            X_pend = self._X(pend) if pend else None
            sub = acquisition.select_batch(self.models.time.model, self.models.memory.model, X[torch.as_tensor(top)],
                                           q, X_base, X_pend, seed=self.seed * 7919 + self.n_asks)
            picks = [int(top[j]) for j in sub]
        out: list[dict[str, Any]] = []
        used = set(taken)
        for i in picks:
            info = self._info(configs[i], phase, scores, i)
            if self.pairing and scores.p_fit[i] < pairing.PAIRING_TRIGGER and self.models.memory.model is not None:
                rep = pairing.best_repair(self.space, configs[i], self._predict_raw,
                                          excluded=failed | used | self._excluded()[1])
                if rep is not None:
                    r, pred = rep
                    info = {"config": r.config, "phase": "repair", "ask_index": self.n_asks,
                            "repair_of": dict(configs[i]), "repair_moves": r.moves,
                            "original_p_fit": float(scores.p_fit[i]),
                            "predicted_step_time_s": _exp(pred["log_time_mean"]), "p_fit": pred["p_fit"],
                            "predicted_memory_bytes": self.memory_capacity * math.exp(pred["mem_mean"]),
                            "p_ok": pred["p_ok"], "paired": "after_pick"}
            used.add(self.space.key(info["config"]))
            out.append(info)
        return out

    def _pair_before_pick(self, configs: list[dict[str, Any]], scores: acquisition.Scores, pick: int,
                          excluded: set[str]) -> dict[str, Any] | None:
        """Pairing before the pick (``pairing``): the best repairs of the sample's fast-but-too-big
        candidates that are not in the sample, if one scores above the sample's best (``pick``)."""
        if self.models.memory.model is None:
            return None
        sources = pairing.fast_but_too_big(scores.log_score, scores.p_fit)
        if not sources:
            return None
        in_pool = {self.space.key(c) for c in configs}
        found: dict[str, tuple[pairing.Repair, int]] = {}
        for i in sources:
            rep = pairing.best_repair(self.space, configs[i], self._predict_raw, excluded=excluded | in_pool)
            if rep is not None:
                found.setdefault(self.space.key(rep[0].config), (rep[0], i))
        if not found:
            return None
        reps = list(found.values())
        s = self._scores([r.config for r, _ in reps])
        j = int(np.argmax(s.log_score))
        if not float(s.log_score[j]) > float(scores.log_score[pick]):
            return None
        r, src = reps[j]
        info = self._info(r.config, "repair", s, j)
        info.update(repair_of=dict(configs[src]), repair_moves=r.moves, original_p_fit=float(scores.p_fit[src]),
                    paired="before_pick")
        return info

    def _has_memory_prediction(self) -> bool:
        return self.models.memory.model is not None or self.prior is not None

    def _predict_raw(self, configs: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
        s = self._scores(configs)
        return {"log_time_mean": s.time_mean, "p_fit": s.p_fit, "p_ok": s.p_ok, "mem_mean": s.mem_mean}

    # ------------------------------------------------------------ results
    def best(self) -> dict[str, Any] | None:
        """The observed ok config with the best posterior-mean step time (None before any ok trial)."""
        if not any(o.outcome.status == "ok" for o in self.observations):
            return None
        with _threads(self.num_threads):
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
        with _threads(self.num_threads):
            self._fit()
            s = self._scores(full)
        has_mem = self._has_memory_prediction()
        return {"step_time_mean_s": np.exp(s.time_mean), "step_time_sd_log": s.time_sd,
                "memory_mean_bytes": self.memory_capacity * np.exp(s.mem_mean) if has_mem else np.full(len(full), np.nan),
                "p_fit": s.p_fit, "p_ok": s.p_ok}

    def info(self, config: Mapping[str, Any]) -> dict[str, Any] | None:
        """Provenance recorded when ``config`` was asked (None if it never was)."""
        return self.ask_infos.get(self.space.key(self.space.validate(config)))


def json_key(values: Sequence[Any]) -> str:
    """``SearchSpace.key`` of a value tuple."""
    import json

    return json.dumps(list(values))


def json_config(space: SearchSpace, key: str) -> dict[str, Any]:
    """Inverse of ``SearchSpace.key``."""
    import json

    return space.as_config(json.loads(key))


def _exp(x: float) -> float | None:
    return None if not math.isfinite(float(x)) else math.exp(float(x))
