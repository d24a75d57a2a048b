"""The transfer benchmark's measuring logic: the first trial within 3% of the oracle, and the censored median."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.transfer import (
    _ci_note,
    censored_median,
    device_hours_median,
    device_hours_to_threshold,
    hoist_bank_audits,
    main,
    median_ratio_ci,
    trials_to_threshold,
)


def run(
    arm: str, seed: int, ratios: list[float], hours: list[float] | None = None
) -> dict[str, Any]:
    """A saved target run of the ``gpu`` task with a budget of 3 (``device_hours``: cumulative, or
    absent as in runs saved before they were recorded)."""
    out: dict[str, Any] = {
        "task": "gpu",
        "arm": arm,
        "seed": seed,
        "budget": 3,
        "ratios": ratios,
        "trials_to_3pct": trials_to_threshold(ratios),
    }
    if hours is not None:
        out["device_hours"] = hours
    return out


def test_trials_to_threshold_is_the_first_trial_within_3_percent() -> None:
    assert (
        trials_to_threshold([None, 1.5, 1.031, 1.03, 1.2]) == 4
    )  # 1-based; a later worse best does not undo it
    assert trials_to_threshold([None, 1.1]) is None  # censored
    assert trials_to_threshold([1.0]) == 1


def test_censored_runs_count_as_budget_plus_one() -> None:
    assert censored_median([2, 4, None], budget=10) == {
        "median": 4.0,
        "censored": 1,
        "n": 3,
        "median_censored": False,
    }
    out = censored_median([None, None, 3], budget=10)
    assert out["median"] == 11.0 and out["median_censored"]


def test_median_ratio_ci_brackets_the_ratio_of_medians_and_is_reproducible() -> None:
    cold = [10, 12, None, 8, 14, 9, 11, 13]
    arm = [5, 6, 4, 5, None, 5, 6, 4]
    lo, hi = median_ratio_ci(cold, arm, budget=24)
    ratio = 11.5 / 5
    assert lo <= ratio <= hi and lo < hi
    assert median_ratio_ci(cold, arm, budget=24) == (lo, hi)  # seeded
    same = median_ratio_ci(cold, cold, budget=24)
    assert same == (1.0, 1.0)  # paired: an arm against itself has no spread


def test_ci_note_says_whether_the_interval_meets_misses_or_straddles_a_target() -> None:
    at_least_2 = lambda r: r >= 2  # noqa: E731
    assert "whole 90% CI meets" in _ci_note({"cold_over_arm_ci90": [2.1, 3.0]}, at_least_2)
    assert "whole 90% CI misses" in _ci_note({"cold_over_arm_ci90": [0.8, 1.5]}, at_least_2)
    assert "straddles" in _ci_note({"cold_over_arm_ci90": [1.5, 2.5]}, at_least_2)
    assert _ci_note({}, at_least_2) == ""


def test_the_bank_audit_is_kept_once_per_task_and_arm_unless_a_run_differs() -> None:
    audit = {"bank": "/tmp/a", "at": 1.0, "used": [{"config": {"tp": 2}}]}
    runs = [
        {
            "task": "gpu",
            "arm": "bank",
            "seed": s,
            "bank_warm_start": {**audit, "bank": f"/tmp/{s}", "at": s},
        }
        for s in (1, 0)
    ]
    runs.append({"task": "gpu", "arm": "bank", "seed": 2, "bank_warm_start": {**audit, "used": []}})
    runs.append({"task": "gpu", "arm": "cold", "seed": 0, "bank_warm_start": None})
    hoisted = hoist_bank_audits(runs)
    assert hoisted == {"gpu/bank": {**audit, "bank": "/tmp/0", "at": 0}, "gpu/cold": None}
    assert [("bank_warm_start" in r) for r in runs] == [
        False,
        False,
        True,
        False,
    ]  # seed 2 differs: kept
    banked = [
        {"task": "gpu", "arm": "bank", "seed": s, "source_seeds": src, "bank_warm_start": a}
        for s, src, a in ((0, [1000, 1001], audit), (1, [1002, 1003], {**audit, "used": []}))
    ]
    assert hoist_bank_audits(banked) == {
        "gpu/bank/1000_1001": audit,
        "gpu/bank/1002_1003": {**audit, "used": []},
    }  # one per bank


def test_combine_takes_each_run_from_the_last_file_that_has_it(tmp_path: Path) -> None:
    """``--combine``: the cold arm of one saved run beside the bank arm of another (run with other
    settings on the same seeds) gives one summary; a file's run of a task, arm and seed replaces
    an earlier file's, and other seeds add to them."""

    meta = {"how": "Simulated.", "command": "c", "commit": "abc", "machine": "m", "budget": 3}
    first = {
        "meta": meta,
        "runs": [run("cold", s, [2.0, 1.5, 1.01]) for s in range(2)]
        + [run("bank", s, [2.0, 2.0, 2.0]) for s in range(2)],
    }
    second = {
        "meta": {**meta, "command": "d"},
        "runs": [run("bank", s, [2.0, 1.0, 1.0]) for s in range(2)] + [run("cold", 2, [2.0] * 3)],
    }
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(first))
    b.write_text(json.dumps(second))
    out = main(["--combine", str(a), str(b), "--name", "both", "--out", str(tmp_path)])
    gpu = out["summary"]["gpu"]
    assert gpu["cold"]["per_seed"] == [3, 3, None] and gpu["bank"]["per_seed"] == [2, 2]
    assert gpu["bank"]["cold_over_arm"] == 1.5
    assert [m["command"] for m in out["meta"]["combined"]] == ["c", "d"]
    assert "`b.json` from `d`" in (tmp_path / "both.md").read_text()


