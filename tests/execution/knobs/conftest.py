"""What the knob handlers' tests share: the context a handler is called with."""

from __future__ import annotations

import pytest

from infrarsi.execution.knobs.registry import KnobContext


@pytest.fixture
def knob_ctx() -> KnobContext:
    """A small CPU trial's context (2 ranks, 8 sequences of 16 tokens per step)."""
    return KnobContext(
        world_size=2,
        num_params=10,
        hidden_size=8,
        global_batch_size=8,
        seq_len=16,
        device="cpu",
        config={},
    )
