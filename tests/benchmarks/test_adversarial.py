"""The adversarial surrogates depart from the formulas where they say, and only there."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks.adversarial import DEPARTURES, SPLIT, Departure, adversarial_problem, true_eval
from benchmarks.problems import PROBLEMS
from infrarsi.execution.surrogate.model import evaluate


@pytest.fixture(scope="module")
def friendly():
    return PROBLEMS["surrogate_2node"]()


def _cfg(friendly, **over):
    return friendly.space.validate({**friendly.baseline, **over})


def test_no_departure_is_the_formula(friendly) -> None:
    cfg = _cfg(friendly, zero_stage=1, micro_batch_size=4, tp=2, pp=2)
    a, b = evaluate(friendly.source, cfg), true_eval(friendly.source, cfg, Departure())
    assert (a.step_time_s, a.peak_memory_bytes) == pytest.approx(
        (b.step_time_s, b.peak_memory_bytes)
    )


def test_each_departure_acts_on_its_own_term_only(friendly) -> None:
    prob = friendly.source
    flat = _cfg(friendly, zero_stage=1, micro_batch_size=4, tp=1, pp=1)
    piped = _cfg(friendly, zero_stage=1, micro_batch_size=4, tp=1, pp=4)
    split = _cfg(friendly, zero_stage=1, micro_batch_size=4, tp=4, pp=1)
    z3 = _cfg(friendly, zero_stage=3, micro_batch_size=4, reduce_bucket_size=500000000)

    def t(cfg, dep):
        return true_eval(prob, cfg, dep).step_time_s

    cheap = DEPARTURES["adv_bubble_cheap"]
    assert t(flat, cheap) == pytest.approx(t(flat, Departure()))  # no pipeline, no bubble
    assert t(piped, cheap) < t(piped, Departure())
    dear_tp = DEPARTURES["adv_tp_dear"]
    assert t(flat, dear_tp) == pytest.approx(t(flat, Departure()))
    assert t(split, dear_tp) > t(split, Departure())
    overlap = DEPARTURES["adv_zero3_overlap"]
    assert t(z3, overlap) == pytest.approx(0.7 * t(z3, Departure()))
    assert t(flat, overlap) == pytest.approx(t(flat, Departure()))
    mem = DEPARTURES["adv_memory_term"]
    assert true_eval(prob, flat, mem).peak_memory_bytes > evaluate(prob, flat).peak_memory_bytes


def test_the_friendly_optimum_is_no_longer_optimal_where_the_truth_moves(friendly) -> None:
    best = min(friendly.truth, key=friendly.truth.get)
    memory = adversarial_problem("adv_memory_term")
    assert math.isinf(memory.truth[best])  # the friendly optimum runs out of memory there
    overlap = adversarial_problem("adv_zero3_overlap")
    assert overlap.truth[best] > 1.2 * overlap.oracle_time
    tail = adversarial_problem("adv_heavy_tail")
    assert tail.truth == friendly.truth  # only its noise is heavier


def test_trials_are_drawn_from_the_departed_truth_and_repeat_by_seed(friendly) -> None:
    p = adversarial_problem("adv_gemm_flat")
    cfg = _cfg(friendly, zero_stage=1, micro_batch_size=2, tp=1, pp=2)
    draws = [p.trial(cfg, seed=s, index=0) for s in range(12)]
    ok = [d.step_time_s for d in draws if d.status == "ok"]
    assert ok and float(np.median(ok)) == pytest.approx(p.truth[p.space.key(cfg)], rel=0.1)
    assert p.trial(cfg, seed=3, index=0) == draws[3]
    assert set(SPLIT["tune"]).isdisjoint(SPLIT["held_out"])
    assert set(SPLIT["tune"]) | set(SPLIT["held_out"]) == set(DEPARTURES)
