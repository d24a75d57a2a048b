"""The history of told and pending trials (``history.py``): adding, exclusions, warm-start queue, saved form."""

from __future__ import annotations

import json

import pytest
from search_synthetic import TINY, tiny_run

from infrarsi.errors import UserInputError
from infrarsi.search import AskInfo, Outcome, SearchSpace, WarmStartOrigin
from infrarsi.search.ask_info import Phase
from infrarsi.search.history import History


@pytest.fixture
def space() -> SearchSpace:
    return SearchSpace.from_yaml(TINY)


def test_a_told_trial_is_no_longer_pending_and_failures_and_stragglers_are_told_apart(
    space: SearchSpace,
) -> None:
    h = History(space)
    a, b, c = (space.validate(x) for x in ({"stage": 0}, {"stage": 1}, {"stage": 2}))
    h.pending[space.key(a)] = a
    h.add(a, Outcome(status="ok", step_time=1.0))
    h.add(b, Outcome(status="oom"))
    h.add(c, Outcome(status="ok", step_time=2.0))
    h.add(c, Outcome(status="failed"))
    assert h.pending == {} and h.seen_keys() == {space.key(x) for x in (a, b, c)}
    assert h.failed_keys() == {space.key(b), space.key(c)}
    assert [o.config for o in h.ok()] == [a, c] and [o.config for o in h.ok(left_out={0})] == [c]


def test_warm_starts_are_queued_once_in_order_and_invalid_ones_skipped(space: SearchSpace) -> None:
    h = History(space)
    origin = WarmStartOrigin(source_study="s")
    h.queue_warm_starts([{"stage": 1}, {"stage": 9}, {"stage": 1}, {"stage": 0}], [origin])
    assert h.warm_queue == [
        (space.validate({"stage": 1}), origin),
        (space.validate({"stage": 0}), None),
    ]
    with pytest.raises(UserInputError, match="initial_origins"):
        h.queue_warm_starts([{"stage": 1}], [None, None])


def test_the_saved_form_round_trips_and_keeps_the_state_keys(space: SearchSpace) -> None:
    h = History(space, n_asks=3)
    for x in ({"stage": 0}, {"stage": 2, "mbs": 8}):
        cfg = space.validate(x)
        h.add(cfg, tiny_run(cfg))
    pend = space.validate({"stage": 1})
    h.pending[space.key(pend)] = pend
    h.ask_infos[space.key(pend)] = AskInfo(config=pend, phase=Phase.DESIGN, ask_index=2)
    h.queue_warm_starts([{"stage": 1, "mbs": 4}], [WarmStartOrigin(trial_id="t")])
    raw = json.loads(json.dumps(h.to_dict()))
    assert set(raw) == {"observations", "pending", "ask_infos", "initial_queue", "n_asks"}
    assert raw["ask_infos"][0]["phase"] == "design"  # the phase is saved as its string
    back = History.from_dict(space, raw)
    assert back.to_dict() == h.to_dict() and back.ask_infos == h.ask_infos
    assert back.ask_infos[space.key(pend)].phase is Phase.DESIGN
    keep = [(space.validate({"stage": 0}), None)]
    old = {
        k: v for k, v in raw.items() if k != "initial_queue"
    }  # a version-1 state: no queue saved
    assert History.from_dict(space, old, warm_queue=keep).warm_queue == keep


def test_a_pending_key_gives_back_its_config(space: SearchSpace) -> None:
    h = History(space)
    cfg = space.validate({"stage": 2, "mbs": 4})
    assert h.config_of(space.key(cfg)) == cfg
    h.pending[space.key(cfg)] = cfg
    assert h.config_of(space.key(cfg)) is cfg
