"""Ax (``ax.api.Client``, Ax 1.3) with its default Sobol -> BoTorch Modular generation strategy.

How a user would set it up for this problem:
- every knob is a choice parameter (ordered for numbers); Ax's hierarchical parameters hang a
  child off one parent value only, so ``when`` knobs are flat and resolved to their default
  where inactive;
- objective ``-step_time`` (minimise), outcome constraint ``peak_mem_gb <= capacity``, and ok
  trials report both;
- an OOM or a crash is ``mark_trial_failed`` (Ax's failed trials carry no data);
- a proposal that breaks a non-linear space constraint (Ax only takes linear ones) is marked
  failed and Ax is asked again; such retries cost no device time and do not count against the
  budget (generous to Ax), and after 25 in a row a random valid config is attached instead.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from benchmarks.peers.base import BestObserved, Observation
from infrarsi.search.space import SearchSpace

MAX_RETRIES = 25


def _param(knob: Any) -> Any:
    from ax.api.configs import ChoiceParameterConfig

    values = list(knob.values)
    if all(isinstance(v, bool) for v in values):
        return ChoiceParameterConfig(name=knob.name, values=values, parameter_type="bool")
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return ChoiceParameterConfig(
            name=knob.name, values=values, parameter_type="int", is_ordered=True
        )
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return ChoiceParameterConfig(
            name=knob.name,
            values=[float(v) for v in values],
            parameter_type="float",
            is_ordered=True,
        )
    return ChoiceParameterConfig(
        name=knob.name, values=[str(v) for v in values], parameter_type="str", is_ordered=False
    )


class AxPeer(BestObserved):
    """Ax Client, Sobol then BoTorch Modular (``method="fast"``), OOM marked failed."""

    def __init__(
        self, space: SearchSpace, memory_capacity: float, seed: int, baseline: dict[str, Any]
    ) -> None:
        from ax.api import Client

        super().__init__()
        for name in ("ax", "ax.api", "ax.service", "ax.adapter", "ax.generation_strategy"):
            logging.getLogger(name).setLevel(logging.ERROR)
        self.space = space
        self.rng = np.random.default_rng(seed)
        self.client = (
            Client(random_seed=seed)
            if "random_seed" in Client.__init__.__code__.co_varnames
            else Client()
        )
        self.client.configure_experiment(
            parameters=[_param(k) for k in space.knobs if len(k.values) > 1],
            name=f"infrarsi_bench_{seed}",
        )
        self.cap_gb = memory_capacity / 1e9
        self.client.configure_optimization(
            objective="-step_time", outcome_constraints=[f"peak_mem_gb <= {self.cap_gb}"]
        )
        self.client.configure_generation_strategy(method="fast", initialization_random_seed=seed)
        self._pending: dict[str, int] = {}
        self.retries = 0
        """Proposals refused for breaking a space constraint (not counted in the budget)."""

    def _to_config(self, params: dict[str, Any]) -> dict[str, Any]:
        cfg = dict(self.space.default_config())
        for k in self.space.knobs:
            if k.name in params:
                v = params[k.name]
                cfg[k.name] = k.canonical(
                    v
                    if not isinstance(v, float) or not float(v).is_integer() or k.type == "float"
                    else int(v)
                )
        return self.space.resolve(cfg)

    def ask(self) -> dict[str, Any]:
        for _ in range(MAX_RETRIES):
            ((index, params),) = self.client.get_next_trials(max_trials=1).items()
            cfg = self._to_config(dict(params))
            if not self.space.violated(cfg):
                self._pending[self.space.key(cfg)] = index
                return cfg
            self.retries += 1
            self.client.mark_trial_failed(index, failed_reason="breaks a space constraint")
        rows = self.space.enumerate() or []
        cfg = dict(rows[int(self.rng.integers(len(rows)))])
        params = {k.name: cfg[k.name] for k in self.space.knobs if len(k.values) > 1}
        params = {n: (str(v) if isinstance(v, str) else v) for n, v in params.items()}
        self._pending[self.space.key(cfg)] = self.client.attach_trial(parameters=params)
        return cfg

    def tell(self, config: dict[str, Any], obs: Observation) -> None:
        self._record(config, obs)
        index = self._pending.pop(self.space.key(config))
        if obs.status == "ok" and obs.step_time_s is not None:
            self.client.complete_trial(
                index,
                raw_data={
                    "step_time": float(obs.step_time_s),
                    "peak_mem_gb": float(obs.peak_memory_bytes or 0) / 1e9,
                },
            )
        else:
            self.client.mark_trial_failed(index, failed_reason=obs.status)
