"""``OptimizerSettings``: every tunable of the search core in one typed, saved record.

The constructor options (``censoring``, ``pairing``, ``n_init``, ...) and the constants that steer
the optimizer's decisions (the ask schedule, the design, pairing, the prior's coefficient fits, the
GPs' refit schedule and kernel, outlier trimming, the feasibility model) live here, and nowhere
else: ``Optimizer`` hands them to its collaborators and models explicitly, and saves them with its
state, so a variant (``benchmarks/search_variants.py``) is rebuilt exactly from a saved state.
The defaults are the tuned values of the benchmark problems (``benchmarks/``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from infrarsi.errors import UserInputError
from infrarsi.search.outcome import FAILURE_STATUSES
from infrarsi.search.space import ENUMERATION_LIMIT

DESIGN_RULES = ("coverage", "maximin")
"""Initial-design rules (``OptimizerSettings.design_rule``)."""
EXPLORE_RULES = ("near", "far", "batch")
"""Where an exploring turn looks (``OptimizerSettings.explore_rule``)."""
WARM_START_RULES = ("copy", "mapped", "alternate", "portfolio")
"""What a warm-start turn asks (``OptimizerSettings.warm_start_rule``)."""
TIME_KERNELS = ("rbf", "matern")
"""Smooth step-time kernels (``OptimizerSettings.time_kernel``)."""


def _failure_weight() -> dict[str, float]:
    return {"failed": 1.0, "timeout": 1.0, "nan": 2.0, "invariant_violation": 3.0}


@dataclass(frozen=True)
class OptimizerSettings:
    """The optimizer's options and decision constants (module docstring). Build variants with
    ``dataclasses.replace(settings, field=value)``; ``to_dict`` / ``from_dict`` round-trip them."""

    # ------------------------------------------------------------ options
    censoring: bool = True
    """Tell OOMs to the memory model as censored points (the true peak is at least the capacity or
    the recorded bound); False drops them from it (the ablation)."""
    pairing: bool = True
    """Memory-saver pairing: repair a fast candidate the memory model says will not fit (``pairing``)."""
    n_init: int | None = None
    """Distinct configs in the initial design, the baseline included (None: ``design.default_n_init``)."""
    candidate_cap: int = 20_000
    """Above this many valid configs, an ask scores a random subset of half this size plus anchors
    (the baseline, the neighbours of the five fastest ok configs, the fastest one's
    ``local_radius`` neighbourhood) instead of every config (``candidates``)."""
    num_threads: int | None = 1
    """Torch threads while fitting and scoring (None: torch's own setting)."""
    local_every: int = 2
    """Every ``local_every``-th model-based ask is a local step around the incumbent (0: never)."""
    explore_every: int = 0
    """Every ``explore_every``-th local step is an exploring turn (``Phase.EXPLORE``, 0: never),
    where ``explore_rule`` says. A prior that ranks a value or a region last otherwise keeps it
    untried, however wrong the prior is there."""
    explore_rule: str = "near"
    """``near``: the acquisition's best among the incumbent's neighbours (``local_radius``) that
    hold a knob value never measured near it; ``far``: the acquisition's best among configs more
    than ``local_radius`` knob changes from every config tried (a region never measured);
    ``batch``: the last pick of a greedy batch of ``explore_batch`` (qLogNEI with the batch's
    earlier picks fantasised as pending: the diversity a cluster's slots give, in one pick)."""
    explore_batch: int = 4
    """The batch size of ``explore_rule="batch"`` (its last pick is asked)."""
    intensify: bool = True
    """A local step re-measures the incumbent instead while it has only one trusted measurement
    (SMAC-style intensification: a single lucky draw must not decide ``best()``)."""
    replicate_min_p: float = 0.0
    """Re-measure the incumbent only while the posterior gives the runner-up (the next distinct
    ok config by posterior mean) at least this probability of being faster: a replicate that
    cannot change the decision goes to a local step instead (0: always, as intensification was)."""

    # ------------------------------------------------------- ask schedule
    repeat_below_p: float = 0.05
    """When every untried config is this unlikely to run (P(fit) x P(no failure)), configs told ok
    compete again (a replicate of a near-best config is worth more than a near-certain OOM)."""
    repeat_check_max: int = 1000
    """The check above runs only while at most this many configs are untried (it scores them once
    more; in a larger space an untried config that may fit is almost always left)."""
    prior_only_memory_sd: float = 0.3
    """Sd of log peak memory around the analytic prior before a memory model exists (< 2 trials)."""
    local_radius: int = 2
    """A local step scores only configs within this many knob changes of the incumbent."""
    enumeration_limit: int = ENUMERATION_LIMIT
    """Spaces with more valid configs than this are not enumerated: candidates are then sampled
    and encoded per ask (``SearchSpace.enumerate_values``)."""

    best_confidence: float = 0.9
    """``best()`` recommends the measured-fastest config unless the posterior gives at least this
    probability that it is slower than the posterior-mean best (``best_choice``; 0.5 or less: the
    posterior-mean best whenever the two differ). Read by ``best()`` only, never by ``ask()``."""

    # ------------------------------------------------------------- design
    design_pool: int = 4000
    """Candidates considered per design pick (a random subset of the allowed configs)."""
    design_rule: str = "coverage"
    """``coverage``: value novelty plus weighted maximin distance (``design.coverage_pick``);
    ``maximin``: the older pure-maximin design (``design.maximin_pick``), a benchmark variant."""
    design_distance_weight: float = 0.5
    """Weight of the normalised maximin distance next to the value novelty (both in [0, 1])."""

    # -------------------------------------------------------- acquisition
    batch_choices: int = 256
    """How many top analytic candidates the batch (qLogNEI) acquisition chooses among."""
    acquisition_sd_scale: float = 1.0
    """Multiplies the step-time posterior sd in the analytic acquisition (< 1 exploits more, > 1
    explores more; 1 leaves it as the model says)."""

    # ------------------------------------------------------------ pairing
    pairing_trigger: float = 0.5
    """Repair a chosen candidate whose P(fit) is below this."""
    pairing_target: float = 0.7
    """A repair must reach at least this P(fit)."""
    pair_sources: int = 4
    """Before the pick: how many fast-but-too-big candidates are repaired."""
    pair_source_scan: int = 64
    """... looked for among this many candidates with the best unconstrained acquisition."""
    repair_max_steps: int = 3
    """A repair is at most this many one-value memory-saving moves from its candidate."""

    # --------------------------------------- analytic prior coefficient fits
    prior_time_noise_sd: float = 0.15
    """Assumed sd of log step time around the fitted prior (model misfit, not only timing noise)."""
    prior_memory_noise_sd: float = 0.10
    """Assumed sd of log peak memory around the fitted prior."""
    prior_time_coef_sd: float = 1.5
    """Sd of each step-time log coefficient's normal prior around 0 (the nominal hardware figures)."""
    prior_memory_coef_sd: float = 1.5
    """Sd of each memory log coefficient's normal prior around 0 (the nominal figures)."""
    prior_fit_iters: int = 60
    """L-BFGS iterations of a coefficient fit."""

    # ------------------------------------- transfer from the experience bank
    transfer: bool = True
    """Use a bank ``TransferPrior`` given to the optimizer inside the models (``search.transfer``);
    False ignores it (the ablation: the warm-start configs alone)."""
    transfer_n_init: int | None = None
    """Distinct configs in the initial design while a bank transfer prior holds weight
    (``search.transfer``; the baseline included, warm-start configs counted; None: the cold
    design's size). Measured at 2 (``docs/BENCHMARKS.md``, transfer, 2026-12-04): the
    intensification turn then came right after the warm-start configs and re-ran a mediocre one;
    not the default."""
    warm_start_rule: Literal["copy", "mapped", "alternate", "portfolio"] = "alternate"
    """What each warm-start turn (one per queued bank config) asks while a bank transfer holds
    weight. ``copy``: the bank's config as measured by its study (made to fit when this study's
    model expects it not to). ``mapped``: this study's best config under the transferred prior
    (the sources' fitted coefficients on this study's own formulas, which carry its card and
    model size, plus their residual): where the optimum moves with the hardware or the model,
    the map moves it too. ``alternate``: mapped, copy, mapped... Under both, a turn after this
    study's trials ranked the transfer down to weight 0 is dropped (that bank's configs are not
    copied either). Without a transfer every turn copies. The default, ``alternate``, needed
    fewer median trials than ``copy`` on 3 of the 4 transfer tasks with a real bank and 3 of 4
    with a scrambled one (32 seeds); ``mapped`` was the best rule on some tasks and the worst on
    others (``docs/BENCHMARKS.md``, transfer)."""
    warm_start_pool: int = 4
    """The bank's warm-start configs are chosen for spread among this many times as many of its
    best configs (the best, then each time the one sharing the fewest knob values with those
    chosen), and a copy turn asks the queued config farthest from the warm starts already asked:
    copies hedge the region the first warm start tried instead of repeating it. 1: the bank's
    best configs, best first. Measured over 4 banks and 16 seeds, 4 took as few or fewer median
    trials than 1 on all four transfer tasks (``docs/BENCHMARKS.md``, transfer, 2026-12-07)."""
    transfer_rank_tie_log: float = 0.03
    """Two trials whose log step times differ by at most this do not count when the transfer
    weight is chosen by ranking (timing noise, ~3%)."""
    transfer_trust_p: float = 0.05
    """A bank transfer starts trusted (weights 1) only if its time centre ranks the bank's own
    trials better than chance at this one-sided p-value (``search.transfer.TimeRankCheck``: out of
    sample, Kendall's tau); otherwise its step times are not used (weights 0 for the whole study,
    and under the ``mapped`` and ``alternate`` rules no warm starts; its peaks still are). 1:
    every bank is trusted."""
    transfer_memory_sd_floor: float = 0.02
    """Least sd of log peak memory around the transferred memory coefficients before this study
    has a memory model (``TransferModel.memory_sd``: their error on the sources' own peaks,
    measured out of sample, is the sd otherwise; capped by ``prior_only_memory_sd``). The floor
    allows for the target's size and card, which no source shares."""

    # ------------------------------------------------------------ the GPs
    full_refit_growth: float = 1.4
    """A full refit of a GP happens when its data grew by this factor since the last full one."""
    time_gp_iters: tuple[int, int, int] = (150, 50, 8)
    """L-BFGS iterations of the step-time GP: first fit, full (warm-started) refit, light refit."""
    memory_gp_iters: tuple[int, int, int] = (200, 60, 12)
    """L-BFGS iterations of the Tobit memory GP: first fit, full refit, light refit."""
    memory_calibration_window: int = 12
    """The memory model's most recent prequential checks (its predictions of configs it had not
    seen, before it learned from them) that set the extra sd on its predictions
    (``models.memory_calibration``; 0: no extra sd, the model's own)."""
    memory_calibration_prior_sd: float = 0.5
    """Sd (log bytes) of the half-normal prior on that extra sd."""
    config_deviation_sd: float = 0.08
    """Sd (log seconds) of each distinct config's own deviation from the smooth step-time model,
    used with the analytic prior (0: no per-config term; ``models/time_gp``). Chosen on the
    benchmark problems (``benchmarks/search_variants.py``, 0.02 to 0.16)."""
    acquisition_config_sd: float = 0.04
    """Sd (log seconds) of the per-config deviation that the acquisition credits an untried config
    with (``time_gp.acquisition_variance_cut``). The model's 0.08 is sized for recommendation;
    credited in full, it made every untried neighbour of the incumbent an 8% lottery ticket."""
    interaction_sd: float = 0.0
    """Sd (log seconds) of the step-time model's knob-value pair term, used with the analytic
    prior (``models.pair_kernel``; 0: no term): the doubt kept about every pair of knob values
    that no measured config has held together, where an interaction the prior lacks could hide."""
    speed_prior_weight: float = 1.0
    """Without an analytic prior, the prior mean of each speed-tagged knob's weight in the
    step-time model's linear mean (``Knob.speed``; standardised log seconds over the knob's whole
    range; ``models.time_gp.WeightTilt``). 0: the tags are ignored, every weight ``N(0, 1)``."""
    speed_prior_sd: float = 0.5
    """Sd of those weights' priors (the trials overrule a tag within a few sds)."""
    time_kernel: str = "rbf"
    """Smooth step-time kernel: ``rbf`` (BoTorch's, with its dimension-scaled lengthscale prior) or
    ``matern`` (Matern-5/2 with the same prior), a benchmark variant."""

    # ----------------------------------------------- slow-outlier trimming
    outlier_screen_z: float = 1.0
    """A point is tested by a refit only if its closed-form leave-one-out z-score is above this."""
    outlier_max_tests: int = 1
    """At most this many candidates (largest z first) are tested by a refit per round."""
    outlier_z: float = 3.0
    """A tested point is an outlier when it is this many predictive sds slower than the refit predicts."""
    outlier_min_log: float = 0.12
    """... and at least this much slower in log seconds (~13%: 3 sds of a 4% run-to-run noise)."""
    outlier_min_points: int = 6
    """Fewer ok measurements than this: no trimming (the leave-one-out fits are too loose)."""
    outlier_max_fraction: float = 0.15
    """At most this fraction of the points (rounded down, at least 1) is trimmed."""

    # ------------------------------------------------- feasibility model
    failure_weight: dict[str, float] = field(default_factory=_failure_weight)
    """How many failures one outcome of each non-OOM failure status counts for (every status of
    ``outcome.FAILURE_STATUSES``)."""
    feasibility_base_failure_rate: float = 0.05
    """Prior mean of the failure rate: the logistic model's intercept is centred on its logit."""
    feasibility_bias_sd: float = 1.5
    """Prior sd of the logistic model's intercept."""
    feasibility_weight_sd: float = 2.0
    """Prior sd of each (knob, value) weight of the logistic model."""
    culprit_prior: float = 1.0
    """Pseudo-count against blame in the culprit model (one full failure share makes blame 1/2 with
    weight 1; an invariant violation, weight 3, makes it 3/4)."""

    def __post_init__(self) -> None:
        for name in ("censoring", "pairing", "intensify", "transfer"):
            _rule(
                isinstance(getattr(self, name), bool),
                name,
                "must be true or false",
                getattr(self, name),
            )
        _rule(
            self.n_init is None or _count(self.n_init),
            "n_init",
            "must be None or an integer >= 0",
            self.n_init,
        )
        _rule(
            _count(self.warm_start_pool) and self.warm_start_pool >= 1,
            "warm_start_pool",
            "must be an integer >= 1",
            self.warm_start_pool,
        )
        _rule(
            self.transfer_n_init is None or _count(self.transfer_n_init),
            "transfer_n_init",
            "must be None or an integer >= 0",
            self.transfer_n_init,
        )
        _rule(
            _count(self.candidate_cap) and self.candidate_cap >= 2,
            "candidate_cap",
            "must be an integer >= 2",
            self.candidate_cap,
        )
        _rule(
            self.num_threads is None or (_count(self.num_threads) and self.num_threads >= 1),
            "num_threads",
            "must be None or an integer >= 1",
            self.num_threads,
        )
        for name in (
            "local_every",
            "explore_every",
            "repeat_check_max",
            "local_radius",
            "enumeration_limit",
            "design_pool",
            "batch_choices",
            "pair_sources",
            "pair_source_scan",
            "repair_max_steps",
            "prior_fit_iters",
            "outlier_max_tests",
            "outlier_min_points",
            "memory_calibration_window",
        ):
            _rule(_count(getattr(self, name)), name, "must be an integer >= 0", getattr(self, name))
        for name in (
            "repeat_below_p",
            "pairing_trigger",
            "pairing_target",
            "outlier_max_fraction",
            "best_confidence",
            "replicate_min_p",
        ):
            v = getattr(self, name)
            _rule(_number(v) and 0.0 <= v <= 1.0, name, "must be a probability in [0, 1]", v)
        for name in ("feasibility_base_failure_rate",):
            v = getattr(self, name)
            _rule(_number(v) and 0.0 < v < 1.0, name, "must be in (0, 1)", v)
        for name in (
            "prior_only_memory_sd",
            "prior_time_noise_sd",
            "prior_memory_noise_sd",
            "prior_time_coef_sd",
            "prior_memory_coef_sd",
            "feasibility_bias_sd",
            "feasibility_weight_sd",
            "acquisition_sd_scale",
            "culprit_prior",
            "memory_calibration_prior_sd",
            "speed_prior_sd",
        ):
            v = getattr(self, name)
            _rule(_number(v) and v > 0, name, "must be a finite number > 0", v)
        for name in (
            "design_distance_weight",
            "config_deviation_sd",
            "acquisition_config_sd",
            "outlier_min_log",
            "outlier_screen_z",
            "outlier_z",
            "transfer_rank_tie_log",
            "transfer_memory_sd_floor",
            "speed_prior_weight",
            "interaction_sd",
        ):
            v = getattr(self, name)
            _rule(_number(v) and v >= 0, name, "must be a finite number >= 0", v)
        _rule(
            _number(self.transfer_trust_p) and 0 < self.transfer_trust_p <= 1,
            "transfer_trust_p",
            "must be a p-value in (0, 1]",
            self.transfer_trust_p,
        )
        _rule(
            _number(self.full_refit_growth) and self.full_refit_growth >= 1.0,
            "full_refit_growth",
            "must be >= 1",
            self.full_refit_growth,
        )
        for name in ("time_gp_iters", "memory_gp_iters"):
            v = getattr(self, name)
            _rule(
                isinstance(v, (tuple, list)) and len(v) == 3 and all(_count(x) for x in v),
                name,
                "must be three integers >= 0 (first fit, full refit, light refit)",
                v,
            )
            object.__setattr__(self, name, tuple(v))
        _rule(
            self.design_rule in DESIGN_RULES,
            "design_rule",
            f"must be one of {list(DESIGN_RULES)}",
            self.design_rule,
        )
        _rule(
            _count(self.explore_batch) and self.explore_batch >= 1,
            "explore_batch",
            "must be an integer >= 1",
            self.explore_batch,
        )
        _rule(
            self.explore_rule in EXPLORE_RULES,
            "explore_rule",
            f"must be one of {list(EXPLORE_RULES)}",
            self.explore_rule,
        )
        _rule(
            self.warm_start_rule in WARM_START_RULES,
            "warm_start_rule",
            f"must be one of {list(WARM_START_RULES)}",
            self.warm_start_rule,
        )
        _rule(
            self.time_kernel in TIME_KERNELS,
            "time_kernel",
            f"must be one of {list(TIME_KERNELS)}",
            self.time_kernel,
        )
        weights = self.failure_weight
        _rule(
            isinstance(weights, Mapping)
            and set(weights) == set(FAILURE_STATUSES)
            and all(_number(w) and w > 0 for w in weights.values()),
            "failure_weight",
            f"must give a weight > 0 to each of {list(FAILURE_STATUSES)}",
            weights,
        )
        object.__setattr__(self, "failure_weight", dict(weights))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (``from_dict`` inverts it)."""
        out = dataclasses.asdict(self)
        out["time_gp_iters"], out["memory_gp_iters"] = (
            list(self.time_gp_iters),
            list(self.memory_gp_iters),
        )
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> OptimizerSettings:
        """Inverse of ``to_dict``; a field missing from ``raw`` takes its default."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - names)
        if unknown:
            raise UserInputError(
                f"OptimizerSettings: rule: unknown setting(s) {unknown}; known: {sorted(names)}."
            )
        values = dict(raw)
        for name in ("time_gp_iters", "memory_gp_iters"):
            if name in values:
                values[name] = tuple(values[name])
        return cls(**values)


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _rule(ok: bool, name: str, rule: str, value: Any) -> None:
    if not ok:
        raise UserInputError(f"OptimizerSettings.{name}: rule: {rule}; got {value!r}.")


DEFAULT_SETTINGS = OptimizerSettings()
"""The tuned defaults (the default arguments of the models' fit functions come from here)."""
