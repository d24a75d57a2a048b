"""The end-of-trial checks: checksum and eval on the rank's device, with bounded host memory.

The reference model is built by the model code with its parameters on the meta device and
filled from the trained parameters; the checksum and eval loss must equal the plain definitions
(a float64 sum over a full fp32 copy; a fresh fp32 model loaded with that copy), and the checks
must stay under the host-memory bound stated in ``end_checks`` on a model large enough that a
full copy of its state would not."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from infrarsi.errors import WorkloadError
from infrarsi.execution import end_checks
from infrarsi.execution.data_sources import Batch, MarkovSource
from infrarsi.execution.memory import MemoryCapacityExceeded, MemoryMonitor, mallinfo2_available
from workloads.models import build_model

SMALL = {
    "dim": 64,
    "n_layers": 2,
    "n_heads": 4,
    "vocab_size": 512,
    "ffn_hidden": 128,
    "max_seq_len": 32,
}
BIG = {
    "dim": 768,
    "n_layers": 12,
    "n_heads": 12,
    "vocab_size": 8192,
    "ffn_hidden": 2048,
    "max_seq_len": 64,
}
"""About 97.5M parameters: 372 MiB in fp32, its largest tensor 24 MiB."""


def _trained(overrides: dict, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return build_model("dense", "debug", overrides)


def _reference(overrides: dict) -> nn.Module:
    return end_checks.build_reference(lambda: build_model("dense", "debug", overrides), "cpu")


def _eval_batch(vocab: int, seq: int, rows: int = 16) -> Batch:
    return MarkovSource(vocab, seq, seed=7).eval_batch(rows)


def _plain_checksum(model: nn.Module) -> float:
    tot = 0.0
    for _, p in sorted(model.named_parameters()):
        t = p.detach().double()
        tot += float(t.sum()) + float((t * t).sum())
    return tot


def _plain_eval(model: nn.Module, overrides: dict, batch: Batch) -> float:
    """The definition: a fresh fp32 model loaded with a full copy of the state, whole batch."""
    fresh = build_model("dense", "debug", overrides)
    fresh.load_state_dict({k: v.detach().float().clone() for k, v in model.state_dict().items()})
    with torch.no_grad():
        logits = fresh(batch.inputs)
        return float(
            F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch.targets.reshape(-1))
        )


def test_reference_build_puts_parameters_on_meta_keeps_buffers_and_rng() -> None:
    torch.manual_seed(3)
    before = torch.random.get_rng_state()
    ref = _reference(SMALL)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert all(p.is_meta for p in ref.parameters())
    assert not ref.training
    plain = build_model("dense", "debug", SMALL)
    for (name, b), (_, b_plain) in zip(ref.named_buffers(), plain.named_buffers(), strict=True):
        assert not b.is_meta and torch.equal(b, b_plain), name
    assert nn.Module.register_parameter is torch.nn.modules.module.Module.register_parameter
    assert not build_model(
        "dense", "debug", SMALL
    ).tok_embeddings.weight.is_meta  # the patch is gone


def test_checksum_is_the_float64_sum_and_squares_across_chunk_boundaries(monkeypatch) -> None:
    model = _trained(SMALL)
    want = _plain_checksum(model)
    assert math.isclose(end_checks.checksum_and_load(model), want, rel_tol=1e-12)
    monkeypatch.setattr(
        end_checks, "CHECKSUM_CHUNK_ELEMENTS", 1000
    )  # many chunks, ragged last ones
    assert math.isclose(end_checks.checksum_and_load(model), want, rel_tol=1e-12)
    with torch.no_grad():
        model.layers[1].feed_forward.w2.weight[3, 5] += 1e-3
    assert end_checks.checksum_and_load(model) != want


def test_eval_loss_equals_a_fresh_fp32_model_loaded_with_a_full_copy() -> None:
    model = _trained(SMALL)
    batch = _eval_batch(SMALL["vocab_size"], 32)
    ref = _reference(SMALL)
    checksum = end_checks.checksum_and_load(model, None, ref, "cpu")
    assert math.isclose(checksum, _plain_checksum(model), rel_tol=1e-12)
    got = end_checks.eval_loss(ref, batch, "cpu", SMALL["vocab_size"])
    assert got == pytest.approx(_plain_eval(model, SMALL, batch), abs=1e-6)


def test_eval_loss_in_chunks_of_rows_matches_the_whole_batch(monkeypatch) -> None:
    model = _trained(SMALL)
    batch = _eval_batch(SMALL["vocab_size"], 32, rows=5)
    ref = _reference(SMALL)
    end_checks.checksum_and_load(model, None, ref, "cpu")
    whole = end_checks.eval_loss(ref, batch, "cpu", SMALL["vocab_size"])
    per_row = 32 * SMALL["vocab_size"] * 4
    monkeypatch.setattr(
        end_checks, "EVAL_LOGITS_BUDGET_BYTES", 2 * per_row
    )  # chunks of 2, 2, 1 rows
    assert end_checks.eval_loss(ref, batch, "cpu", SMALL["vocab_size"]) == pytest.approx(
        whole, abs=1e-6
    )


def test_live_fp32_parameters_are_shared_and_others_copied_to_fp32() -> None:
    model = _trained(SMALL)
    ref = _reference(SMALL)
    end_checks.checksum_and_load(model, None, ref, "cpu")
    for (name, p), (_, r) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        assert r.data_ptr() == p.data_ptr() and not r.requires_grad, name
    low = _trained(SMALL).to(torch.bfloat16)
    ref16 = _reference(SMALL)
    end_checks.checksum_and_load(low, None, ref16, "cpu")
    for (name, p), (_, r) in zip(low.named_parameters(), ref16.named_parameters(), strict=True):
        assert r.dtype == torch.float32 and r.data_ptr() != p.data_ptr(), name
        assert torch.equal(r, p.float()), name


def test_a_reference_that_does_not_match_the_trained_model_is_an_error() -> None:
    ref = _reference(SMALL)
    with pytest.raises(WorkloadError, match="missing"):
        end_checks.checksum_and_load(_trained({**SMALL, "n_layers": 1}), None, ref, "cpu")
    with pytest.raises(WorkloadError, match="shape"):
        end_checks.checksum_and_load(
            _trained({**SMALL, "ffn_hidden": 96}), None, _reference(SMALL), "cpu"
        )


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.out = nn.Linear(8, 16, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.emb(x))


def test_tied_parameters_fill_every_holder() -> None:
    torch.manual_seed(0)
    model = _Tied()
    ref = end_checks.build_reference(_Tied, "cpu")
    end_checks.checksum_and_load(model, None, ref, "cpu")
    assert ref.out.weight is ref.emb.weight and torch.equal(ref.out.weight, model.emb.weight)
    x = torch.arange(16).reshape(2, 8)
    batch = Batch(x, x)
    with torch.no_grad():
        want = float(F.cross_entropy(model(x).reshape(-1, 16), x.reshape(-1)))
    assert end_checks.eval_loss(ref, batch, "cpu", 16) == pytest.approx(want, abs=1e-6)


@pytest.mark.skipif(not mallinfo2_available(), reason="needs glibc mallinfo2")
def test_host_memory_of_the_checks_is_bounded_independent_of_model_size() -> None:
    """The stated bound (CPU, fp32 parameters): the largest parameter + 32 MiB + the eval
    forward of one chunk. The model's state is several times that, so any full copy of it (the
    old gather-to-host path, or a fresh fp32 reference model) crosses the capacity and raises."""
    model = _trained(BIG)
    params = list(model.parameters())
    state_bytes = sum(p.numel() * 4 for p in params)
    largest = max(p.numel() * 4 for p in params)
    seq, rows = 32, 4
    batch = _eval_batch(BIG["vocab_size"], seq, rows)
    logits_bytes = rows * seq * BIG["vocab_size"] * 4
    bound = (
        largest + (32 << 20) + 2 * logits_bytes + (32 << 20)
    )  # last term: layer activations and slack
    assert state_bytes > 3 * bound  # large enough that a full copy cannot hide under the bound

    monitor = MemoryMonitor("cpu", capacity_bytes=bound, poll_s=0.002)
    monitor.start()
    try:
        ref = end_checks.build_reference(lambda: build_model("dense", "debug", BIG), "cpu")
        monitor.check("reference built")
        checksum = end_checks.checksum_and_load(model, None, ref, "cpu")
        monitor.check("loaded")
        loss = end_checks.eval_loss(ref, batch, "cpu", BIG["vocab_size"])
        monitor.check("evaluated")
    finally:
        monitor.stop()
    assert 0 < monitor.peak_bytes <= bound
    assert math.isfinite(checksum) and math.isfinite(loss)

    # the same measure catches a full fp32 copy of the state (what the checks used to make)
    copies: dict[str, torch.Tensor] = {}
    monitor = MemoryMonitor("cpu", capacity_bytes=bound, poll_s=0.002)
    monitor.start()
    try:
        with pytest.raises(MemoryCapacityExceeded):
            for name, p in model.named_parameters():
                copies[name] = p.detach().float().cpu().clone()
                monitor.check("copy")
    finally:
        monitor.stop()
        copies.clear()
