"""The data sources: the synthetic chain, a token file, a job's own loader; determinism and split invariance."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from infrarsi.errors import WorkloadError
from infrarsi.execution.data_sources import JobSource, MarkovSource, TokenFileSource, make_source
from infrarsi.job import ModelShape, TokenBatch, TrainingJob
from infrarsi.workload import DataSpec


def test_global_batch_is_fixed_by_seed_and_step():
    a, b = MarkovSource(4096, 128, 7), MarkovSource(4096, 128, 7)
    assert torch.equal(a.global_batch(3, 16).inputs, b.global_batch(3, 16).inputs)
    assert not torch.equal(a.global_batch(3, 16).inputs, a.global_batch(4, 16).inputs)
    assert not torch.equal(
        a.global_batch(3, 16).inputs, MarkovSource(4096, 128, 8).global_batch(3, 16).inputs
    )
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
    assert e.inputs.shape == (4, 32)
    assert all(not torch.equal(e.inputs, s.global_batch(k, 16).inputs) for k in range(5))


def test_source_is_learnable():
    s = MarkovSource(256, 64, 0, fanout=4)
    # entropy rate of the chain is far below ln(vocab): a model can learn it
    ent = float(-(s.probs * s.probs.log()).sum(-1).mean())
    assert ent < 0.5 * torch.log(torch.tensor(256.0)).item()


def _token_file(tmp_path, n: int = 4000, vocab: int = 100, suffix: str = ".bin"):
    ids = (np.arange(n) * 7 % vocab).astype(np.uint16)
    p = tmp_path / f"tokens{suffix}"
    if suffix == ".npy":
        np.save(p, ids.astype(np.int32))
    else:
        ids.tofile(p)
    return p, ids


@pytest.mark.parametrize("suffix", [".bin", ".npy"])
def test_token_file_windows_are_consecutive_and_fixed_by_step(tmp_path, suffix):
    p, ids = _token_file(tmp_path, suffix=suffix)
    src = TokenFileSource(p, seq_len=16, vocab_size=100)
    b = src.global_batch(2, 4)
    assert b.inputs.shape == (4, 16) and b.inputs.dtype == torch.long
    start = (2 * 4 + 1) * 16  # row 1 of step 2
    assert b.inputs[1].tolist() == ids[start : start + 16].tolist()
    assert b.targets[1].tolist() == ids[start + 1 : start + 17].tolist()
    assert torch.equal(b.inputs, TokenFileSource(p, 16, 100).global_batch(2, 4).inputs)
    rows = [m.inputs for r in range(2) for m in src.rank_micro_batches(2, 4, r, 2, 1)]
    assert torch.equal(torch.cat(rows), b.inputs)


def test_token_file_eval_windows_are_never_trained_on(tmp_path):
    p, ids = _token_file(tmp_path, n=2000)
    src = TokenFileSource(p, seq_len=16, vocab_size=100, eval_rows=4)
    held_out_from = len(ids) - 4 * 17
    e = src.eval_batch()
    assert e.inputs.shape == (4, 16)
    assert e.inputs[0].tolist() == ids[held_out_from : held_out_from + 16].tolist()
    for step in range(200):  # training wraps around inside the first part of the file
        starts = [((step * 8 + r) * 16) % (held_out_from - 16) for r in range(8)]
        assert max(starts) + 17 <= held_out_from


def test_token_file_errors_name_the_problem(tmp_path):
    with pytest.raises(WorkloadError, match="does not exist"):
        TokenFileSource(tmp_path / "nope.bin", 16, 100)
    p, _ = _token_file(tmp_path, n=60)
    with pytest.raises(WorkloadError, match="needs at least"):
        TokenFileSource(p, 16, 100)
    p, _ = _token_file(tmp_path, n=4000, vocab=100)
    with pytest.raises(WorkloadError, match="outside the model's vocabulary"):
        TokenFileSource(p, 16, vocab_size=50).global_batch(0, 4)


def test_make_source_picks_the_job_loader_then_the_token_file_then_synthetic(tmp_path):
    p, _ = _token_file(tmp_path)
    tokens = DataSpec(kind="tokens", path="tokens.bin", seq_len=16)
    assert isinstance(make_source(tokens, 100, data_path=str(p)), TokenFileSource)
    assert isinstance(make_source(DataSpec(seq_len=16), 100), MarkovSource)

    def own(step: int, rows: int) -> TokenBatch:
        x = torch.full((rows, 17), step, dtype=torch.int32)
        return TokenBatch(x[:, :-1], x[:, 1:])

    job = TrainingJob(
        build_model=lambda: torch.nn.Linear(1, 1), shape=ModelShape(1, 1, 100), global_batch=own
    )
    src = make_source(DataSpec(seq_len=16), 100, job=job)
    assert isinstance(src, JobSource)
    b = src.global_batch(3, 2)
    assert b.inputs.dtype == torch.long and int(b.inputs[0, 0]) == 3
    assert src.eval_batch().inputs.shape == (4, 16)  # no eval loader: the synthetic held-out batch
