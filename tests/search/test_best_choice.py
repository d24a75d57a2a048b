"""The rule behind ``Optimizer.best()`` (``best_choice.py``): the measured-fastest config unless the
posterior is confident it is slower than the posterior-mean best, with the reason recorded."""

from __future__ import annotations

import math

import numpy as np
import pytest

from infrarsi.search.best_choice import (
    BEST_REASONS,
    Evidence,
    choose,
    evidence_by_config,
    measured_pick,
)

FAST_ONCE = Evidence({"c": "fast_once"}, measured_median_s=2.45, n_measured=1)
"""Measured once, the fastest measurement."""
SLOW_THRICE = Evidence({"c": "slow_thrice"}, measured_median_s=2.50, n_measured=3)
"""Measured three times, a little slower."""


def _cov(sd_fast: float, sd_slow: float, rho: float = 0.0) -> np.ndarray:
    c = rho * sd_fast * sd_slow
    return np.array([[sd_fast**2, c], [c, sd_slow**2]])


def test_evidence_is_the_median_and_count_of_each_config_in_first_seen_order() -> None:
    rows = [
        ("b", {"k": "b"}, 3.0),
        ("a", {"k": "a"}, 2.0),
        ("b", {"k": "b"}, 1.0),
        ("b", {"k": "b"}, 2.0),
    ]
    ev = evidence_by_config(rows)
    assert [(e.config["k"], e.measured_median_s, e.n_measured) for e in ev] == [
        ("b", 2.0, 3),
        ("a", 2.0, 1),
    ]
    assert measured_pick(ev) == 0  # a tie on the median: the config measured more often


def test_without_a_model_the_measured_fastest_is_chosen() -> None:
    choice = choose([SLOW_THRICE, FAST_ONCE], None, None, 0.9)
    assert choice.config == FAST_ONCE.config and choice.reason == "measured_only"
    assert choice.alternative is None and choice.p_measured_slower is None


def test_agreement_is_named_as_such() -> None:
    choice = choose([SLOW_THRICE, FAST_ONCE], np.log([2.5, 2.44]), _cov(0.04, 0.02), 0.9)
    assert choice.config == FAST_ONCE.config
    assert choice.reason == "posterior_and_measured_agree"
    assert (choice.measured_median_s, choice.n_measured) == (2.45, 1)


def test_an_uncertain_posterior_does_not_overrule_the_faster_measurement() -> None:
    """The posterior mean puts the thrice-measured config 1% ahead, but the once-measured one's
    sd is 4%: far from confident, so the measured-fastest is chosen and the other is named."""
    choice = choose([SLOW_THRICE, FAST_ONCE], np.log([2.48, 2.505]), _cov(0.02, 0.04), 0.9)
    assert choice.config == FAST_ONCE.config
    assert choice.reason == "measured_faster_posterior_uncertain"
    assert choice.alternative == SLOW_THRICE
    assert choice.p_measured_slower is not None and 0.5 < choice.p_measured_slower < 0.9
    assert "P=0." in choice.explain() and "1 trial" in choice.explain()


def test_a_confident_posterior_overrules_a_lucky_draw() -> None:
    choice = choose([SLOW_THRICE, FAST_ONCE], np.log([2.45, 2.60]), _cov(0.02, 0.02), 0.9)
    assert choice.config == SLOW_THRICE.config
    assert choice.reason == "posterior_confident_measured_slower"
    assert choice.alternative == FAST_ONCE
    assert choice.p_measured_slower is not None and choice.p_measured_slower >= 0.9


def test_replicates_shrink_the_doubt_and_correlation_counts() -> None:
    """The same gap in posterior means is conclusive when both configs are pinned down (small sds)
    or move together (a positive correlation), and not when the fast one is loose."""
    mean = np.log([2.48, 2.53])  # posterior means: slow_thrice, fast_once
    loose = choose([SLOW_THRICE, FAST_ONCE], mean, _cov(0.015, 0.05), 0.9)
    tight = choose([SLOW_THRICE, FAST_ONCE], mean, _cov(0.01, 0.01), 0.9)
    together = choose([SLOW_THRICE, FAST_ONCE], mean, _cov(0.03, 0.03, rho=0.9), 0.9)
    assert loose.reason == "measured_faster_posterior_uncertain"
    assert tight.reason == together.reason == "posterior_confident_measured_slower"
    assert (
        loose.p_measured_slower is not None
        and tight.p_measured_slower is not None
        and loose.p_measured_slower < tight.p_measured_slower
    )


@pytest.mark.parametrize("confidence", [0.0, 0.5])
def test_a_confidence_of_one_half_or_less_is_the_posterior_mean_rule(confidence: float) -> None:
    choice = choose([SLOW_THRICE, FAST_ONCE], np.log([2.49, 2.50]), _cov(0.04, 0.04), confidence)
    assert choice.config == SLOW_THRICE.config


def test_the_record_is_json_able_with_its_reason_and_sentence() -> None:
    import json

    choice = choose([SLOW_THRICE, FAST_ONCE], np.log([2.48, 2.505]), _cov(0.02, 0.04), 0.9)
    raw = json.loads(json.dumps(choice.to_dict()))
    assert raw["reason"] in BEST_REASONS and raw["why"] == choice.explain()
    assert raw["alternative"]["n_measured"] == 3 and math.isclose(raw["measured_median_s"], 2.45)
