"""``TrialResult`` and its typed ``TrialExtra``: dict round trips and rows of earlier versions."""

from __future__ import annotations

import dataclasses
import json
import typing

from infrarsi.result import Role, TrialExtra, TrialResult


def test_extra_round_trips_through_a_dict_holding_only_its_set_fields() -> None:
    extra = TrialExtra(role="candidate", round=1, pair=0, candidate=2, warm=False, pids=[3])
    raw = extra.to_dict()
    assert raw == {
        "role": "candidate",
        "round": 1,
        "pair": 0,
        "candidate": 2,
        "warm": False,
        "pids": [3],
    }
    assert TrialExtra.from_dict(raw) == extra
    assert TrialExtra().to_dict() == {}


def test_an_earlier_versions_extra_loads() -> None:
    """``model_params`` (the surrogate's old name) becomes ``num_params``; keys this version does
    not know are kept apart and written back unchanged."""
    old = {"model_params": 1.5e9, "role": "baseline", "repeat": 1, "from_the_future": {"a": 1}}
    extra = TrialExtra.from_dict(old)
    assert extra.num_params == 1.5e9 and extra.role == "baseline" and extra.repeat == 1
    assert extra.unknown == {"from_the_future": {"a": 1}}
    assert extra.to_dict()["from_the_future"] == {"a": 1}
    assert TrialExtra.from_dict(None) == TrialExtra()


def test_update_sets_only_the_fields_the_other_sets() -> None:
    extra = TrialExtra(warm=True, acquire_s=0.5)
    extra.update(TrialExtra(role="long_baseline", warm=False, unknown={"k": 1}))
    assert (extra.warm, extra.acquire_s, extra.role, extra.unknown) == (
        False,
        0.5,
        "long_baseline",
        {"k": 1},
    )


def test_every_extra_field_is_optional_and_documented() -> None:
    source = __import__("inspect").getsource(TrialExtra)
    for f in dataclasses.fields(TrialExtra):
        if f.name == "unknown":
            continue
        assert f.default is None, f.name
        assert (
            f"    {f.name}: " in source
            and '"""' in source.split(f"    {f.name}: ", 1)[1].split("\n", 2)[1]
        ), f.name
    assert set(typing.get_args(Role)) >= {"baseline", "candidate", "honest_change"}


def test_trial_result_round_trips_with_extra_as_a_dict_or_its_json() -> None:
    res = TrialResult(
        trial_id="run-1", stage="run", config={"a": 1}, status="ok", extra=TrialExtra(warm=True)
    )
    raw = res.to_dict()
    assert raw["extra"] == {"warm": True}
    assert TrialResult.from_dict(raw) == res
    assert TrialResult.from_dict({**raw, "extra": json.dumps(raw["extra"])}) == res
    assert TrialResult.from_dict({**raw, "extra": ""}).extra == TrialExtra()
    # a dict given to the constructor (a stored row's, an older caller's) becomes the record
    assert TrialResult(trial_id="t", stage="run", config={}, extra={"warm": True}).extra.warm  # type: ignore[arg-type]


def test_statuses_and_stages_are_their_literals_values_in_order() -> None:
    from infrarsi.result import STAGES, STATUSES, RankStatus, is_status

    assert STATUSES == ("ok", "oom", "failed", "timeout", "nan", "invariant_violation")
    assert STAGES == ("doctor", "run", "verify", "long", "trial")
    assert set(typing.get_args(RankStatus)) < set(STATUSES)
    assert is_status("oom") and not is_status("missing") and not is_status(None)
    hints = typing.get_type_hints(TrialResult)
    assert typing.get_args(hints["status"]) == STATUSES
    assert typing.get_args(hints["stage"]) == STAGES
