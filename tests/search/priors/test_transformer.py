"""The transformer job's analytic prior: its terms move the way the physics says."""

from __future__ import annotations

import itertools

import numpy as np

from infrarsi.search.priors.registry import prior_from_spec
from infrarsi.search.priors.transformer import (
    MEMORY_TERMS,
    TIME_TERMS,
    TransformerPrior,
    transformer_shape,
)

SHAPE = transformer_shape(
    n_layers=32, hidden=4096, n_heads=32, vocab=128256, seq_len=2048, global_batch=512, world_size=8
)
BASE = {
    "zero_stage": 1,
    "micro_batch_size": 2,
    "activation_checkpointing": "none",
    "tp": 1,
    "pp": 1,
    "dtype": "bf16",
    "offload_optimizer": False,
    "overlap_comm": False,
    "flash_attention": True,
}


def _terms(**change: object) -> tuple[dict[str, float], dict[str, float]]:
    T, M = TransformerPrior(SHAPE).terms([{**BASE, **change}])
    return dict(zip(TIME_TERMS, T[0], strict=True)), dict(zip(MEMORY_TERMS, M[0], strict=True))


def test_default_param_count_is_llama_like() -> None:
    assert 7.0e9 < SHAPE.num_params < 8.5e9


def test_memory_terms_follow_zero_checkpointing_and_micro_batch() -> None:
    states = [_terms(zero_stage=z)[1]["model_states"] for z in (0, 1, 2, 3)]
    assert all(a > b for a, b in itertools.pairwise(states))
    acts = [
        _terms(activation_checkpointing=k, flash_attention=False)[1]["activations"]
        for k in ("none", "selective", "full")
    ]
    assert acts[0] > acts[1] > acts[2]
    # with flash attention the score matrix is never stored: selective recomputation saves nothing more
    assert (
        _terms(activation_checkpointing="selective")[1]["activations"] == _terms()[1]["activations"]
    )
    assert (
        _terms(micro_batch_size=4)[1]["activations"] > _terms(micro_batch_size=2)[1]["activations"]
    )
    assert _terms(offload_optimizer=True)[1]["model_states"] < _terms()[1]["model_states"]
    assert _terms(tp=2)[1]["activations"] < _terms()[1]["activations"]
    assert _terms(flash_attention=False)[1]["activations"] > _terms()[1]["activations"]


def test_under_pipeline_parallelism_the_logits_count_on_the_last_stage_only() -> None:
    """1F1B: the first stage holds L layers' activations, the last stage L/pp layers' and the
    logits; the prior's activations plus logits are the larger of the two (the peak device's)."""
    s, mbs, h, L = 2048, 2, 4096, 32
    layer = (
        s * mbs * h * 34
    )  # bytes a layer keeps in bf16 with flash attention (Korthikanti et al.)
    stored = {"none": layer * L, "selective": layer * L, "full": 2 * s * mbs * h * L}
    working = {"none": 0.0, "selective": 0.0, "full": float(layer)}
    logits = _terms()[1]["logits"]
    for pp, ckpt in itertools.product((2, 4, 8), ("none", "selective", "full")):
        m = _terms(pp=pp, activation_checkpointing=ckpt)[1]
        assert m["activations"] == stored[ckpt] + working[ckpt]
        first = stored[ckpt] + working[ckpt]
        last = stored[ckpt] / pp + working[ckpt] + logits
        assert np.isclose(m["activations"] + m["logits"], max(first, last))
    # a wide vocabulary on a small model: the last stage is the peak device
    small = transformer_shape(
        n_layers=4, hidden=512, n_heads=8, vocab=128256, seq_len=2048, global_batch=64, world_size=8
    )
    _, M = TransformerPrior(small).terms([{**BASE, "pp": 2}, BASE])
    logits_at = dict(zip(MEMORY_TERMS, M[0], strict=True))["logits"]
    assert 0 < logits_at < dict(zip(MEMORY_TERMS, M[1], strict=True))["logits"]


def test_time_terms_follow_recompute_offload_and_parallelism() -> None:
    base_t, _ = _terms()
    assert _terms(activation_checkpointing="full")[0]["compute_bf16"] > base_t["compute_bf16"]
    assert _terms(dtype="fp32")[0]["compute_bf16"] == 0.0 < _terms(dtype="fp32")[0]["compute_fp32"]
    assert base_t["offload"] == 0.0 < _terms(offload_optimizer=True)[0]["offload"]
    assert base_t["tp_comm"] == 0.0 < _terms(tp=2)[0]["tp_comm"]
    assert base_t["pipeline_bubble"] == 0.0 < _terms(pp=2)[0]["pipeline_bubble"]
    assert _terms(micro_batch_size=1)[0]["micro_batch_overhead"] > base_t["micro_batch_overhead"]
    assert _terms(zero_stage=3)[0]["dp_comm"] > base_t["dp_comm"]


def test_gemm_efficiency_terms_follow_micro_batch_and_tensor_parallel_width() -> None:
    base_t, _ = _terms()
    ideal = base_t["compute_bf16"]
    # first order: short GEMMs lose r0 / rows, narrow ones w0 * tp / hidden, of the ideal time
    assert np.isclose(base_t["short_gemm"], ideal * SHAPE.gemm_rows0 / (2 * SHAPE.seq_len))
    assert np.isclose(base_t["narrow_gemm"], ideal * SHAPE.gemm_width0 / SHAPE.hidden)
    assert np.isclose(_terms(micro_batch_size=1)[0]["short_gemm"], 2 * base_t["short_gemm"])
    assert np.isclose(_terms(tp=2)[0]["narrow_gemm"], 2 * base_t["narrow_gemm"])
    fp32, _ = _terms(dtype="fp32")  # the losses scale the dtype's own compute time
    assert np.isclose(fp32["short_gemm"] / fp32["compute_fp32"], base_t["short_gemm"] / ideal)


def test_missing_knobs_take_neutral_defaults_and_every_row_is_positive() -> None:
    T, M = TransformerPrior(SHAPE).terms([{}, {"zero_stage": 3}])
    assert np.all(T >= 0) and np.all(M >= 0)
    assert np.all(T.sum(1) > 0) and np.all(M.sum(1) > 0)


def test_spec_round_trip() -> None:
    p = TransformerPrior(SHAPE)
    q = prior_from_spec(p.spec())
    assert isinstance(q, TransformerPrior) and q.shape == p.shape
    assert np.array_equal(q.terms([BASE])[0], p.terms([BASE])[0])


def test_bucket_buffers_are_allocated_at_their_size_even_for_a_small_model() -> None:
    small = transformer_shape(
        n_layers=4,
        hidden=256,
        n_heads=4,
        vocab=4096,
        seq_len=128,
        global_batch=16,
        world_size=2,
        num_params=5.2e6,
    )
    _, M = TransformerPrior(small).terms(
        [
            {"zero_stage": 2, "reduce_bucket_size": 50_000_000},
            {"zero_stage": 2, "reduce_bucket_size": "auto"},
        ]
    )
    buffers = dict(enumerate(MEMORY_TERMS))
    col = next(i for i, n in buffers.items() if n == "buffers")
    assert M[0, col] == 50_000_000 * 4  # 200 MB: what made the demo's trial OOM
    assert M[1, col] == 5.2e6 * 4  # auto: one bucket for the whole model
