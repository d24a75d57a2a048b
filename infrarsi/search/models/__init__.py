"""Surrogate models of the search core: log step time (exact GP), censored peak memory (Tobit
variational GP) and feasibility against non-OOM failures (Beta-Bernoulli per knob value)."""

from infrarsi.search.models.feasibility import FeasibilityModel
from infrarsi.search.models.time_gp import fit_time_gp
from infrarsi.search.models.tobit import TobitLikelihood, fit_tobit_gp

__all__ = ["FeasibilityModel", "TobitLikelihood", "fit_time_gp", "fit_tobit_gp"]
