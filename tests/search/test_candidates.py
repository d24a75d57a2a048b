"""The candidate pool (``candidates.py``): every config of a small space, or a sample plus anchors."""

from __future__ import annotations

import numpy as np
from search_synthetic import BASELINE, CAPACITY, DENSE, TINY, TINY_CAP, run, tiny_run

from infrarsi.search import Optimizer, OptimizerSettings, SearchSpace


def test_sampled_candidates_start_from_the_baseline_and_keep_the_local_neighbourhood() -> None:
    """Above ``candidate_cap`` the optimizer scores a random subset: the baseline must still come
    first, and a local step must still see the fastest config's two-change neighbourhood."""
    space = SearchSpace.from_yaml(DENSE)
    n_valid = len(space.enumerate() or [])
    baseline = space.validate(BASELINE)
    opt = Optimizer(
        space,
        memory_capacity=CAPACITY,
        seed=3,
        baseline=baseline,
        settings=OptimizerSettings(candidate_cap=40),
    )
    assert n_valid > 40  # so the sampled path runs
    first = opt.ask()
    assert first == baseline and opt.last_ask_info.phase == "baseline"
    opt.tell(first, run(first))
    configs, _ = opt.pool.candidates(set(), opt.models.ok(opt.history), opt.rng)
    keys = {space.key(c) for c in configs}
    two_away = [nb2 for nb in space.neighbours(first) for nb2 in space.neighbours(nb)]
    assert all(space.key(c) in keys for c in two_away)
    assert len(configs) < n_valid  # still a subset, not the whole space


def test_a_small_space_is_scored_whole_and_near_counts_knob_changes() -> None:
    space = SearchSpace.from_yaml(TINY)
    opt = Optimizer(
        space, memory_capacity=TINY_CAP, seed=0, settings=OptimizerSettings(local_radius=1)
    )
    pool = opt.pool
    assert pool.scores_every_config and pool.enumerated_values is not None
    every = [space.as_config(v) for v in pool.enumerated_values]
    first = every[0]
    opt.tell(first, tiny_run(first))
    configs, X = pool.candidates({space.key(first)}, opt.models.ok(opt.history), opt.rng)
    assert len(configs) == len(every) - 1 and X.shape == (len(configs), opt.encoder.dim)
    near = pool.near(configs, first)
    assert near.tolist() == [sum(c[n] != first[n] for n in space.names) <= 1 for c in configs]
    assert not pool.near(configs, None).any() and isinstance(near, np.ndarray)


def test_untried_near_keeps_the_neighbours_holding_a_value_new_near_the_incumbent() -> None:
    space = SearchSpace.from_yaml(TINY)
    opt = Optimizer(
        space, memory_capacity=TINY_CAP, seed=0, settings=OptimizerSettings(local_radius=1)
    )
    pool = opt.pool
    assert pool.enumerated_values is not None
    every = [space.as_config(v) for v in pool.enumerated_values]
    inc = every[0]
    near = [c for c in every if sum(c[n] != inc[n] for n in space.names) == 1]
    tried = [inc, near[0]]
    far = next(c for c in every if sum(c[n] != inc[n] for n in space.names) == len(space.names))
    untried = pool.untried_near(every, inc, [*tried, far])  # a far config counts for nothing
    # every neighbour but near[0] holds a value new near the incumbent; far's values do not count
    assert untried.tolist() == [c in near and c != near[0] for c in every]
    assert untried.any() and not pool.untried_near(every, None, tried).any()
    assert not pool.untried_near(every, inc, every).any()  # everything tried: nothing new


def test_far_keeps_the_configs_more_than_the_radius_from_every_tried_one() -> None:
    space = SearchSpace.from_yaml(TINY)
    opt = Optimizer(
        space, memory_capacity=TINY_CAP, seed=0, settings=OptimizerSettings(local_radius=1)
    )
    assert opt.pool.enumerated_values is not None
    every = [space.as_config(v) for v in opt.pool.enumerated_values]
    tried = every[:2]

    def changes(a: dict, b: dict) -> int:
        return sum(a[n] != b[n] for n in space.names)

    far = opt.pool.far(every, tried)
    assert far.tolist() == [min(changes(c, t) for t in tried) > 1 for c in every]
    assert far.any() and not far[:2].any()
    assert opt.pool.far(every, []).all()  # nothing tried: every region is new