def test_combine_keeps_the_audits_each_file_hoisted_for_the_runs_it_keeps(tmp_path: Path) -> None:
    """A saved file holds each bank's audit once, at its top level (``hoist_bank_audits``), not in
    its runs: ``--combine`` carries those of the banks its chosen runs met, a later file's
    replacing an earlier's, and drops those of runs it replaced."""
    meta = {"how": "Simulated.", "command": "c", "commit": "abc", "machine": "m", "budget": 3}
    first = {
        "meta": meta,
        "bank_warm_start": {"gpu/bank": {"used": [1]}, "gpu/unrelated": {"used": [2]}},
        "runs": [run("bank", 0, [2.0, 1.0, 1.0]), run("unrelated", 0, [2.0, 1.0, 1.0])],
    }
    second = {
        "meta": meta,
        "bank_warm_start": {"gpu/unrelated/1000_1001": {"used": [3]}},
        "runs": [{**run("unrelated", 0, [2.0, 2.0, 1.0]), "source_seeds": [1000, 1001]}],
    }
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(first))
    b.write_text(json.dumps(second))
    out = main(["--combine", str(a), str(b), "--name", "both", "--out", str(tmp_path)])
    assert out["bank_warm_start"] == {
        "gpu/bank": {"used": [1]},
        "gpu/unrelated/1000_1001": {"used": [3]},
    }


def test_device_hours_count_the_trials_up_to_the_first_within_3_percent(tmp_path: Path) -> None:
    """A run's device-hours to within 3% are its cumulative hours at that trial (at the budget when
    censored); the summary's median and the markdown column carry them, and runs saved before
    they were recorded show '-'."""
    within = {"trials_to_3pct": 2, "device_hours": [1.0, 3.0, 6.0]}
    censored = {"trials_to_3pct": None, "device_hours": [1.0, 2.0, 4.0]}
    assert device_hours_to_threshold(within) == 3.0
    assert device_hours_to_threshold(censored) == 4.0
    assert (
        device_hours_median([within, censored, {**within, "device_hours": [0.5, 1.0, 9.0]}]) == 3.0
    )

    meta = {"how": "Simulated.", "command": "c", "commit": "abc", "machine": "m", "budget": 3}
    saved = {
        "meta": meta,
        "runs": [run("cold", s, [2.0, 1.5, 1.01], [1.0, 2.0, 3.5 + s]) for s in range(2)]
        + [run("bank", s, [2.0, 1.0, 1.0], None) for s in range(2)],
    }
    a = tmp_path / "a.json"
    a.write_text(json.dumps(saved))
    out = main(["--combine", str(a), "--name", "hours", "--out", str(tmp_path)])
    gpu = out["summary"]["gpu"]
    assert gpu["cold"]["device_hours_to_3pct_median"] == 4.0  # 3.5 and 4.5 at trial 3
    assert "device_hours_to_3pct_median" not in gpu["bank"]
    table = (tmp_path / "hours.md").read_text()
    assert "| 4.0 |" in table and table.count("| - |") >= 1


def test_trials_to_within_5_percent_are_a_second_column_with_their_own_ratio(
    tmp_path: Path,
) -> None:
    """Each arm's median trials to within 5% comes from the same saved ratios as the 3% one,
    with its censored count and the cold/arm ratio; the 3% goals and verdicts are unchanged."""
    meta = {"how": "Simulated.", "command": "c", "commit": "abc", "machine": "m", "budget": 3}
    saved = {
        "meta": meta,
        "runs": [run("cold", s, [2.0, 1.04, 1.04 - 0.02 * s]) for s in range(2)]
        + [run("bank", s, [1.045, 1.04, 1.04]) for s in range(2)],
    }
    a = tmp_path / "a.json"
    a.write_text(json.dumps(saved))
    out = main(["--combine", str(a), "--name", "near", "--out", str(tmp_path)])
    gpu = out["summary"]["gpu"]
    assert gpu["cold"]["within_5pct"]["median"] == 2.0
    assert gpu["bank"]["within_5pct"]["median"] == 1.0
    assert gpu["bank"]["within_5pct"]["cold_over_arm"] == 2.0
    assert gpu["bank"]["per_seed"] == [None, None]  # never within 3%
    assert gpu["cold"]["per_seed"] == [None, 3]
    table = (tmp_path / "near.md").read_text()
    assert "within 5%" in table and "| 1 (0/2 censored), 2.00x |" in table
    assert "MISSED" in table  # the 3% goal still decides


def test_each_target_seed_meets_its_bank_and_bank_zero_is_the_given_sources() -> None:
    from benchmarks.transfer import bank_source_seeds

    assert bank_source_seeds(5, 1, (1000, 1001)) == (1000, 1001)  # one bank: every seed
    assert [bank_source_seeds(s, 4, (1000, 1001)) for s in (0, 1, 4, 7)] == [
        (1000, 1001),
        (1002, 1003),
        (1000, 1001),
        (1006, 1007),
    ]
