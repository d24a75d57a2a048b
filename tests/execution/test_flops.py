"""FLOPs per token, the CPU peak probe, MFU, and the telemetry no-op / aggregation."""

from __future__ import annotations

import pytest

from infrarsi.execution.flops import active_params, cpu_matmul_peak_flops, flops_per_token, mfu
from infrarsi.execution.telemetry import TelemetrySampler, aggregate
from workloads.models import model_args


def test_dense_flops_per_token_matches_narayanan():
    a = model_args("dense", "debug")
    n = 5_243_136
    emb = a.vocab_size * a.dim
    assert active_params(a, n) == n - emb
    assert flops_per_token(a, n, 128) == 6 * (n - emb) + 12 * a.n_layers * a.dim * 128


def test_moe_counts_only_active_experts():
    a = model_args("moe", "debug")
    n = 9_447_680
    expert = a.n_layers * a.num_experts * 3 * a.dim * a.expert_hidden
    assert active_params(a, n) == n - a.vocab_size * a.dim - expert * 3 // 4
    dense_like = flops_per_token(a, n, 128)
    assert dense_like < 6 * n


def test_cpu_probe_and_mfu():
    peak = cpu_matmul_peak_flops(threads=1, n=256, reps=2)
    assert peak > 1e8
    assert mfu(1e6, 1e3, 2, 1e9) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        mfu(1.0, 1.0, 0, 1.0)


def test_telemetry_is_a_noop_on_cpu():
    s = TelemetrySampler("cpu").start()
    assert s.stop() == {}
    assert s.samples == []


def test_telemetry_aggregation_with_a_fake_reader():
    samples = iter(
        [{"gpu_util_pct": 50.0, "power_w": 100.0}, {"gpu_util_pct": 70.0, "power_w": 300.0}]
    )
    s = TelemetrySampler("cuda", reader=lambda: next(samples), interval_s=0.001).start()
    assert s._thread is not None
    s._thread.join(timeout=10)  # the reader is exhausted after two samples
    out = s.stop()
    assert out["gpu_util_pct"] == {"mean": 60.0, "max": 70.0, "n": 2.0}
    assert aggregate([]) == {}
