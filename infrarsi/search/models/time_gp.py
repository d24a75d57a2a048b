"""The step-time model: an exact GP on log seconds over successful trials, with a linear prior mean.

Without an analytic prior, the linear mean's weights of speed-tagged knobs (``Knob.speed``) have
priors centred on the tag's direction (``WeightTilt``): with a handful of trials in a space of ten
knobs the data alone cannot tell which knob made a config fast. Measured with
``benchmarks/search_variants.py`` (no prior, 8 seeds, 24 trials, the two friendly surrogates and
the adversarial tuning split): median best-found/oracle 1.069-1.189 untagged against 1.037-1.145
tagged (``docs/BENCHMARKS.md``).

``SingleTaskGP`` with BoTorch's dimension-scaled lengthscale prior (robust with ~10-20 features and
few points) on the unit-cube features of ``Encoder``. Fits are warm-started from the previous
hyperparameters and capped in iterations, so a refit after one more observation costs little.

The kernel is the smooth (RBF) kernel plus a per-config term: an independent deviation of each
distinct config, sd ``config_sd`` log seconds (``OptimizerSettings.config_deviation_sd``), fixed
(``_config_kernel``). Without it,
a smooth fit (long lengthscales over the analytic prior's residuals) shrinks every config's own
replicates towards its neighbours. In a traced 2-node run, two trials of the oracle averaging
0.7% below its true time were predicted 1.7% above it, behind a config 2.9% slower with one lucky
draw, so ``best()`` recommended the slower one; with the term (sd 0.08) the oracle is predicted
0.2% below its true time and recommended. The sd was chosen on the benchmark problems
(``benchmarks/search_variants.py``, 0.02 to 0.16; see
``benchmarks/results/search_efficiency.md``). It also gives an untried config that much more
predictive spread; the acquisition credits an untried config with only part of it
(``OptimizerSettings.acquisition_config_sd``, ``acquisition_variance_cut``). The term is used only with the
analytic prior (``offset``): without one, the smooth GP is the whole model and the extra spread
made the search explore more, and it did no better (prior off, 8 seeds at 24 trials, one machine:
1.138 / 1.195 on the 1- / 2-node surrogate with the term, against 1.045 / 1.217 without it).

With the prior and ``interaction_sd`` > 0 (off by default), a third fixed term keeps doubt about
knob-value pairs no trial has held together (``models.pair_kernel``), where an interaction the
prior lacks can hide.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from botorch.models import SingleTaskGP
from botorch.models.transforms.outcome import Standardize
from botorch.models.utils.gpytorch_modules import get_covar_module_with_dim_scaled_prior
from botorch.optim.fit import fit_gpytorch_mll_scipy
from gpytorch.kernels import Kernel, MaternKernel, RBFKernel, ScaleKernel
from gpytorch.means import LinearMean
from gpytorch.mlls import ExactMarginalLogLikelihood
from gpytorch.priors import LogNormalPrior, NormalPrior

from infrarsi.search.models.offset_mean import OffsetMean
from infrarsi.search.models.pair_kernel import PairKernel
from infrarsi.search.settings import DEFAULT_SETTINGS

State = dict[str, torch.Tensor]

_IDENTITY_LENGTHSCALE = 1e-3
"""Lengthscale of the per-config term: distinct configs differ by at least one knob step (>= 1/63
of the unit cube for any knob with up to 64 values), where this kernel is exp(-125) ~ 0."""


def hyper_state(model: torch.nn.Module) -> State:
    """The model's learned parameters (no training data, no outcome-transform buffers)."""
    return {
        k: v.detach().clone()
        for k, v in model.state_dict().items()
        if not k.startswith("outcome_transform") and "train" not in k
    }


def _linear_mean(d: int, tilt: WeightTilt | None = None) -> LinearMean:
    """An additive first-order prior mean (log step time is close to a sum of per-knob effects)
    with ``N(0, 1)`` priors on the weights (outputs are standardised), so few points do not overfit.
    ``tilt``: the speed-tagged features' weights get ``N(loc, sd^2)`` priors instead, and start at
    their ``loc``."""
    mean = LinearMean(input_size=d).to(torch.float64)
    if tilt is None:
        mean.register_prior("weights_prior", NormalPrior(0.0, 1.0), "weights")
        with torch.no_grad():
            mean.weights.zero_()
            mean.bias.zero_()
        return mean
    loc, sd = tilt.loc_and_sd(d)
    mean.register_prior("weights_prior", NormalPrior(loc, sd), "weights")
    with torch.no_grad():
        mean.weights.copy_(loc)
        mean.bias.zero_()
    return mean


