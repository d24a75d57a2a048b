"""The prior registry (``priors/registry.py``): saved priors are rebuilt by kind."""

from __future__ import annotations

import pytest
from search_synthetic import SyntheticPrior

from infrarsi.search.priors.registry import PRIORS, prior_from_spec
from infrarsi.search.priors.transformer import TransformerPrior, transformer_shape


def test_unknown_prior_kind_is_a_clear_error() -> None:
    from infrarsi.errors import SearchSpaceError

    with pytest.raises(SearchSpaceError, match=r"prior\.kind.*known kinds"):
        prior_from_spec({"kind": "nope"})


def test_known_kinds_are_rebuilt_from_their_spec() -> None:
    shape = transformer_shape(
        n_layers=2, hidden=64, n_heads=4, vocab=100, seq_len=32, global_batch=8, world_size=2
    )
    rebuilt = prior_from_spec(TransformerPrior(shape).spec())
    assert isinstance(rebuilt, TransformerPrior) and rebuilt.shape == shape
    assert "synthetic_test" in PRIORS and isinstance(
        prior_from_spec({"kind": "synthetic_test"}), SyntheticPrior
    )
