"""The synthetic data source: determinism and split invariance."""

from __future__ import annotations

import pytest
import torch

from infrarsi.execution.data_sources import MarkovSource


def test_global_batch_is_fixed_by_seed_and_step():
    a, b = MarkovSource(4096, 128, 7), MarkovSource(4096, 128, 7)
    assert torch.equal(a.global_batch(3, 16).inputs, b.global_batch(3, 16).inputs)
    assert not torch.equal(a.global_batch(3, 16).inputs, a.global_batch(4, 16).inputs)
    assert not torch.equal(a.global_batch(3, 16).inputs, MarkovSource(4096, 128, 8).global_batch(3, 16).inputs)
    bt = a.global_batch(0, 4)
    assert torch.equal(bt.inputs[:, 1:], bt.targets[:, :-1])


@pytest.mark.parametrize("world,mbs", [(1, 16), (2, 1), (2, 4), (4, 2), (2, 8)])
def test_any_split_reassembles_the_global_batch(world, mbs):
    s = MarkovSource(4096, 32, 1)
    rows = [b.inputs for r in range(world) for b in s.rank_micro_batches(5, 16, r, world, mbs)]
    assert all(x.shape[0] == mbs for x in rows)
    assert torch.equal(torch.cat(rows), s.global_batch(5, 16).inputs)


def test_bad_split_and_eval_batch():
    s = MarkovSource(4096, 32, 1)
    with pytest.raises(ValueError, match="does not split"):
        s.rank_micro_batches(0, 16, 0, 2, 3)
    e = s.eval_batch()
    assert e.inputs.shape == (16, 32)
    assert all(not torch.equal(e.inputs, s.global_batch(k, 16).inputs) for k in range(5))


def test_source_is_learnable():
    s = MarkovSource(256, 64, 0, fanout=4)
    # entropy rate of the chain is far below ln(vocab): a model can learn it
    ent = float(-(s.probs * s.probs.log()).sum(-1).mean())
    assert ent < 0.5 * torch.log(torch.tensor(256.0)).item()
