"""``ModelSet``: the optimizer's models, fitted on its history, and the scores they give candidate configs.

The set holds the step-time GP, the censored memory GP (log(peak / capacity); OOMs are lower
bounds when ``censoring`` is on), the feasibility model (non-OOM failures) and the model inputs
with the analytic prior's columns (``priors.features.PriorFeatures``, laid out as
``encoding.InputColumns`` says). ``fit(history)`` brings them up to date: the prior's memory
coefficients first (their column is in every input), slow step-time outliers left out
(``models.outliers``), then the two GPs.

``update_time`` / ``update_memory`` refit only a model whose data changed. A refit
warm-starts from the last parameters and runs a few iterations; a full refit (more iterations)
happens when the data grew by ``OptimizerSettings.full_refit_growth`` since the last full one
(iterations: ``time_gp_iters``, ``memory_gp_iters``). When the parameters were already fitted on exactly
the current data (e.g. after ``load_dict``), the model is rebuilt without optimisation.

Why one module: every method reads or refits the same fitted state (the two GPs, their warm-start
slots, the prior's coefficients, the trimmed outliers and the memory model's prequential checks),
and the order of the steps of ``fit`` (checks, then the prior's memory coefficients, then the
GPs) is the contract; split, each part would need the others' state.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from infrarsi.search import acquisition
from infrarsi.search.best_choice import BestChoice, choose, evidence_by_config
from infrarsi.search.encoding import InputColumns
from infrarsi.search.history import History
from infrarsi.search.models import outliers
from infrarsi.search.models.feasibility import FeasibilityModel
from infrarsi.search.models.memory_calibration import MemoryCalibration
from infrarsi.search.models.predict import ExactMarginal, VariationalMarginal
from infrarsi.search.models.time_gp import (
    State,
    WeightTilt,
    acquisition_variance_cut,
    fit_time_gp,
    state_from_json,
    state_to_json,
)
from infrarsi.search.models.tobit import fit_tobit_gp
from infrarsi.search.outcome import FAILURE_STATUSES, Observation, Outcome
from infrarsi.search.priors.features import PriorFeatures
from infrarsi.search.settings import OptimizerSettings


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block (fits and scores) with ``n`` torch threads (None: leave the count as it is)."""
    if n is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


