"""``Optimizer``: ask/tell Bayesian search over a ``SearchSpace`` with a censored memory model.

::

    opt = Optimizer(space, memory_capacity=80e9, seed=0, baseline={...})
    cfg = opt.ask()                     # dict; opt.last_ask_info (an AskInfo) says why
    opt.tell(cfg, Outcome(status="ok", step_time=1.9, peak_memory=6.1e10))
    opt.best()                          # the config to verify (opt.best_choice(): with why)

The optimizer wires four parts together (``wiring``): the ``History`` of told and pending trials
(``history``), the models fitted on it (``modelset.ModelSet``: step time, censored memory,
feasibility, the analytic prior's columns), the schedule that names the phase of each pick
(``schedule.next_phase``) and the picker of each phase (``pickers``). A config told
oom/failed/timeout/nan/invariant_violation is never proposed again; a config told ok is proposed
again once every other config has been tried or is predicted to fail (``repeat_below_p``). Every
tunable is a field of ``OptimizerSettings`` (``settings``); ``persistence`` reads and writes the
saved state, which each part writes through its own ``to_dict``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from infrarsi.errors import UserInputError
from infrarsi.search import design, persistence
from infrarsi.search.ask_info import AskInfo, Phase, WarmStartOrigin
from infrarsi.search.best_choice import BestChoice
from infrarsi.search.encoding import Encoder
from infrarsi.search.history import History
from infrarsi.search.modelset import torch_threads
from infrarsi.search.outcome import Observation, Outcome
from infrarsi.search.pickers import Round, SearchExhausted
from infrarsi.search.priors.features import PriorFeatures
from infrarsi.search.priors.mean import PriorMean
from infrarsi.search.schedule import Turn
from infrarsi.search.settings import OptimizerSettings
from infrarsi.search.space import SearchSpace
from infrarsi.search.transfer import TransferModel, TransferPrior
from infrarsi.search.wiring import check_capacity, wire


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
            (``transfer``); needs ``prior`` (ignored without one). None or no sources: the
            optimizer is exactly the cold one.
    """

    def __init__(
        self,
        space: SearchSpace,
        memory_capacity: float,
        seed: int = 0,
        baseline: Mapping[str, Any] | None = None,
        *,
        settings: OptimizerSettings | None = None,
        prior: PriorMean | None = None,
        initial_configs: Sequence[Mapping[str, Any]] = (),
        initial_origins: Sequence[WarmStartOrigin | None] = (),
        transfer: TransferPrior | None = None,
    ) -> None:
        self.settings = settings or OptimizerSettings()
        """Every tunable of this optimizer (saved with its state)."""
        self.space = space
        self.memory_capacity = check_capacity(memory_capacity)
        self.seed = int(seed)
        self.baseline = None if baseline is None else space.validate(baseline, where="baseline")
        self.encoder = Encoder(space)
        self.n_init = (
            design.default_n_init(self.encoder.dim)
            if self.settings.n_init is None
            else self.settings.n_init
        )
        """Distinct configs in the initial design (``settings.n_init`` or its default for this space)."""
        self.history = History(space)
        """The told and pending trials, the provenance of each ask and the warm starts still queued."""
        self.last_ask_info: AskInfo | list[AskInfo] | None = None
        """Provenance of the last ask: an ``AskInfo`` for ``ask()``, a list of them for ``ask(n)``."""
        self.rng = np.random.default_rng(self.seed)
        self.prior = prior
        """Analytic prior mean of both models (``infrarsi.search.priors.mean``), or None."""
        parts = wire(
            space,
            self.encoder,
            self.settings,
            prior=prior,
            transfer=transfer,
            memory_capacity=self.memory_capacity,
            baseline=self.baseline,
            rng=self.rng,
            seed=self.seed,
        )
        self.transfer: TransferModel | None = parts.transfer
        """The bank transfer inside the models (``transfer``), or None."""
        self.pool, self.models, self.pickers = parts.pool, parts.models, parts.pickers
        """The configs each ask scores, the models fitted on the history, the picker of each phase."""
        self.history.queue_warm_starts(initial_configs, initial_origins)

    @property
    def observations(self) -> list[Observation]:
        """Every told trial, in order (``History.observations``)."""
        return self.history.observations

    @property
    def pending(self) -> dict[str, dict[str, Any]]:
        """Configs asked and not yet told, by ``space.key`` (``History.pending``)."""
        return self.history.pending

    @property
    def ask_infos(self) -> dict[str, AskInfo]:
        """Provenance of every config asked so far, by ``space.key`` (``History.ask_infos``)."""
        return self.history.ask_infos

    @property
    def initial_queue(self) -> list[tuple[dict[str, Any], WarmStartOrigin | None]]:
        """Warm-start configs not yet asked, with their origins (``History.warm_queue``)."""
        return self.history.warm_queue

    @property
    def n_asks(self) -> int:
        """Number of ``ask()`` calls so far."""
        return self.history.n_asks

    @property
    def prior_features(self) -> PriorFeatures:
        """Model inputs and the analytic prior's fitted coefficients (``ModelSet.features``)."""
        return self.models.features

    def tell(self, config: Mapping[str, Any], outcome: Outcome | Mapping[str, Any]) -> None:
        """Record the outcome of a trial of ``config``."""
        if not isinstance(outcome, Outcome):
            outcome = Outcome.from_dict(outcome)
        obs = self.history.add(self.space.validate(config, where="tell(config)"), outcome)
        self.models.observe(obs.config, obs.outcome)

    # ------------------------------------------------------------------- ask
    def ask(self, n: int | None = None) -> dict[str, Any] | list[dict[str, Any]]:
        """One config (``n`` None) or a list of ``n`` distinct configs, all valid and not yet failed."""
        k = 1 if n is None else int(n)
        if k < 1:
            raise UserInputError(f"ask(n): rule: n must be >= 1; got {n!r}.")
        h = self.history
        rnd = Round(taken=set(h.pending), failed=h.failed_keys())
        baseline_turn = self.pickers.baseline_due(h)
        with torch_threads(self.settings.num_threads):
            torch.manual_seed(self.seed * 100_003 + h.n_asks)
            self.pickers.warm_starts(h, rnd, k, lambda: self._turn(rnd, baseline_turn, True, k, 0))
        for info in rnd.infos:
            h.pending[self.space.key(info.config)] = dict(info.config)
        if len(rnd.infos) < k:
            start = len(rnd.infos)
            with torch_threads(self.settings.num_threads):
                torch.manual_seed(self.seed * 100_003 + h.n_asks)
                self.models.fit(h)
                try:
                    self.pickers.fill(
                        h, rnd, k, lambda base, done: self._turn(rnd, base, False, k - start, done)
                    )
                except SearchExhausted:
                    if not rnd.infos:
                        raise
        for info in rnd.infos:
            key = self.space.key(info.config)
            h.pending[key] = dict(info.config)
            h.ask_infos[key] = info
        h.n_asks += 1
        self.last_ask_info = rnd.infos[0] if n is None else rnd.infos
        configs = [dict(i.config) for i in rnd.infos]
        return configs[0] if n is None else configs

    def _turn(
        self, rnd: Round, baseline_due: bool, warm_turn: bool, remaining: int, model_picks: int
    ) -> Turn:
        """What the schedule reads before the next pick (``schedule.Turn.of``)."""
        return Turn.of(
            self.history,
            self.settings,
            taken=rnd.taken,
            design_size=design.size_now(self.n_init, self.transfer, self.settings),
            time_model_ready=self.models.time.model is not None,
            has_prior=self.prior is not None,
            baseline_due=baseline_due,
            warm_turn=warm_turn,
            remaining=remaining,
            model_picks=model_picks,
        )

    def add_pending(
        self, config: Mapping[str, Any], phase: Phase = Phase.PROPOSAL
    ) -> dict[str, Any]:
        """Record ``config`` (from outside the optimizer: a proposal) as in flight, so later asks
        treat it as pending; returns the validated full config. Tell its outcome as usual."""
        return self.history.add_pending(
            self.space.validate(config, where="add_pending(config)"), Phase(phase)
        )

    def drop_pending(self, config: Mapping[str, Any]) -> bool:
        """Forget an asked config without telling an outcome: its trial never ran (a scheduler gave
        up on it before it started), so nothing is known of it and a later ask may propose it again.
        Returns whether it was pending."""
        key = self.space.key(dict(self.space.validate(config, where="drop_pending(config)")))
        return self.history.pending.pop(key, None) is not None

    # ------------------------------------------------------------ results
    def best(self) -> dict[str, Any] | None:
        """The config to verify, among those told ok (None before any ok trial): the config of
        ``best_choice()`` (the measured-fastest unless the posterior is confident it is slower than
        the posterior-mean best)."""
        choice = self.best_choice()
        return None if choice is None else dict(choice.config)

    def best_choice(self) -> BestChoice | None:
        """``best()`` with its evidence and reason (``best_choice.BestChoice``): the chosen config,
        its posterior mean, its measured median and count, the other pick when the posterior and
        the measurements disagree, and why (None before any ok trial). Never changes what
        ``ask()`` proposes."""
        with torch_threads(self.settings.num_threads):
            return self.models.best_choice(self.history)

    def predict(self, configs: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
        """Posterior predictions: ``step_time_mean_s`` (exp of the mean log time), ``step_time_sd_log``,
        ``memory_mean_bytes``, ``p_fit`` and ``p_ok``, each an array of shape ``(len(configs),)``."""
        full = [self.space.validate(c, where="predict(config)") for c in configs]
        with torch_threads(self.settings.num_threads):
            return self.models.predict(self.history, full, has_prior=self.prior is not None)

    def info(self, config: Mapping[str, Any]) -> AskInfo | None:
        """Provenance recorded when ``config`` was asked (None if it never was)."""
        return self.history.ask_infos.get(self.space.key(self.space.validate(config)))

    # ---------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly where this optimizer is (JSON-able; ``persistence``)."""
        return persistence.state_of(self)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the history, the RNG and the models' state (the space and settings stay those of
        this optimizer)."""
        persistence.restore(self, state)

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Optimizer:
        """A new optimizer (space and settings included) from ``state_dict()``."""
        opt = cls(persistence.space_of(state), **persistence.constructor_args(state))
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
    def from_trials(
        cls,
        space: SearchSpace,
        rows: Iterable[Mapping[str, Any]] | Any,
        *,
        memory_capacity: float,
        stages: tuple[str, ...] | None = None,
        **kwargs: Any,
    ) -> Optimizer:
        """Rebuild from trial-log rows (the history: dicts, or a ``pyarrow.Table``).

        Each row needs ``config`` (a JSON string or a dict) and is told as ``Outcome.from_row``
        reads it. Rows whose config is not valid in ``space`` are skipped with a warning.
        ``stages`` keeps only rows of those stages; ``kwargs`` go to the constructor.
        """
        opt = cls(space, memory_capacity=memory_capacity, **kwargs)
        for cfg, outcome in persistence.history_outcomes(space, rows, stages):
            opt.tell(cfg, outcome)
        return opt
