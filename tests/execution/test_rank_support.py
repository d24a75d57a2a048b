"""The end-of-trial checks: checksum and eval on the rank's device, with bounded host memory.

The reference model is built by the model code with its parameters on the meta device and
filled from the trained parameters; the checksum and eval loss must equal the plain definitions
(a float64 sum over a full fp32 copy; a fresh fp32 model loaded with that copy), and the checks
must stay under the host-memory bound stated in ``rank_support`` on a model large enough that a
full copy of its state would not."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from infrarsi.errors import WorkloadError
from infrarsi.execution import rank_support as rs
from infrarsi.execution.data_sources import Batch, MarkovSource
from infrarsi.execution.memory import MemoryCapacityExceeded, MemoryMonitor, mallinfo2_available
from workloads.models import build_model

SMALL = {"dim": 64, "n_layers": 2, "n_heads": 4, "vocab_size": 512, "ffn_hidden": 128, "max_seq_len": 32}
BIG = {"dim": 768, "n_layers": 12, "n_heads": 12, "vocab_size": 8192, "ffn_hidden": 2048, "max_seq_len": 64}
"""About 97.5M parameters: 372 MiB in fp32, its largest tensor 24 MiB."""


def _trained(overrides: dict, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return build_model("dense", "debug", overrides)


def _reference(overrides: dict) -> nn.Module:
    return rs.build_reference(lambda: build_model("dense", "debug", overrides), "cpu")


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
        return float(F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch.targets.reshape(-1)))


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
    assert not build_model("dense", "debug", SMALL).tok_embeddings.weight.is_meta  # the patch is gone


def test_checksum_is_the_float64_sum_and_squares_across_chunk_boundaries(monkeypatch) -> None:
    model = _trained(SMALL)
    want = _plain_checksum(model)
    assert math.isclose(rs.checksum_and_load(model), want, rel_tol=1e-12)
    monkeypatch.setattr(rs, "CHECKSUM_CHUNK_ELEMENTS", 1000)  # many chunks, ragged last ones
    assert math.isclose(rs.checksum_and_load(model), want, rel_tol=1e-12)
    with torch.no_grad():
        model.layers[1].feed_forward.w2.weight[3, 5] += 1e-3
    assert rs.checksum_and_load(model) != want


def test_eval_loss_equals_a_fresh_fp32_model_loaded_with_a_full_copy() -> None:
    model = _trained(SMALL)
    batch = _eval_batch(SMALL["vocab_size"], 32)
    ref = _reference(SMALL)
    checksum = rs.checksum_and_load(model, None, ref, "cpu")
    assert math.isclose(checksum, _plain_checksum(model), rel_tol=1e-12)
    got = rs.eval_loss(ref, batch, "cpu", SMALL["vocab_size"])
    assert got == pytest.approx(_plain_eval(model, SMALL, batch), abs=1e-6)


def test_eval_loss_in_chunks_of_rows_matches_the_whole_batch(monkeypatch) -> None:
    model = _trained(SMALL)
    batch = _eval_batch(SMALL["vocab_size"], 32, rows=5)
    ref = _reference(SMALL)
    rs.checksum_and_load(model, None, ref, "cpu")
    whole = rs.eval_loss(ref, batch, "cpu", SMALL["vocab_size"])
    per_row = 32 * SMALL["vocab_size"] * 4
    monkeypatch.setattr(rs, "EVAL_LOGITS_BUDGET_BYTES", 2 * per_row)  # chunks of 2, 2, 1 rows
    assert rs.eval_loss(ref, batch, "cpu", SMALL["vocab_size"]) == pytest.approx(whole, abs=1e-6)


def test_live_fp32_parameters_are_shared_and_others_copied_to_fp32() -> None:
    model = _trained(SMALL)
    ref = _reference(SMALL)
    rs.checksum_and_load(model, None, ref, "cpu")
    for (name, p), (_, r) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        assert r.data_ptr() == p.data_ptr() and not r.requires_grad, name
    low = _trained(SMALL).to(torch.bfloat16)
    ref16 = _reference(SMALL)
    rs.checksum_and_load(low, None, ref16, "cpu")
    for (name, p), (_, r) in zip(low.named_parameters(), ref16.named_parameters(), strict=True):
        assert r.dtype == torch.float32 and r.data_ptr() != p.data_ptr(), name
        assert torch.equal(r, p.float()), name


def test_a_reference_that_does_not_match_the_trained_model_is_an_error() -> None:
    ref = _reference(SMALL)
    with pytest.raises(WorkloadError, match="missing"):
        rs.checksum_and_load(_trained({**SMALL, "n_layers": 1}), None, ref, "cpu")
    with pytest.raises(WorkloadError, match="shape"):
        rs.checksum_and_load(_trained({**SMALL, "ffn_hidden": 96}), None, _reference(SMALL), "cpu")


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
    ref = rs.build_reference(_Tied, "cpu")
    rs.checksum_and_load(model, None, ref, "cpu")
    assert ref.out.weight is ref.emb.weight and torch.equal(ref.out.weight, model.emb.weight)
    x = torch.arange(16).reshape(2, 8)
    batch = Batch(x, x)
    with torch.no_grad():
        want = float(F.cross_entropy(model(x).reshape(-1, 16), x.reshape(-1)))
    assert rs.eval_loss(ref, batch, "cpu", 16) == pytest.approx(want, abs=1e-6)


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
    bound = largest + (32 << 20) + 2 * logits_bytes + (32 << 20)  # last term: layer activations and slack
    assert state_bytes > 3 * bound  # large enough that a full copy cannot hide under the bound

    monitor = MemoryMonitor("cpu", capacity_bytes=bound, poll_s=0.002)
    monitor.start()
    try:
        ref = rs.build_reference(lambda: build_model("dense", "debug", BIG), "cpu")
        monitor.check("reference built")
        checksum = rs.checksum_and_load(model, None, ref, "cpu")
        monitor.check("loaded")
        loss = rs.eval_loss(ref, batch, "cpu", BIG["vocab_size"])
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


def test_batches_are_planned_before_the_clock_with_the_same_rows_as_the_source() -> None:
    src = MarkovSource(64, 8, seed=3)
    planned = rs.plan_batches(src, 3, 8, rank=1, world=2, micro_batch_size=2, device="cpu")
    assert len(planned) == 3
    for step, mbs in enumerate(planned):
        expect = src.rank_micro_batches(step, 8, 1, 2, 2)
        assert [b.inputs.tolist() for b in mbs] == [b.inputs.tolist() for b in expect]
        assert all(not b.inputs.is_pinned() for b in mbs)  # pinned only for a cuda rank


def test_the_model_is_built_on_the_rank_device_unless_zero3_partitions_it() -> None:
    cfg0 = {"zero_optimization": {"stage": 2}}
    ctx = rs.build_context("cpu", cfg0)
    assert isinstance(ctx, torch.device) and ctx.type == "cpu"
    # ZeRO-3 but not partitionable (expert parallelism slices the built experts): on the device
    ctx = rs.build_context("cpu", {"zero_optimization": {"stage": 3}}, partitioned=False)
    assert isinstance(ctx, torch.device)


def test_every_module_draws_its_weights_in_its_own_init() -> None:
    """The same seed gives the same weights whether a model is built whole or its modules are
    built one by one (what zero.Init sees): no init pass over the finished model."""
    from workloads.models.dense.model import FeedForward, ModelArgs

    a = ModelArgs(dim=16, n_layers=2, ffn_hidden=24)
    torch.manual_seed(0)
    ffn = FeedForward(a)
    torch.manual_seed(0)
    w1 = torch.empty(24, 16)
    nn.init.normal_(w1, std=a.init_std)  # one draw per weight, in construction order
    assert torch.equal(ffn.w1.weight, w1)
    # a weight created in bf16 (as under zero.Init) gets the fp32 draw, rounded
    from workloads.models.dense.model import normal_init_

    torch.manual_seed(0)
    b = torch.empty(24, 16, dtype=torch.bfloat16)
    normal_init_(b, a.init_std)
    assert torch.equal(b, w1.to(torch.bfloat16))
    assert abs(float(ffn.w2.weight.std()) - a.init_std / 2) < 0.01


def test_phase_clock_splits_each_micro_batch_into_its_three_phases() -> None:
    clock = rs.PhaseClock("cpu")
    clock._marks = [0.0, 1.0, 3.0, 3.5, 10.0, 10.5, 11.5, 12.0]
    assert clock.micro_batch_phases() == [(1.0, 2.0, 0.5), (0.5, 1.0, 0.5)]
    clock.reset()
    clock.mark()
    assert clock.micro_batch_phases() == []  # an unfinished micro-batch has no phases yet


def test_harness_counters_see_token_ids_passed_by_keyword_too() -> None:
    class ByKeyword(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(10, 4)

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return self.emb(input_ids)

    model = ByKeyword()
    counters = rs.HarnessCounters().attach(model)
    counters.begin_step()
    model(torch.zeros(2, 5, dtype=torch.long))             # positional
    model(input_ids=torch.zeros(3, 5, dtype=torch.long))   # keyword (a Hugging Face call)
    assert (counters.step_tokens, counters.step_rows) == (25, 5)
    counters.detach()
