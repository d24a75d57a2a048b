"""Optuna TPE with constraints (``TPESampler(constraints_func=...)``), ask/tell interface.

Knobs are suggested define-by-run, so a ``when`` knob is only suggested where it is active.
A sample that breaks a space constraint is told as FAIL and Optuna is asked again (no device
time, not counted in the budget); after 20 such samples in a row a random valid config is
enqueued and asked instead. An OOM is a COMPLETE trial whose constraint value is +1
(infeasible; TPE ranks infeasible trials below every feasible one, so the objective value given,
the worst time seen, only orders it among infeasible ones); an ok trial's constraint is
``(peak - capacity) / capacity``; a crash is FAIL (TPE ignores it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.peers.base import BestObserved, Observation
from infrarsi.search.space import SearchSpace

MAX_RETRIES = 20


class OptunaPeer(BestObserved):
    """Optuna TPE (multivariate, constraints on), seeded."""

    def __init__(
        self, space: SearchSpace, memory_capacity: float, seed: int, baseline: dict[str, Any]
    ) -> None:
        import optuna

        super().__init__()
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        self.optuna = optuna
        self.space = space
        self.cap = float(memory_capacity)
        sampler = optuna.samplers.TPESampler(
            seed=seed,
            multivariate=True,
            group=True,
            n_startup_trials=8,
            constraints_func=lambda t: t.user_attrs.get("constraint", (1.0,)),
        )
        self.study = optuna.create_study(direction="minimize", sampler=sampler)
        self._pending: dict[str, Any] = {}
        self._worst = 0.0
        self.retries = 0
        self.rng = np.random.default_rng(seed)

    def _suggest(self, trial: Any) -> dict[str, Any]:
        cfg: dict[str, Any] = {}
        for k in self.space.knobs:
            if k.when is not None and not k.when.holds(cfg):
                cfg[k.name] = k.default
                continue
            cfg[k.name] = trial.suggest_categorical(k.name, list(k.values))
        return self.space.resolve(cfg)

    def ask(self) -> dict[str, Any]:
        for _ in range(MAX_RETRIES):
            trial = self.study.ask()
            cfg = self._suggest(trial)
            if not self.space.violated(cfg):
                self._pending[self.space.key(cfg)] = trial
                return cfg
            self.retries += 1
            self.study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
        rows = self.space.enumerate() or []
        cfg = dict(rows[int(self.rng.integers(len(rows)))])
        active = self.space.active(cfg)
        self.study.enqueue_trial({n: v for n, v in cfg.items() if active[n]})
        trial = self.study.ask()
        cfg = self._suggest(trial)
        self._pending[self.space.key(cfg)] = trial
        return cfg

    def tell(self, config: dict[str, Any], obs: Observation) -> None:
        self._record(config, obs)
        trial = self._pending.pop(self.space.key(config))
        if obs.status == "ok" and obs.step_time_s is not None:
            peak = float(obs.peak_memory_bytes or 0.0)
            trial.set_user_attr("constraint", ((peak - self.cap) / self.cap,))
            self._worst = max(self._worst, obs.step_time_s)
            self.study.tell(trial, obs.step_time_s)
        elif obs.status == "oom":
            trial.set_user_attr("constraint", (1.0,))
            self.study.tell(trial, self._worst * 2 if self._worst else 1e6)
        else:
            self.study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
