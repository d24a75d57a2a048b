"""The search core's surrogate models: step time, censored peak memory and non-OOM failures.

Log step time: an exact GP (``time_gp``); peak memory: a censored (Tobit) variational GP
(``tobit``); failures: a Bayesian logistic model capped by a culprit model (``feasibility``).
"""

from infrarsi.search.models.feasibility import FeasibilityModel
from infrarsi.search.models.time_gp import fit_time_gp
from infrarsi.search.models.tobit import TobitLikelihood, fit_tobit_gp

__all__ = ["FeasibilityModel", "TobitLikelihood", "fit_time_gp", "fit_tobit_gp"]