class PriorOnly:
    """A predictor that returns one input column (a prior's log value) with a fixed variance."""

    def __init__(self, column: int, sd: float) -> None:
        self.column, self.var = column, sd**2

    def __call__(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and variance of each row of ``X``."""
        return X[:, self.column], torch.full((X.shape[0],), self.var, dtype=torch.float64)


@dataclass
class _Slot:
    """One model with its warm-start state."""

    model: Any = None
    """The fitted BoTorch model (None before two points)."""
    pred: Any = None
    """Fast marginal predictor of ``model`` (``ExactMarginal`` or ``VariationalMarginal``)."""
    state: State | None = None
    """Its parameters, for the next warm start."""
    fitted_key: str = ""
    """Fingerprint of the data the state was fitted on."""
    full_n: int = 0
    """Number of points at the last full refit."""


class ModelSet:
    """The step-time, memory and feasibility models of one optimizer, with warm-start state."""

    def __init__(
        self,
        features: PriorFeatures,
        columns: InputColumns,
        memory_capacity: float,
        settings: OptimizerSettings,
        mean_indices: list[int],
        mean_signs: list[float],
        speed: tuple[list[int], list[float]] = ([], []),
        pairs: tuple[tuple[int, int], ...] = (),
    ) -> None:
        self.features = features
        """Model inputs of configs and the analytic prior's fitted coefficients."""
        self.columns = columns
        """Where the features and the prior's columns sit in an input row."""
        self.memory_capacity = memory_capacity
        """Bytes per device; the memory model learns log(peak / capacity)."""
        self.settings = settings
        """Refit schedule, iterations, censoring and the kernels' settings."""
        self.mean_indices = mean_indices
        """Memory-tagged feature indices (for the Tobit prior mean)."""
        self.mean_signs = mean_signs
        """+1 for hungry, -1 for saver features."""
        self.speed_tilt = WeightTilt(
            tuple(speed[0]), tuple(speed[1]), settings.speed_prior_weight, settings.speed_prior_sd
        )
        """The speed tags' prior on the step-time model's linear mean (used without an analytic
        prior; ``models.time_gp.WeightTilt``)."""
        self.pairs = pairs
        """Per knob, the ``(start, width)`` of its feature columns (the step-time model's
        knob-value pair term, ``models.pair_kernel``)."""
        self.time = _Slot()
        """The step-time GP."""
        self.memory = _Slot()
        """The censored memory GP."""
        self.feasibility = FeasibilityModel(settings=settings)
        """P(no non-OOM failure) of a config."""
        self.memory_calibration = MemoryCalibration(
            settings.memory_calibration_window, settings.memory_calibration_prior_sd
        )
        """The memory model's prequential checks and the extra sd they call for."""
        self.time_outliers: set[int] = set()
        """Indices into the history's observations of ok step times left out as slow outliers."""
        self.time_trim_key: str | None = None
        """Fingerprint of the ok step times ``time_outliers`` was computed on."""

    @property
    def has_prior(self) -> bool:
        """Whether the inputs carry an analytic prior's columns."""
        return self.columns.with_prior

    def observe(self, config: Mapping[str, Any], outcome: Outcome) -> None:
        """Tell the feasibility model one trial (the GPs learn at the next ``fit``)."""
        if outcome.status in FAILURE_STATUSES:
            self.feasibility.add(
                config, failed=True, weight=self.settings.failure_weight[outcome.status]
            )
        else:
            self.feasibility.add(config, failed=False, completed=outcome.status == "ok")

    def inputs(self, configs: Sequence[Mapping[str, Any]]) -> torch.Tensor:
        """Model input rows of ``configs``."""
        return self.features.inputs(configs)

    def ok(self, history: History) -> list[Observation]:
        """The ok observations the step-time model learns from (trimmed stragglers left out)."""
        return history.ok(self.time_outliers)

    def excluded(self, history: History) -> tuple[set[str], set[str]]:
        """Keys of configs told as failures, and of configs told ok (and never failed)."""
        failed = history.failed_keys()
        ok = {
            history.space.key(o.config) for o in self.ok(history)
        }  # a config measured only as a straggler may come again
        return failed, ok - failed

    def _fit_time_on(self, ok: list[Observation]) -> Any:
        """Fit the prior's time coefficients and the step-time GP on ``ok``; the GP (or None)."""
        self.features.fit_time([o.config for o in ok], [o.outcome.step_time for o in ok])  # type: ignore[misc]
        if not ok:
            self.time.model = self.time.pred = None
            return None
        X = self.inputs([o.config for o in ok])
        y = torch.tensor([math.log(o.outcome.step_time) for o in ok], dtype=torch.float64)  # type: ignore[arg-type]
        self.update_time(X, y)
        return self.time.model

    def fit(self, history: History) -> None:
        """Bring every model up to date with ``history`` (only what changed is refitted)."""
        rows, ys, cens = self.memory_rows(history)
        self.check_memory(rows, ys, cens)  # before anything learns from the new rows
        self.features.fit_memory(rows, ys, cens)  # first: the memory column is part of every input
        obs = history.observations
        idx = [i for i, o in enumerate(obs) if o.outcome.status == "ok"]
        key = repr([(history.space.key(obs[i].config), obs[i].outcome.step_time) for i in idx])
        if (
            key != self.time_trim_key
        ):  # new step times: look for stragglers again (models/outliers.py)
            y = torch.tensor(
                [math.log(obs[i].outcome.step_time) for i in idx],  # type: ignore[arg-type]
                dtype=torch.float64,
            )
            drop = outliers.trim_slow_outliers(
                y,
                lambda keep: self._fit_time_on([obs[idx[j]] for j in keep]),
                lambda js: self.inputs([obs[idx[j]].config for j in js]),
                self.settings,
            )
            self.time_outliers = {idx[j] for j in drop}
            self.time_trim_key = key
        self._fit_time_on(self.ok(history))
        if len(rows) >= 2:
            self.update_memory(
                self.inputs(rows),
                torch.tensor(ys, dtype=torch.float64),
                torch.tensor(cens, dtype=torch.bool),
            )
        else:
            self.memory.model = self.memory.pred = None

    def check_memory(
        self, rows: Sequence[Mapping[str, Any]], ys: Sequence[float], cens: Sequence[bool]
    ) -> None:
        """Record how the memory predictor (before it learns from them) predicted the configs
        among ``rows`` past ``memory_calibration.checked_rows`` that it had not seen
        (``models.memory_calibration``)."""
        cal = self.memory_calibration
        start = cal.checked_rows
        if self.memory.model is None and self.memory.state is not None and 2 <= start < len(rows):
            # restored from a saved state: rebuild the model it saved (fitted on the checked rows,
            # no optimisation) so that it checks the new rows as the saved optimizer would have
            self.update_memory(
                self.inputs(rows[:start]),
                torch.tensor(ys[:start], dtype=torch.float64),
                torch.tensor(cens[:start], dtype=torch.bool),
            )
        new = cal.take_new([self.features.space.key(c) for c in rows])
        pred, noise = self._memory_predictor(calibrated=False)
        if pred is None or not new:
            return
        with torch.no_grad():
            mean, var = pred(self.inputs([rows[i] for i in new]))
        sd = torch.sqrt(var + noise**2)
        cal.record([ys[i] for i in new], [cens[i] for i in new], mean.tolist(), sd.tolist())

    def memory_rows(self, history: History) -> tuple[list[dict[str, Any]], list[float], list[bool]]:
        """Configs, log(peak / capacity) (the log lower bound for OOMs) and the censoring mask."""
        rows: list[dict[str, Any]] = []
        ys: list[float] = []
        cens: list[bool] = []
        for o in history.observations:
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

    def incumbent(self, history: History) -> dict[str, Any] | None:
        """The trusted ok config with the best posterior-mean step time, after a ``fit`` (None before any ok trial)."""
        if not any(o.outcome.status == "ok" for o in history.observations):
            return None
        self.fit(history)
        ok = self.ok(history)  # after the fit: stragglers trimmed
        if self.time.model is None:
            return dict(min(ok, key=lambda o: o.outcome.step_time or math.inf).config)
        mean, _ = acquisition.predict_time(self.time.pred, self.inputs([o.config for o in ok]))
        return dict(ok[int(torch.argmin(mean))].config)

    def runner_up_p(self, history: History, incumbent: Mapping[str, Any]) -> float:
        """P(the runner-up is faster than ``incumbent``) under the step-time posterior: the next
        distinct trusted ok config by posterior mean, the two posteriors taken as independent
        normals in log seconds (1.0 without a model or a runner-up: nothing is settled)."""
        key = history.space.key(incumbent)
        others = {history.space.key(o.config): o.config for o in self.ok(history)}
        others.pop(key, None)
        if self.time.model is None or not others:
            return 1.0
        configs = [dict(incumbent), *others.values()]
        mean, sd = acquisition.predict_time(self.time.pred, self.inputs(configs))
        j = 1 + int(torch.argmin(mean[1:]))
        spread = float(torch.sqrt(sd[0] ** 2 + sd[j] ** 2))
        if not math.isfinite(spread) or spread <= 0:
            return 1.0
        return float(torch.special.ndtr(torch.tensor((float(mean[0]) - float(mean[j])) / spread)))

    def best_choice(self, history: History) -> BestChoice | None:
        """The config to recommend from both the posterior and the measurements, with why
        (``best_choice``), after a ``fit`` (None before any ok trial)."""
        if not any(o.outcome.status == "ok" for o in history.observations):
            return None
        self.fit(history)
        ok = self.ok(history)  # after the fit: stragglers trimmed
        if not ok:  # every ok step time trimmed (cannot happen with the trimming's limits)
            ok = history.ok()
        evidence = evidence_by_config(
            [
                (history.space.key(o.config), o.config, float(o.outcome.step_time or math.inf))
                for o in ok
            ]
        )
        confidence = self.settings.best_confidence
        pred = self.time.pred
        if self.time.model is None or pred is None:
            return choose(evidence, None, None, confidence)
        X = self.inputs([e.config for e in evidence])
        mean, sd = acquisition.predict_time(pred, X)
        joint = getattr(pred, "joint", None)
        cov = joint(X)[1] if joint is not None else torch.diag(sd * sd)
        evidence = [
            replace(e, posterior_mean_s=math.exp(float(m)), posterior_sd_log=float(v))
            for e, m, v in zip(evidence, mean, sd, strict=True)
        ]
        return choose(evidence, mean.numpy(), cov.numpy(), confidence)

    def best_log_time(self, history: History) -> float | None:
        """The lowest posterior-mean log step time among the trusted ok configs (None without a model)."""
        ok = self.ok(history)
        if not ok or self.time.pred is None:
            return None
        mean, _ = acquisition.predict_time(self.time.pred, self.inputs([o.config for o in ok]))
        return float(mean.min())

    def prior_only_memory_sd(self) -> float:
        """Sd of log peak memory around the prior column before a memory model exists:
        ``prior_only_memory_sd``, or with a bank's memory centre its measured error
        (``TransferModel.memory_sd``, at least ``transfer_memory_sd_floor``), whichever is less."""
        s = self.settings
        transfer = self.features.transfer
        if transfer is None or transfer.memory_sd is None:
            return s.prior_only_memory_sd
        return min(s.prior_only_memory_sd, max(transfer.memory_sd, s.transfer_memory_sd_floor))

    def _memory_predictor(self, calibrated: bool = True) -> tuple[Any, float]:
        """The memory predictor (the prior's column alone before a memory model) and its noise sd;
        ``calibrated``: the sd of ``memory_calibration.extra_sd()`` added to the noise in quadrature."""
        mem = self.memory
        noise = float(mem.model.likelihood.noise_sd.detach()) if mem.model is not None else 0.0
        pred = mem.pred
        if pred is None and self.has_prior:  # no memory model yet: the prior alone
            pred = PriorOnly(self.columns.prior_memory, self.prior_only_memory_sd())
        if calibrated and pred is not None:
            noise = math.hypot(noise, self.memory_calibration.extra_sd())
        return pred, noise

    def scores(
        self, history: History, configs: Sequence[Mapping[str, Any]], X: torch.Tensor | None = None
    ) -> acquisition.Scores:
        """Predictions and constrained log-EI of ``configs`` (inputs ``X``, or built here)."""
        X = self.inputs(configs) if X is None else X
        mem_pred, noise = self._memory_predictor()
        return acquisition.analytic_scores(
            self.time.pred,
            mem_pred,
            noise,
            X,
            self.best_log_time(history),
            self.feasibility.p_ok(configs),
            sd_scale=self.settings.acquisition_sd_scale,
        )

    def predict(
        self, history: History, configs: Sequence[Mapping[str, Any]], *, has_prior: bool
    ) -> dict[str, np.ndarray]:
        """Posterior predictions of validated ``configs`` after a fit on ``history``
        (``Optimizer.predict``): ``step_time_mean_s`` (exp of the mean log time),
        ``step_time_sd_log``, ``memory_mean_bytes`` (NaN without a memory model or prior),
        ``p_fit`` and ``p_ok``, each an array of shape ``(len(configs),)``."""
        self.fit(history)
        s = self.scores(history, configs)
        has_mem = self.memory.model is not None or has_prior
        return {
            "step_time_mean_s": np.exp(s.time_mean),
            "step_time_sd_log": s.time_sd,
            "memory_mean_bytes": self.memory_capacity * np.exp(s.mem_mean)
            if has_mem
            else np.full(len(configs), np.nan),
            "p_fit": s.p_fit,
            "p_ok": s.p_ok,
        }

    def prior_scores(
        self,
        history: History,
        configs: Sequence[Mapping[str, Any]],
        X: torch.Tensor,
        baseline: Mapping[str, Any],
    ) -> acquisition.Scores:
        """Constrained log-EI under the analytic prior alone: its log step time with sd
        ``prior_time_noise_sd``, against the best of the prior's step times of ``baseline`` and of
        the configs told ok."""
        refs = [baseline, *(o.config for o in self.ok(history))]
        ref = float(self.inputs(refs)[:, self.columns.prior_time].min())
        mem_pred, noise = self._memory_predictor()
        return acquisition.analytic_scores(
            PriorOnly(self.columns.prior_time, self.settings.prior_time_noise_sd),
            mem_pred,
            noise,
            X,
            ref,
            self.feasibility.p_ok(configs),
        )

    @staticmethod
    def _key(*tensors: torch.Tensor) -> str:
        return "|".join(
            f"{tuple(t.shape)}:{float(t.double().sum()):.12g}:{float((t.double() ** 2).sum()):.12g}"
            for t in tensors
        )

    def update_time(self, X: torch.Tensor, log_t: torch.Tensor) -> None:
        """Refit the step-time GP on ``X`` (``(n, d)``), ``log_t`` (``(n,)``) if they changed."""
        if X.shape[0] < 2:
            self.time.model = self.time.pred = None
            return
        key = self._key(X, log_t)
        if self.time.model is not None and key == self.time.fitted_key:
            return
        n = X.shape[0]
        if key == self.time.fitted_key and self.time.state is not None:
            iters = 0
        elif self.time.state is None or n >= self.settings.full_refit_growth * self.time.full_n:
            iters, self.time.full_n = (
                self.settings.time_gp_iters[0 if self.time.state is None else 1],
                n,
            )
        else:
            iters = self.settings.time_gp_iters[2]
        s = self.settings
        self.time.model, self.time.state = fit_time_gp(
            X,
            log_t,
            warm=self.time.state,
            maxiter=iters,
            offset=self.columns.time_offset(),
            config_sd=s.config_deviation_sd,
            kernel=s.time_kernel,
            tilt=self.speed_tilt if s.speed_prior_weight > 0 else None,
            pairs=self.pairs,
            interaction_sd=s.interaction_sd,
        )
        cut = acquisition_variance_cut(
            self.time.model, s.config_deviation_sd, s.acquisition_config_sd
        )
        self.time.pred = ExactMarginal(self.time.model, cut)
        self.time.fitted_key = key

    def update_memory(self, X: torch.Tensor, y: torch.Tensor, censored: torch.Tensor) -> None:
        """Refit the Tobit GP on log(peak/capacity) ``y`` with the censoring mask, if they changed."""
        if X.shape[0] < 2:
            self.memory.model = self.memory.pred = None
            return
        key = self._key(X, y, censored)
        if self.memory.model is not None and key == self.memory.fitted_key:
            return
        n = X.shape[0]
        if key == self.memory.fitted_key and self.memory.state is not None:
            iters = 0
        elif self.memory.state is None or n >= self.settings.full_refit_growth * self.memory.full_n:
            iters, self.memory.full_n = (
                self.settings.memory_gp_iters[0 if self.memory.state is None else 1],
                n,
            )
        else:
            iters = self.settings.memory_gp_iters[2]
        self.memory.model, self.memory.state = fit_tobit_gp(
            X,
            y,
            censored,
            mean_indices=self.mean_indices,
            mean_signs=self.mean_signs,
            warm=self.memory.state,
            maxiter=iters,
            offset=self.columns.memory_offset(),
        )
        self.memory.pred = VariationalMarginal(self.memory.model)
        self.memory.fitted_key = key

    def to_dict(self) -> dict[str, Any]:
        """JSON-able state: warm-start parameters, outliers and the prior's coefficients (the keys
        of ``Optimizer.state_dict()``; ``load_dict`` inverts it)."""
        features = self.features.state_dict()
        return {
            "models": {
                name: {
                    "state": state_to_json(s.state),
                    "fitted_key": s.fitted_key,
                    "full_n": s.full_n,
                }
                for name, s in (("time", self.time), ("memory", self.memory))
            },
            "prior_coefficients": features["coefficients"],
            "prior_fit_keys": features["fit_keys"],
            "time_outliers": sorted(self.time_outliers),
            "time_trim_key": self.time_trim_key,
            "memory_calibration": self.memory_calibration.to_dict(),
        }

    def load_dict(self, raw: Mapping[str, Any]) -> None:
        """Inverse of ``to_dict`` (models are rebuilt lazily, at the next ``fit``)."""
        slots = raw.get("models") or {}
        for name in ("time", "memory"):
            r = slots.get(name) or {}
            setattr(
                self,
                name,
                _Slot(
                    model=None,
                    state=state_from_json(r.get("state")),
                    fitted_key=str(r.get("fitted_key", "")),
                    full_n=int(r.get("full_n", 0)),
                ),
            )
        self.time_outliers = {int(i) for i in raw.get("time_outliers") or []}
        self.time_trim_key = raw.get("time_trim_key")
        self.memory_calibration.load_dict(raw.get("memory_calibration"))
        self.features.load_state_dict(raw.get("prior_coefficients"), raw.get("prior_fit_keys"))
