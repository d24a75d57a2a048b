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


SPEED = """
name: speed-tags
knobs:
  - {name: stage, type: choice, values: [0, 1, 2], memory: saver, speed: slower}
  - {name: ckpt, type: choice, values: [none, some, all], speed: slower}
  - {name: kernel, type: bool, speed: faster}
  - {name: layout, type: choice, values: [a, b, c]}
"""


def test_speed_tags_order_a_choice_and_carry_their_direction() -> None:
    enc = Encoder(SearchSpace.from_yaml(SPEED))
    # stage and ckpt are ordinal (one column each), kernel binary, layout one-hot (3 columns)
    assert enc.dim == 6
    assert enc.speed_features() == ([0, 1, 2], [1.0, 1.0, -1.0])
    X = enc.encode([{"stage": 2, "ckpt": "some", "kernel": True, "layout": "b"}])
    assert X.tolist() == [[1.0, 0.5, 1.0, 0.0, 1.0, 0.0]]
    # each knob's columns, for the step-time model's knob-value pair term
    assert enc.groups() == ((0, 1), (1, 1), (2, 1), (3, 3))


def test_input_columns_name_the_prior_columns_after_the_features() -> None:
    cols = InputColumns(n_features=5, with_prior=True)
    assert (cols.prior_time, cols.prior_memory) == (5, 6)
    assert cols.time_offset() == (5, 5) and cols.memory_offset() == (5, 6)
    plain = InputColumns(n_features=5, with_prior=False)
    assert plain.time_offset() is None and plain.memory_offset() is None
