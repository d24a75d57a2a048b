"""The ``surrogate`` backend: formulas against hand computations, determinism, noise, OOM."""

from __future__ import annotations

import statistics

import pytest

from infrarsi.execution.knobs.registry import KNOB_HANDLERS, check_handlers
from infrarsi.execution.surrogate.backend import run_surrogate
from infrarsi.execution.surrogate.model import MODELS, evaluate, problem_from_params
from infrarsi.search import SearchSpace
from infrarsi.workload import Workload

W1 = "workloads/surrogate_dense_1node.yaml"
W2 = "workloads/surrogate_dense_2node.yaml"
FAST = {
    "zero_stage": 1,
    "micro_batch_size": 4,
    "activation_checkpointing": "none",
    "tp": 2,
    "pp": 1,
    "flash_attention": True,
    "dtype": "bf16",
    "offload_optimizer": False,
    "overlap_comm": True,
    "reduce_bucket_size": 200000000,
}


@pytest.fixture(scope="module")
def wl() -> Workload:
    return Workload.from_yaml(W1)


def _problem(ws: int = 8, cap: int = 80 * 10**9):  # type: ignore[no-untyped-def]
    return problem_from_params(
        world_size=ws,
        global_batch=1024,
        seq_len=2048,
        params={},
        model_size="8b",
        memory_capacity_bytes=cap,
    )


def test_zero_model_states_match_rajbhandari() -> None:
    p = _problem()
    n = MODELS["8b"].num_params
    assert 7.9e9 < n < 8.1e9
    base = {
        "tp": 1,
        "pp": 1,
        "micro_batch_size": 1,
        "activation_checkpointing": "full",
        "flash_attention": True,
    }
    states = {
        z: evaluate(p, {**base, "zero_stage": z}).memory_parts_bytes["model_states"]
        for z in range(4)
    }
    assert states[0] == pytest.approx(16 * n)
    assert states[1] == pytest.approx(4 * n + 12 * n / 8)
    assert states[2] == pytest.approx(2 * n + 14 * n / 8)
    assert states[3] < states[2] < states[1] < states[0]


def test_activation_memory_matches_korthikanti() -> None:
    p = _problem(cap=10**15)
    m = MODELS["8b"]
    s, h, a, L, V = 2048, m.hidden, m.n_heads, m.n_layers, m.vocab
    cfg = {
        "zero_stage": 3,
        "tp": 1,
        "pp": 1,
        "micro_batch_size": 2,
        "activation_checkpointing": "none",
        "flash_attention": False,
    }
    acts = evaluate(p, cfg).memory_parts_bytes["activations"]
    assert acts == pytest.approx(L * s * 2 * h * (34 + 5 * a * s / h) + s * 2 * V * 6)
    with_tp = evaluate(p, {**cfg, "tp": 4}).memory_parts_bytes["activations"]
    assert with_tp == pytest.approx(acts / 4)
    flash = evaluate(p, {**cfg, "flash_attention": True}).memory_parts_bytes["activations"]
    selective = evaluate(
        p, {**cfg, "activation_checkpointing": "selective", "flash_attention": True}
    ).memory_parts_bytes["activations"]
    full = evaluate(
        p, {**cfg, "activation_checkpointing": "full", "flash_attention": True}
    ).memory_parts_bytes["activations"]
    assert full < selective <= flash < acts


def test_step_time_follows_flops_and_parallelism() -> None:
    p = _problem()
    fast = evaluate(p, FAST)
    assert fast.fits and 0.3 < fast.mfu < 0.65
    recompute = evaluate(p, {**FAST, "activation_checkpointing": "full"})
    assert recompute.step_time_s > 1.2 * fast.step_time_s
    assert recompute.phase_times_s["recompute"] == pytest.approx(recompute.phase_times_s["forward"])
    z3_small = evaluate(p, {**FAST, "zero_stage": 3, "micro_batch_size": 1})
    z3_big = evaluate(p, {**FAST, "zero_stage": 3, "micro_batch_size": 8})
    z1_small = evaluate(p, {**FAST, "micro_batch_size": 1})
    # ZeRO-3 gathers parameters every micro-batch: costly at mbs 1, much less at mbs 8
    assert (
        z3_small.step_time_s / z1_small.step_time_s
        > z3_big.step_time_s / evaluate(p, {**FAST, "micro_batch_size": 8}).step_time_s
    )
    pipe = evaluate(p, {**FAST, "zero_stage": 1, "pp": 4, "tp": 1, "micro_batch_size": 32})
    gas = 1024 // (2 * 32)
    busy = pipe.phase_times_s["forward"] + pipe.phase_times_s["backward"]
    assert pipe.phase_times_s["bubble"] >= busy * 3 / gas
    two_node = problem_from_params(
        world_size=16, global_batch=1024, seq_len=2048, params={}, model_size="8b"
    )
    assert (
        evaluate(two_node, {**FAST, "zero_stage": 3}).phase_times_s["communication"]
        > evaluate(p, {**FAST, "zero_stage": 3}).phase_times_s["communication"]
    )


def test_invalid_parallel_layout_fails() -> None:
    p = problem_from_params(
        world_size=12, global_batch=1024, seq_len=2048, params={}, model_size="8b"
    )
    ev = evaluate(p, {**FAST, "tp": 8})
    assert not ev.valid and "divide" in ev.reason


