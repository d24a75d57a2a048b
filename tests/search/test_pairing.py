"""Memory-saver pairing: repairs move toward saving memory and the best fitting one wins."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from search_synthetic import CAPACITY, DENSE, memory_bytes, step_time_s

from infrarsi.search import SearchSpace
from infrarsi.search.pairing import best_repair, fast_but_too_big, repairs, saving_moves


def test_saving_moves_go_toward_saving() -> None:
    space = SearchSpace.from_yaml(DENSE)
    cfg = space.validate({"zero_stage": 1, "micro_batch_size": 8, "reduce_bucket_size": 50000000})
    moves = dict(saving_moves(space, cfg))
    assert moves["zero_stage"] == 2
    assert moves["micro_batch_size"] == 4
    assert moves["activation_checkpointing"] == "selective"
    assert moves["offload_optimizer"] is True
    assert moves["reduce_bucket_size"] == 5000000
    assert "dtype" not in moves and "optimizer_impl" not in moves  # neutral knobs never move


def test_repairs_are_valid_small_and_deduplicated() -> None:
    space = SearchSpace.from_yaml(DENSE)
    cfg = space.validate({"zero_stage": 0, "micro_batch_size": 8})
    reps = repairs(space, cfg, max_steps=2)
    keys = [space.key(r.config) for r in reps]
    assert len(keys) == len(set(keys)) and space.key(cfg) not in keys
    assert all(space.is_valid(r.config) for r in reps)
    assert {r.steps for r in reps} == {1, 2}
    assert all(len(r.moves) == r.steps for r in reps)


@dataclass
class _Truth:
    """Exact truth in the shape ``best_repair`` reads (``pairing.Predictions``)."""

    time_mean: np.ndarray
    p_fit: np.ndarray
    p_ok: np.ndarray


def _oracle_predict(configs):
    """A fake predictor for this unit test only: the synthetic problem's truth."""
    mem = np.array([memory_bytes(c) for c in configs])
    return _Truth(
        time_mean=np.log([step_time_s(c) for c in configs]),
        p_fit=(mem <= CAPACITY).astype(float),
        p_ok=np.ones(len(configs)),
    )


def test_best_repair_fits_and_is_the_fastest_fitting_repair() -> None:
    space = SearchSpace.from_yaml(DENSE)
    cfg = space.validate({"zero_stage": 0, "micro_batch_size": 8, "dtype": "bf16"})
    assert memory_bytes(cfg) > CAPACITY
    found = best_repair(space, cfg, _oracle_predict, excluded=set())
    assert found is not None
    rep, pred, i = found
    assert memory_bytes(rep.config) <= CAPACITY
    assert pred.p_fit[i] == 1.0 and pred.time_mean[i] == np.log(step_time_s(rep.config))
    fitting = [r for r in repairs(space, cfg) if memory_bytes(r.config) <= CAPACITY]
    assert step_time_s(rep.config) == min(step_time_s(r.config) for r in fitting)
    assert rep.config["dtype"] == "bf16"  # neutral knob untouched


def test_no_repair_when_nothing_fits_or_all_excluded() -> None:
    space = SearchSpace.from_yaml(DENSE)
    cfg = space.validate({"zero_stage": 0, "micro_batch_size": 8})

    def never_fits(configs):
        out = _oracle_predict(configs)
        out.p_fit = np.zeros(len(configs))
        return out

    assert best_repair(space, cfg, never_fits, excluded=set()) is None
    every = {space.key(r.config) for r in repairs(space, cfg)}
    assert best_repair(space, cfg, _oracle_predict, excluded=every) is None


def test_fast_but_too_big_ranks_by_the_acquisition_without_memory() -> None:
    # candidate 0 fits and scores best; 1 and 3 would score better still if memory were no object
    log_score = np.array([-1.0, -5.0, -2.0, -4.0])
    p_fit = np.array([0.9, 0.001, 0.8, 0.01])
    # unconstrained: 0 -> -0.89, 1 -> +1.91, 2 -> -1.78, 3 -> +0.61
    assert fast_but_too_big(log_score, p_fit) == [1, 3]
    assert fast_but_too_big(log_score, p_fit, sources=1) == [1]
    assert fast_but_too_big(log_score, p_fit, scan=1) == [1]
    assert fast_but_too_big(log_score, np.ones(4)) == []  # everything fits: nothing to pair
