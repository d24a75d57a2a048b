"""``benchmarks/search_variants.py``: a variant's options become ``OptimizerSettings`` (no module
globals patched), the names earlier runs used included."""

from __future__ import annotations

import pytest

from benchmarks.search_variants import variant_settings
from infrarsi.errors import UserInputError
from infrarsi.search import OptimizerSettings


def test_variant_options_become_settings_and_the_rest_stays_optimizer_options() -> None:
    settings, rest = variant_settings(
        {
            "local_every": 3,
            "local_radius": 1,
            "config_sd": 0.04,
            "acq_config_sd": 0.02,
            "sd_scale": 0.7,
            "coef_prior_sd": 1.0,
            "time_noise_sd": 0.1,
            "design": "maximin",
            "kernel": "matern",
            "outliers": "off",
            "prior": None,
        }
    )
    assert rest == {"prior": None}
    assert settings == OptimizerSettings(
        local_every=3,
        local_radius=1,
        config_deviation_sd=0.04,
        acquisition_config_sd=0.02,
        acquisition_sd_scale=0.7,
        prior_time_coef_sd=1.0,
        prior_time_noise_sd=0.1,
        design_rule="maximin",
        time_kernel="matern",
        outlier_min_points=10**9,
    )
    assert variant_settings({}) == (OptimizerSettings(), {})
    with pytest.raises(UserInputError, match="design_rule"):
        variant_settings({"design": "random"})
