"""Smoke test of ``benchmarks/search_efficiency.py --quick`` (peers only, a few seconds)."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

from benchmarks.peers import Observation
from benchmarks.peers.ramp import RampPeer
from benchmarks.problems import PROBLEMS
from benchmarks.search_efficiency import main


def test_quick_run_writes_results(tmp_path: Path) -> None:
    result = main(["--quick", "--out", str(tmp_path)])
    rows = result["summary"]["surrogate_1node"]
    assert set(rows) == {"random", "grid", "ramp"}
    for row in rows.values():
        b = row["budgets"]["12"]
        assert row["seeds"] == 2 and 1.0 <= b["ratio_q25"] <= b["ratio_median"] < math.inf
        assert 0.0 <= b["wasted_median"] < 1.0
    saved = json.loads((tmp_path / "search_efficiency.json").read_text())
    assert saved["summary"] == json.loads(json.dumps(result["summary"]))
    assert "| ramp |" in (tmp_path / "search_efficiency.md").read_text()
    runs = [
        json.loads(x)
        for x in (tmp_path / "search_efficiency_runs.main.jsonl").read_text().splitlines()
    ]
    assert len(runs) == 6 and all(len(r["trials"]) == 12 for r in runs)
    main(["--quick", "--out", str(tmp_path)])  # a rerun skips finished runs
    assert len((tmp_path / "search_efficiency_runs.main.jsonl").read_text().splitlines()) == 6


def test_oracle_is_the_best_feasible_config() -> None:
    p = PROBLEMS["surrogate_1node"]()
    finite = [t for t in p.truth.values() if math.isfinite(t)]
    assert p.oracle_time == min(finite) and len(finite) < len(p.truth)  # some configs OOM
    assert p.true_time(p.baseline) > p.oracle_time


def test_ramp_stops_raising_at_oom() -> None:
    p = PROBLEMS["surrogate_1node"]()
    ramp = RampPeer(p.space, p.capacity, 0, p.baseline)
    seen = []
    for i in range(20):
        cfg = ramp.ask()
        d = p.trial(cfg, 0, i)
        ramp.tell(cfg, Observation(d.status, d.step_time_s, d.peak_memory_bytes))
        seen.append(
            (cfg["activation_checkpointing"], cfg["zero_stage"], cfg["micro_batch_size"], d.status)
        )
    for (ck, z, m, status), (ck2, z2, m2, _) in itertools.pairwise(seen):
        if (
            status == "oom"
        ):  # the next trial starts a new ramp (another stage) at a small micro-batch
            assert (ck2, z2) != (ck, z) and m2 <= m


def test_wide_problem_is_above_the_candidate_cap_with_the_same_oracle() -> None:
    from infrarsi.search import OptimizerSettings

    wide, narrow = PROBLEMS["surrogate_2node_wide"](), PROBLEMS["surrogate_2node"]()
    assert (
        len(wide.truth) > OptimizerSettings().candidate_cap >= len(narrow.truth)
    )  # so its sampled path runs
    assert math.isclose(
        wide.oracle_time, narrow.oracle_time
    )  # a superset space with the same best config


def test_ask_latency_writes_windows(tmp_path: Path) -> None:
    from benchmarks.ask_latency import main as latency_main

    result = latency_main(
        ["--trials", "6", "--seeds", "1", "--problems", "surrogate_1node", "--out", str(tmp_path)]
    )
    (window,) = result["problems"]["surrogate_1node"]["windows"]
    assert (
        window["observations"] == "1-25" and window["asks"] == 5
    )  # the process's first ask is left out
    assert 0.0 < window["median_s"] <= window["p90_s"] <= window["max_s"]
    assert result["first_ask_s"] > 0.0 and result["meta"]["speed_probe_s"] > 0.0
    text = (tmp_path / "ask_latency.md").read_text()
    assert "speed probe" in text and "cores" in result["meta"]["machine"]
    assert "| surrogate_1node |" in (tmp_path / "ask_latency.md").read_text()