def test_run_is_deterministic_and_simulated(wl: Workload) -> None:
    a = run_surrogate(wl, FAST, trial_id="t1", stage="run", seed=3)
    b = run_surrogate(wl, FAST, trial_id="t1", stage="run", seed=3)
    c = run_surrogate(wl, FAST, trial_id="t2", stage="run", seed=3)
    assert a.status == "ok" and a.simulated and a.memory_measure == "surrogate"
    assert a.step_time_samples_s == b.step_time_samples_s and a.step_time_s == b.step_time_s
    assert a.step_time_s != c.step_time_s
    assert a.world_size == 8 and a.nodes == 1 and a.tokens_per_step == wl.tokens_per_step
    assert a.optimizer_steps == wl.steps.warmup + wl.steps.measured == len(a.loss)
    assert a.device_seconds > 8 * a.step_time_s * wl.steps.measured
    assert a.peak_memory_bytes is not None and a.peak_memory_bytes <= 80 * 10**9
    assert set(a.phase_times_s) >= {"forward", "backward", "communication", "optimizer"}
    assert 0 < (a.mfu or 0) < 1 and a.tokens_per_s == pytest.approx(
        wl.tokens_per_step / a.step_time_s
    )


def test_oom_is_censored_at_capacity(wl: Workload) -> None:
    r = run_surrogate(
        wl, {**FAST, "zero_stage": 0, "micro_batch_size": 32, "tp": 1}, trial_id="t", seed=0
    )
    assert r.status == "oom" and r.memory_censored and r.peak_memory_bytes == 80 * 10**9
    assert r.step_time_s is None and r.device_seconds > 0 and "out of memory" in r.error
    small = run_surrogate(wl, FAST, trial_id="t", seed=0, memory_capacity_bytes=20 * 10**9)
    assert small.status == "oom" and small.peak_memory_bytes == 20 * 10**9


def test_noise_crashes_and_loss(wl: Workload) -> None:
    runs = [run_surrogate(wl, FAST, trial_id=f"t{i}", seed=0) for i in range(300)]
    ok = [r.step_time_s for r in runs if r.status == "ok"]
    failed = [r for r in runs if r.status == "failed"]
    q = statistics.quantiles(ok, n=4)  # type: ignore[arg-type]
    robust_cv = (q[2] - q[0]) / 1.349 / statistics.median(ok)  # type: ignore[arg-type]
    assert 0.025 < robust_cv < 0.06
    assert max(ok) / statistics.median(ok) > 1.15  # type: ignore[arg-type,operator]  # stragglers
    assert 0 < len(failed) < 15 and all(r.device_seconds > 0 for r in failed)
    oks = [r for r in runs if r.status == "ok"]
    assert oks[0].loss == oks[1].loss and oks[0].config == oks[1].config
    fp32 = run_surrogate(
        wl, {**FAST, "dtype": "fp32", "zero_stage": 3, "micro_batch_size": 1}, trial_id="x", seed=0
    )
    assert fp32.status == "ok", fp32.error
    diff = max(abs(x - y) for x, y in zip(fp32.loss, oks[0].loss, strict=True))
    assert 0 < diff < 1e-3


def test_space_workloads_and_handlers() -> None:
    space = SearchSpace.from_yaml("search_spaces/surrogate_gpu.yaml")
    configs = space.enumerate()
    assert configs is not None and 5_000 < len(configs) < 50_000
    assert all(c["pp"] == 1 or c["zero_stage"] <= 1 for c in configs)
    w2 = Workload.from_yaml(W2)
    assert w2.backend == "surrogate" and w2.world_size == 16
    r = run_surrogate(w2, space.validate(w2.baseline), trial_id="b", seed=0)
    assert r.nodes == 2 and r.world_size == 16
    for name in ("tp", "pp", "flash_attention"):
        assert name in KNOB_HANDLERS
    check_handlers(space.names, source=space.file)  # every knob of the space has a handler


def test_wall_clock_scale_holds_the_trial_for_its_scaled_simulated_time(
    wl: Workload, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``surrogate.wall_clock_scale: s`` sleeps s x the simulated wall time (device_seconds /
    world size); the row is the same as without it; a negative or non-numeric scale is refused."""
    import infrarsi.execution.surrogate.backend as backend
    from infrarsi.errors import WorkloadError

    slept: list[float] = []
    monkeypatch.setattr(backend.time, "sleep", slept.append)
    plain = run_surrogate(wl, FAST, trial_id="t1", seed=3)
    assert slept == []
    scaled_wl = wl.model_copy(update={"surrogate": {**wl.surrogate, "wall_clock_scale": 0.01}})
    scaled = run_surrogate(scaled_wl, FAST, trial_id="t1", seed=3)
    assert slept == [pytest.approx(0.01 * scaled.device_seconds / scaled.world_size)]
    assert scaled.step_time_s == plain.step_time_s and scaled.device_seconds == plain.device_seconds
    for bad in (-1, "fast", True, float("nan")):
        bad_wl = wl.model_copy(update={"surrogate": {**wl.surrogate, "wall_clock_scale": bad}})
        with pytest.raises(WorkloadError, match="wall_clock_scale"):
            run_surrogate(bad_wl, FAST, trial_id="t1", seed=3)
