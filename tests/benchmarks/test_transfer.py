"""The transfer benchmark's measuring logic: the first trial within 3% of the oracle, and the censored median."""

from __future__ import annotations

from benchmarks.transfer import censored_median, trials_to_threshold


def test_trials_to_threshold_is_the_first_trial_within_3_percent() -> None:
    assert trials_to_threshold([None, 1.5, 1.031, 1.03, 1.2]) == 4  # 1-based; a later worse best does not undo it
    assert trials_to_threshold([None, 1.1]) is None  # censored
    assert trials_to_threshold([1.0]) == 1


def test_censored_runs_count_as_budget_plus_one() -> None:
    assert censored_median([2, 4, None], budget=10) == {"median": 4.0, "censored": 1, "n": 3, "median_censored": False}
    out = censored_median([None, None, 3], budget=10)
    assert out["median"] == 11.0 and out["median_censored"]
