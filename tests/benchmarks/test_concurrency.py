"""Behaviour of ``benchmarks/concurrency.py``'s simulated cluster (not its timings): a real small
problem, few trials."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

from benchmarks.concurrency import Tell, TrialEvent, main, simulate
from benchmarks.problems import PROBLEMS, BenchProblem
from infrarsi.search import OptimizerSettings


@pytest.fixture(scope="module")
def problem() -> BenchProblem:
    return PROBLEMS["surrogate_1node"]()


@pytest.fixture(scope="module")
def four_slots(problem: BenchProblem) -> tuple[list[TrialEvent], list[Tell]]:
    # n_init=3: the design ends early, so model-based asks with trials pending are covered too
    return simulate(problem, 0, 4, 10, settings=OptimizerSettings(n_init=3))


def test_trials_start_when_a_slot_frees_and_are_told_in_completion_order(
    four_slots: tuple[list[TrialEvent], list[Tell]],
) -> None:
    events, tells = four_slots
    assert [e.index for e in events] == list(range(len(events))) and len(tells) == len(events) == 10
    ends = sorted(e.end_sim_s for e in events)
    assert [t.sim_wall_s for t in tells] == ends  # one tell per trial, at its end, earliest first
    assert [t.told for t in tells] == list(range(1, 11))
    tell_times = {0.0} | {t.sim_wall_s for t in tells}
    for e in events:
        assert (
            e.end_sim_s > e.start_sim_s and e.start_sim_s in tell_times
        )  # asked at the start or right after a tell
    assert [e.start_sim_s for e in events[:4]] == [0.0] * 4  # the empty cluster fills at once


def test_never_more_than_the_slots_in_flight(
    four_slots: tuple[list[TrialEvent], list[Tell]],
) -> None:
    events, tells = four_slots
    assert max(e.in_flight_at_ask for e in events) == 3
    for e in events:  # at every start, what runs then (this one included)
        running = [o for o in events if o.start_sim_s <= e.start_sim_s < o.end_sim_s]
        assert len(running) <= 4
    assert all(0 <= t.in_flight <= 3 for t in tells)


def test_a_config_asked_while_others_are_pending_is_not_one_of_them(
    problem: BenchProblem, four_slots: tuple[list[TrialEvent], list[Tell]]
) -> None:
    events, _ = four_slots
    with_pending = [e for e in events if e.pending_keys_at_ask]
    assert len(with_pending) >= 6 and {e.phase for e in with_pending} - {
        "baseline",
        "design",
    }  # model picks too
    for e in with_pending:
        assert (
            len(e.pending_keys_at_ask) == e.in_flight_at_ask
        )  # the optimizer knows every running trial
        assert problem.space.key(e.config) not in e.pending_keys_at_ask
    running_keys = [problem.space.key(e.config) for e in events]
    for e in events:  # configs running at the same time are distinct
        same_time = [
            running_keys[o.index] for o in events if o.start_sim_s <= e.start_sim_s < o.end_sim_s
        ]
        assert len(same_time) == len(set(same_time))


def test_one_slot_runs_trials_back_to_back(problem: BenchProblem) -> None:
    events, tells = simulate(problem, 1, 1, 3)
    assert [e.in_flight_at_ask for e in events] == [0] * 3
    assert events[0].start_sim_s == 0.0
    for prev, nxt in itertools.pairwise(events):
        assert nxt.start_sim_s == prev.end_sim_s
    assert tells[-1].sim_wall_s == pytest.approx(sum(e.end_sim_s - e.start_sim_s for e in events))


def test_a_target_keeps_the_slots_busy_until_it_is_reached(problem: BenchProblem) -> None:
    unreachable = simulate(problem, 0, 2, 2, target_true_s=0.0, max_trials=4)
    assert len(unreachable[0]) == 4 and len(unreachable[1]) == 4  # past N, up to the cap
    reached = simulate(problem, 0, 2, 2, target_true_s=math.inf, max_trials=4)
    assert len(reached[1]) == 2 + reached[1][1].in_flight  # N tells, then only what was running


def test_quick_run_writes_the_documented_fields(tmp_path: Path) -> None:
    result = main(["--quick", "--seeds", "1", "--trials", "4", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "concurrency.json").read_text())
    assert saved["summary"] == json.loads(json.dumps(result["summary"]))
    row = saved["summary"]["surrogate_1node"]
    assert row["seeds"] == 1 and row["n_trials"] == 4
    for c in ("c1", "c4"):
        for field in (
            "ratio_at_n_median",
            "makespan_sim_wall_s_median",
            "reach_sim_wall_s_median",
            "device_s_median",
            "within_sim_wall_s_q75",
        ):
            assert field in row[c]
        assert row[c]["ratio_at_n_median"] >= 1.0
    assert row["c1"]["max_in_flight"] == 1 and row["c4"]["max_in_flight"] <= 4
    assert set(row["time_ratio"]) >= {"median", "q25", "q75", "censored"}
    assert {"median", "max", "worse_seeds"} <= set(row["quality_ratio"])
    run = saved["runs"][0]
    assert run["c1"]["trials_told"] == 4 and run["c4"]["trials_told"] >= 4
    assert run["makespan_ratio"] > 1.0  # 4 slots tell 4 trials sooner than 1 slot
    meta = saved["meta"]
    assert meta["slots"] == 4 and meta["commit"] and meta["machine"] and "simulation" in meta["how"]
    md = (tmp_path / "concurrency.md").read_text()
    assert "| surrogate_1node | 1 | 4 |" in md and meta["command"] in md
    assert {"median", "both_reached", "only_c1", "only_c4"} <= set(row["within_time_ratio"])
    (tmp_path / "concurrency.md").write_text(md + "\n## Notes\n\nkept\n")
    again = main(
        ["--summarise-only", "--out", str(tmp_path)]
    )  # no new runs: the same summary, notes kept
    assert (
        again["summary"] == saved["summary"]
        and again["runs"] == saved["runs"]
        and again["meta"]["summarised"]
    )
    assert (tmp_path / "concurrency.md").read_text().endswith("## Notes\n\nkept\n")
