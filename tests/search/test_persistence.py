"""Saved optimizer states and history (``persistence.py``): version rules, version-1 states, atomic
JSON files, and trial-log rows read back into outcomes (``Optimizer.from_trials``)."""

from __future__ import annotations

import json

import pytest
from search_synthetic import TINY, TINY_CAP, tiny_run

from infrarsi.errors import InfrarsiError
from infrarsi.search import Optimizer, OptimizerSettings, Outcome, SearchSpace, persistence


def test_from_trials_rebuilds_observations_and_exclusions() -> None:
    space = SearchSpace.from_yaml(TINY)
    rows = []
    for cfg in space.enumerate()[:6]:  # type: ignore[index]
        out = tiny_run(cfg)
        rows.append(
            {
                "trial_id": f"t{len(rows)}",
                "stage": "run",
                "config": json.dumps(cfg),
                "status": out.status,
                "step_time_s": out.step_time,
                "peak_memory_bytes": out.peak_memory,
                "memory_censored": out.status == "oom",
            }
        )
    rows.append(
        {
            "trial_id": "bad",
            "stage": "run",
            "config": json.dumps({"stage": 9}),
            "status": "ok",
            "step_time_s": 1.0,
            "peak_memory_bytes": 1.0,
            "memory_censored": False,
        }
    )
    with pytest.warns(UserWarning, match="skipped a row"):
        opt = Optimizer.from_trials(
            space, rows, memory_capacity=TINY_CAP, seed=0, settings=OptimizerSettings(n_init=2)
        )
    assert len(opt.observations) == 6
    told = {space.key(json.loads(r["config"])) for r in rows[:6]}
    assert space.key(opt.ask()) not in told
    best = opt.best()
    assert best is not None and tiny_run(best).status == "ok"


def test_a_version_1_state_keeps_its_options() -> None:
    space = SearchSpace.from_yaml(TINY)
    opt = Optimizer(
        space, memory_capacity=TINY_CAP, seed=3, settings=OptimizerSettings(n_init=3, local_every=3)
    )
    for _ in range(4):
        c = opt.ask()
        opt.tell(c, tiny_run(c))
    state = opt.state_dict()
    old = {k: v for k, v in state.items() if k not in ("settings", "initial_queue")}
    old.update(
        version=1,
        censoring=True,
        pairing=True,
        n_init=3,
        candidate_cap=20_000,
        num_threads=1,
        local_every=3,
        intensify=True,
    )
    for info in old["ask_infos"]:  # the key ask infos had before AskInfo
        info["predicted_memory_bytes"] = info.pop("predicted_peak_memory_bytes")
    restored = Optimizer.from_state(old)
    assert restored.settings == opt.settings
    assert restored.ask_infos == opt.ask_infos
    assert restored.ask() == opt.ask()


def test_version_rules_and_atomic_json(tmp_path) -> None:
    with pytest.raises(InfrarsiError, match="version"):
        persistence.check_version({"version": 99})
    assert persistence.check_version({"version": 1}) == 1
    path = tmp_path / "state.json"
    persistence.write_json(path, {"a": [1, 2]})
    assert (
        persistence.read_json(path) == {"a": [1, 2]} and not (tmp_path / "state.json.tmp").exists()
    )


def test_history_keeps_the_stages_asked_for_and_reads_outcomes_by_the_one_rule() -> None:
    space = SearchSpace.from_yaml(TINY)
    rows = [
        {"stage": "doctor", "config": {"stage": 0}, "status": "ok", "step_time_s": 2.0},
        {"stage": "run", "config": json.dumps({"stage": 1}), "step_time_s": 1.5},
        {"stage": "run", "config": {"stage": 2}, "status": "oom", "peak_memory_bytes": 12.0},
    ]
    got = list(persistence.history_outcomes(space, rows, stages=("run",)))
    assert [c["stage"] for c, _ in got] == [1, 2]
    assert [o for _, o in got] == [Outcome.from_row(r) for r in rows[1:]]
