"""The initial design: value coverage over a discrete space, never an all-corner sample."""

from __future__ import annotations

import itertools

import numpy as np
import torch

from infrarsi.search import design

NAMES = ["mbs", "ckpt", "flash"]
SPACE = [
    {"mbs": m, "ckpt": c, "flash": f}
    for m, c, f in itertools.product(
        [1, 2, 4, 8, 16, 32], ["none", "selective", "full"], [True, False]
    )
]


def _features(configs):
    mbs = {1: 0.0, 2: 0.2, 4: 0.4, 8: 0.6, 16: 0.8, 32: 1.0}
    ck = {"none": 0.0, "selective": 0.5, "full": 1.0}
    return torch.tensor(
        [[mbs[c["mbs"]], ck[c["ckpt"]], float(c["flash"])] for c in configs], dtype=torch.float64
    )


def _design(n: int, seed: int, pick) -> list[dict]:
    rng = np.random.default_rng(seed)
    X = _features(SPACE)
    seen = [{"mbs": 1, "ckpt": "full", "flash": True}]  # the baseline
    for _ in range(n):
        i = pick(SPACE, X, seen, _features(seen), rng)
        seen.append(SPACE[i])
    return seen


def test_value_novelty_counts_seen_values_per_knob() -> None:
    seen = [{"mbs": 1, "ckpt": "full", "flash": True}, {"mbs": 1, "ckpt": "none", "flash": True}]
    nov = design.value_novelty(
        [
            {"mbs": 1, "ckpt": "full", "flash": True},
            {"mbs": 8, "ckpt": "selective", "flash": False},
        ],
        seen,
        NAMES,
    )
    # first: mbs seen twice (1/3), ckpt once (1/2), flash twice (1/3); second: all new (1 each)
    assert np.allclose(nov, [(1 / 3 + 1 / 2 + 1 / 3) / 3, 1.0])


def test_bool_and_int_values_are_not_conflated() -> None:
    nov = design.value_novelty(
        [{"mbs": 1, "ckpt": "none", "flash": True}], [{"mbs": True, "ckpt": "x", "flash": 1}], NAMES
    )
    assert np.isclose(nov[0], 1.0)


def test_coverage_design_balances_values_where_maximin_goes_to_corners() -> None:
    for seed in range(5):
        cover = _design(4, seed, lambda c, X, s, E, r: design.coverage_pick(c, X, s, E, NAMES, r))
        corner = _design(4, seed, lambda c, X, s, E, r: design.maximin_pick(X, E, r))
        assert len({c["mbs"] for c in cover}) == 5  # five points, five micro-batch sizes
        assert len({c["ckpt"] for c in cover[:3]}) == 3
        assert {c["flash"] for c in cover} == {True, False}
        assert len({c["mbs"] for c in corner}) < 5  # the corners repeat: the reason for coverage


def test_weights_steer_the_design_away_from_unlikely_configs() -> None:
    rng = np.random.default_rng(0)
    X = _features(SPACE)
    seen = [{"mbs": 1, "ckpt": "full", "flash": True}]
    weights = np.array([0.0 if c["mbs"] >= 16 else 1.0 for c in SPACE])  # predicted not to fit
    for _ in range(6):
        i = design.coverage_pick(SPACE, X, seen, _features(seen), NAMES, rng, weights=weights)
        assert SPACE[i]["mbs"] < 16
        seen.append(SPACE[i])
