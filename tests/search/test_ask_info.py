"""``AskInfo`` and ``WarmStartOrigin``: JSON round trip, and the dicts written before them."""

from __future__ import annotations

import json
import math

import pytest

from infrarsi.errors import UserInputError
from infrarsi.search import AskInfo, WarmStartOrigin
from infrarsi.search.ask_info import Phase


def test_round_trip_through_json() -> None:
    info = AskInfo(
        config={"a": 1, "b": True},
        phase="repair",
        ask_index=4,
        repair_of={"a": 2, "b": True},
        repair_moves=("a: 2 -> 1",),
        original_p_fit=0.2,
        paired="after_pick",
        predicted_step_time_s=1.5,
        step_time_sd_log=0.1,
        p_fit=0.8,
        predicted_peak_memory_bytes=6e10,
        p_ok=0.99,
        log_acquisition=-2.0,
    )
    raw = json.loads(json.dumps(info.to_dict()))
    assert AskInfo.from_dict(raw) == info
    assert set(raw) >= {"predicted_peak_memory_bytes", "warm_start_origin", "repair_moves"}
    warm = AskInfo(
        config={"a": 1},
        phase="warm_start",
        ask_index=0,
        warm_start_origin=WarmStartOrigin(
            source_study="s",
            trial_id="t",
            relative_step_time=0.4,
            similarity=0.9,
            hardware_fingerprint="h",
        ),
    )
    assert AskInfo.from_dict(json.loads(json.dumps(warm.to_dict()))) == warm
    mapped = WarmStartOrigin(source_study="s", similarity=0.9, rule="mapped")
    assert WarmStartOrigin.from_dict(json.loads(json.dumps(mapped.to_dict()))) == mapped


def test_dicts_written_before_ask_info_are_read() -> None:
    old = {
        "config": {"a": 1},
        "phase": "prior",
        "ask_index": 2,
        "repair_of": None,
        "predicted_memory_bytes": 5e9,
        "step_time_sd_log": math.nan,
        "prior": {"source_study": "b", "similarity": 1.0, "unknown": 3},
    }
    info = AskInfo.from_dict(old)
    assert info.predicted_peak_memory_bytes == 5e9 and info.step_time_sd_log is None
    assert info.warm_start_origin == WarmStartOrigin(source_study="b", similarity=1.0)
    assert info.warm_start_origin.rule == "copy"  # written before mapped warm starts
    assert info.phase is Phase.WARM_START  # a warm-start config's phase was "prior" then


def test_the_phase_is_a_phase_and_an_unknown_one_is_refused() -> None:
    info = AskInfo(config={"a": 1}, phase="bo-local", ask_index=0)  # type: ignore[arg-type]
    assert info.phase is Phase.BO_LOCAL and info.to_dict()["phase"] == "bo-local"
    assert json.dumps(info.to_dict()["phase"]) == '"bo-local"'
    with pytest.raises(UserInputError, match="phase: rule: must be one of"):
        AskInfo.from_dict({"config": {"a": 1}, "phase": "guess"})


def test_a_dict_without_config_or_phase_is_refused() -> None:
    for raw in ({}, {"config": {"a": 1}}, {"phase": "bo"}, {"config": 3, "phase": "bo"}):
        with pytest.raises(UserInputError, match="ask info"):
            AskInfo.from_dict(raw)
