"""Configs to model features (``encoding.py``): the feature layout, memory-tagged features and input columns."""

from __future__ import annotations

from search_synthetic import TINY

from infrarsi.search import SearchSpace
from infrarsi.search.encoding import Encoder, InputColumns


def test_features_are_in_the_unit_cube_and_memory_features_carry_their_direction() -> None:
    space = SearchSpace.from_yaml(TINY)
    enc = Encoder(space)
    X = enc.encode(space.enumerate() or [])
    assert X.shape[1] == enc.dim and float(X.min()) >= 0.0 and float(X.max()) <= 1.0
    idx, signs = enc.memory_features()
    tags = {k.name: k.memory for k in space.knobs if k.memory != "neutral"}
    assert len(idx) == len(signs) == len(tags)
    assert sorted(signs) == sorted(1.0 if m == "hungry" else -1.0 for m in tags.values())


def test_input_columns_name_the_prior_columns_after_the_features() -> None:
    cols = InputColumns(n_features=5, with_prior=True)
    assert (cols.prior_time, cols.prior_memory) == (5, 6)
    assert cols.time_offset() == (5, 5) and cols.memory_offset() == (5, 6)
    plain = InputColumns(n_features=5, with_prior=False)
    assert plain.time_offset() is None and plain.memory_offset() is None
