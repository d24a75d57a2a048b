"""``benchmarks/gpu_study.py``'s summary of a finished study (the stages themselves are the
stages' own tests; the device runs the whole of it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.gpu_study import main, summarize
from tests.synthetic_study import make_study


def test_the_summary_names_the_verified_winner_against_the_plain_loop(tmp_path: Path) -> None:
    study = make_study(tmp_path)
    verify = json.loads((study / "verify.json").read_text())
    s = summarize(study, "w.yaml", {"run": 12.0}, 100.0, {"step_time_s": 1.0})
    assert s.winner_config == verify["best"]["config"]
    assert s.winner_speedup == verify["best"]["speedup"]
    assert s.winner_ci == (verify["best"]["ci_low"], verify["best"]["ci_high"])
    mine = [t for t in s.trials if t.trial_id in set(verify["best"]["trial_ids"])]
    assert mine and s.winner_step_time_s == sorted(t.step_time_s for t in mine)[len(mine) // 2]
    assert s.winner_vs_reference == pytest.approx(1.0 / s.winner_step_time_s)
    assert sum(s.statuses.values()) == len(s.trials)
    assert s.statuses["oom"] == 1 and s.statuses["failed"] == 1
    assert s.stage_wall_s == {"run": 12.0} and s.run_budget_s == 100.0


def test_no_accepted_winner_and_no_reference_leave_the_comparison_empty(tmp_path: Path) -> None:
    study = make_study(tmp_path, verified=False)
    s = summarize(study, "w.yaml", {}, 0.0, None)
    assert s.winner_config is None and s.winner_vs_reference is None
    assert s.reference_step_time_s is None


def test_the_deadline_is_required() -> None:
    with pytest.raises(SystemExit):
        main(["w.yaml", "study"])


def test_an_existing_study_is_refused_before_anything_runs(tmp_path: Path) -> None:
    study = make_study(tmp_path)
    with pytest.raises(SystemExit, match=r"already holds a study.*infrarsi tune"):
        main(["workloads/dense_debug.yaml", str(study), "--deadline-s", "60"])
