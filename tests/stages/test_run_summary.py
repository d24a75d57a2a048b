"""``run``'s summary names the knob config to verify and why (``best_choice_summary``); unit level
(``test_run.py`` holds the integration tests of the stage)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("broken", [False, True])
def test_the_summary_names_the_choice_or_none_and_never_fails_the_stage(broken: bool) -> None:
    from infrarsi.search import BEST_REASONS, Optimizer, Outcome, SearchSpace
    from infrarsi.stages.run import best_choice_summary

    space = SearchSpace.from_yaml("name: t\nknobs:\n  - {name: a, type: int, values: [1, 2, 3]}\n")
    opt = Optimizer(space, memory_capacity=10.0, seed=0)
    assert best_choice_summary(opt) is None  # no ok trial yet
    for a, t in ((1, 2.0), (2, 1.5), (3, 1.8)):
        opt.tell({"a": a}, Outcome("ok", step_time=t, peak_memory=1.0))
    if broken:
        opt.best_choice = lambda: 1 / 0  # type: ignore[method-assign]
        assert best_choice_summary(opt) is None
        return
    s = best_choice_summary(opt)
    assert s is not None and s["reason"] in BEST_REASONS and s["config"] == opt.best()
    assert s["why"] and s["measured_median_s"] > 0