@dataclass(frozen=True)
class WeightTilt:
    """The speed tags' claim on the linear mean's weights (``Knob.speed``): the prior mean of
    feature ``indices[i]``'s weight is ``signs[i] * weight`` (standardised log seconds per unit of
    the feature), with sd ``sd``; every other weight keeps ``N(0, 1)``."""

    indices: tuple[int, ...]
    """Features of the speed-tagged knobs."""
    signs: tuple[float, ...]
    """+1 where the feature grows towards slower steps, -1 towards faster ones."""
    weight: float
    """Size of the claimed effect (``OptimizerSettings.speed_prior_weight``)."""
    sd: float
    """Sd of each claimed weight (``OptimizerSettings.speed_prior_sd``)."""

    def loc_and_sd(self, d: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(d, 1)`` prior means and sds of the weights."""
        loc = torch.zeros(d, 1, dtype=torch.float64)
        sd = torch.ones(d, 1, dtype=torch.float64)
        for i, sign in zip(self.indices, self.signs, strict=True):
            loc[i, 0], sd[i, 0] = sign * self.weight, self.sd
        return loc, sd


def _config_kernel(d: int) -> ScaleKernel:
    """An identity kernel over distinct configs (1 on the same features, ~0 elsewhere) with a
    fixed scale, set per fit in standardised units (``_set_fixed_scales``)."""
    k = ScaleKernel(RBFKernel(active_dims=list(range(d))))
    k.base_kernel.lengthscale = _IDENTITY_LENGTHSCALE
    k.base_kernel.raw_lengthscale.requires_grad_(False)
    k.raw_outputscale.requires_grad_(False)
    return k


def _smooth_kernel(d: int, kernel: str, active_dims: list[int] | None) -> Kernel:
    """The smooth kernel over ``d`` features: BoTorch's dimension-scaled RBF, or a Matern-5/2 with
    the same lengthscale prior (``OptimizerSettings.time_kernel``)."""
    if kernel == "matern":
        prior = LogNormalPrior(loc=math.sqrt(2) + 0.5 * math.log(d), scale=math.sqrt(3))
        return MaternKernel(
            nu=2.5, ard_num_dims=d, lengthscale_prior=prior, active_dims=active_dims
        ).double()
    return get_covar_module_with_dim_scaled_prior(ard_num_dims=d, active_dims=active_dims)


def _pair_kernel(groups: tuple[tuple[int, int], ...]) -> ScaleKernel:
    """The knob-value pair term (``models.pair_kernel``) with a fixed scale, set per fit in
    standardised units (``_set_fixed_scales``)."""
    k = ScaleKernel(PairKernel(groups))
    k.raw_outputscale.requires_grad_(False)
    return k


def _covar(
    d: int,
    config_sd: float,
    kernel: str,
    pairs: tuple[tuple[int, int], ...] = (),
    interaction_sd: float = 0.0,
) -> Kernel:
    out: Kernel = _smooth_kernel(d, kernel, list(range(d)))
    if config_sd > 0:
        out = out + _config_kernel(d)
    if interaction_sd > 0 and pairs:
        out = out + _pair_kernel(pairs)
    return out


def _fixed_terms(model: SingleTaskGP) -> tuple[ScaleKernel | None, ScaleKernel | None]:
    """The model's per-config term and knob-value pair term (None where it has none)."""
    config = pair = None
    for k in getattr(model.covar_module, "kernels", ())[1:]:
        if isinstance(k, ScaleKernel) and isinstance(k.base_kernel, PairKernel):
            pair = k
        elif isinstance(k, ScaleKernel):
            config = k
    return config, pair


def _set_fixed_scales(model: SingleTaskGP, config_sd: float, interaction_sd: float) -> None:
    """Put the fixed terms' variances (``config_sd**2`` and ``interaction_sd**2`` in log seconds)
    in the model's standardised units (the outcome's sd changes from fit to fit)."""
    config, pair = _fixed_terms(model)
    tf: Any = model.outcome_transform
    sd = max(float(tf.stdvs.reshape(())), 1e-6)
    with torch.no_grad():
        for term, term_sd in ((config, config_sd), (pair, interaction_sd)):
            if term is not None:
                term.outputscale = max((term_sd / sd) ** 2, 1e-12)


def acquisition_variance_cut(model: SingleTaskGP, config_sd: float, acquisition_sd: float) -> float:
    """What the acquisition takes off an untried config's posterior variance (log seconds squared):
    ``config_sd**2 - acquisition_sd**2`` when the model has the per-config term, else 0. An untried
    config's posterior of the term is its prior, so the cut leaves the smooth model's uncertainty
    plus ``acquisition_sd**2`` (``OptimizerSettings.acquisition_config_sd``). The knob-value pair
    term is credited in full: it is the acquisition's reason to leave the prior's basin."""
    if _fixed_terms(model)[0] is None:
        return 0.0
    return max(config_sd**2 - acquisition_sd**2, 0.0)


def _build(
    train_X: torch.Tensor,
    Y: torch.Tensor,
    offset: tuple[int, int] | None,
    config_sd: float,
    kernel: str,
    tilt: WeightTilt | None = None,
    pairs: tuple[tuple[int, int], ...] = (),
    interaction_sd: float = 0.0,
) -> SingleTaskGP:
    if (
        offset is None
    ):  # no analytic prior: BoTorch's default kernel, no per-config term (module docstring)
        d = train_X.shape[-1]
        covar = {} if kernel == "rbf" else {"covar_module": _smooth_kernel(d, kernel, None)}
        return SingleTaskGP(
            train_X,
            Y,
            outcome_transform=Standardize(m=1),
            mean_module=_linear_mean(d, tilt),
            **covar,
        )
    d, column = offset
    mean = OffsetMean(_linear_mean(d), d, column)
    model = SingleTaskGP(
        train_X,
        Y,
        outcome_transform=Standardize(m=1),
        mean_module=mean,
        covar_module=_covar(d, config_sd, kernel, pairs, interaction_sd),
    )
    _set_fixed_scales(model, config_sd, interaction_sd)
    return model


def _standardize_offset(model: SingleTaskGP) -> None:
    if isinstance(model.mean_module, OffsetMean):
        tf: Any = model.outcome_transform
        model.mean_module.set_standardization(tf.means.reshape(()), tf.stdvs.reshape(()))


def fit_time_gp(
    train_X: torch.Tensor,
    log_step_time: torch.Tensor,
    warm: State | None = None,
    maxiter: int = 60,
    offset: tuple[int, int] | None = None,
    *,
    config_sd: float = DEFAULT_SETTINGS.config_deviation_sd,
    kernel: str = DEFAULT_SETTINGS.time_kernel,
    tilt: WeightTilt | None = None,
    pairs: tuple[tuple[int, int], ...] = (),
    interaction_sd: float = DEFAULT_SETTINGS.interaction_sd,
) -> tuple[SingleTaskGP, State]:
    """Fit the GP.

    Args:
        train_X: ``(n, d)`` features in [0, 1], float64.
        log_step_time: ``(n,)`` log seconds per step.
        warm: parameters of a previous fit to start from (same ``d``), or None.
        maxiter: L-BFGS iteration cap.
        offset: ``(d, column)``: only the first ``d`` columns are features; ``column`` holds a known
            log-time offset (the analytic prior), added to the mean and ignored by the kernel
            (``OffsetMean``).
        config_sd: sd (log seconds) of the per-config term, used only with ``offset`` (0: none).
        kernel: the smooth kernel, ``rbf`` or ``matern``.
        tilt: the speed tags' prior on the linear mean's weights, used only without ``offset``
            (with an analytic prior the prior carries the knobs' effects), or None.
        pairs: per knob, the ``(start, width)`` of its feature columns (``Encoder.groups``), for
            the knob-value pair term (``models.pair_kernel``).
        interaction_sd: sd (log seconds) of that term, used only with ``offset`` and ``pairs``
            (0: none).

    Returns:
        The fitted model in eval mode, and its parameters (for the next warm start).
    """
    Y = log_step_time.reshape(-1, 1).to(torch.float64)
    if (
        Y.shape[0] > 1 and float(Y.std()) < 1e-9
    ):  # all equal: add a hint of spread to stay well posed
        Y = Y + 1e-6 * torch.arange(Y.shape[0], dtype=torch.float64).reshape(-1, 1)
    tilt = tilt if offset is None and tilt is not None and tilt.indices else None
    model = _build(train_X, Y, offset, config_sd, kernel, tilt, pairs, interaction_sd)
    if warm is not None:
        with contextlib.suppress(RuntimeError):  # shapes changed (another space): start fresh
            torch.nn.Module.load_state_dict(model, warm, strict=False)
        _set_fixed_scales(model, config_sd, interaction_sd)  # the warm state: the last fit's units
    _standardize_offset(model)
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    mll.train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if maxiter > 0:
                fit_gpytorch_mll_scipy(mll, options={"maxiter": maxiter})
        except Exception:  # numerical trouble: fall back to the prior-initialised model
            model = _build(train_X, Y, offset, config_sd, kernel, tilt, pairs, interaction_sd)
            _standardize_offset(model)
    model.eval()
    return model, hyper_state(model)


def state_to_json(state: State | None) -> dict[str, Any] | None:
    """Tensors -> nested lists (for ``Optimizer.state_dict``)."""
    if state is None:
        return None
    return {
        k: {
            "shape": list(v.shape),
            "dtype": str(v.dtype).replace("torch.", ""),
            "data": v.reshape(-1).tolist(),
        }
        for k, v in state.items()
    }


def state_from_json(raw: dict[str, Any] | None) -> State | None:
    """Inverse of ``state_to_json``."""
    if raw is None:
        return None
    return {
        k: torch.tensor(v["data"], dtype=getattr(torch, v.get("dtype", "float64"))).reshape(
            v["shape"]
        )
        for k, v in raw.items()
    }
