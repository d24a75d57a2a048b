"""Invariant checks on synthetic results: all five cheats are caught, each named plainly."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from infrarsi.result import TrialExtra, TrialResult
from infrarsi.study.arithmetic_tolerance import ArithmeticTolerance
from infrarsi.study.contract import Contract
from infrarsi.study.invariants import Reference, check_invariants

ROOT = Path(__file__).resolve().parents[2]
STEPS = 11  # workloads/dense_debug.yaml: 1 warm-up + 10 measured
TOKENS = 2048
BASE_LOSS = [8.3 - 0.05 * i for i in range(STEPS)]


@pytest.fixture(scope="module")
def contract() -> Contract:
    c = Contract.create(ROOT / "workloads/dense_debug.yaml")
    return c.with_calibration(loss_atol=1e-4, eval_atol=1e-3)


def honest(**over: object) -> TrialResult:
    r = TrialResult(
        trial_id="run-1",
        stage="run",
        config={"zero_stage": 0},
        status="ok",
        step_time_s=0.7,
        loss=[x + 3e-7 for x in BASE_LOSS],
        eval_loss=7.9,
        tokens_per_step=TOKENS,
        optimizer_steps=STEPS,
        world_size=2,
        extra=TrialExtra(tokens_seen=[TOKENS] * STEPS, param_checksum_spread=0.0),
    )
    for k, v in over.items():
        setattr(r, k, v)
    return r


BASELINE = TrialResult(
    trial_id="doctor-0",
    stage="doctor",
    config={},
    status="ok",
    loss=list(BASE_LOSS),
    eval_loss=7.9,
    tokens_per_step=TOKENS,
    optimizer_steps=STEPS,
)


def test_honest_candidate_passes(contract: Contract) -> None:
    ok, reasons = check_invariants(honest(), BASELINE, contract)
    assert ok and reasons == []
    # Reference losses given directly work the same.
    assert check_invariants(honest(), BASE_LOSS, contract) == (True, [])


def test_skip_optimizer_steps(contract: Contract) -> None:
    r = honest(optimizer_steps=5, loss=BASE_LOSS[:5], extra=TrialExtra(tokens_seen=[TOKENS] * 5))
    ok, reasons = check_invariants(r, BASELINE, contract)
    assert not ok
    assert (
        f"optimizer_steps: expected {STEPS}, harness counted 5 (skipped optimizer steps)" in reasons
    )


def test_shrink_batch(contract: Contract) -> None:
    r = honest(tokens_per_step=TOKENS // 2, extra=TrialExtra(sequences_per_step=8))
    ok, reasons = check_invariants(r, BASELINE, contract)
    assert not ok
    assert any(
        x.startswith(
            "tokens_per_step: expected 2048, harness counted 1024 (shrunk batch: fewer sequences"
        )
        for x in reasons
    )
    assert any("sequences_per_step: expected 16, harness counted 8" in x for x in reasons)


def test_fake_loss(contract: Contract) -> None:
    # The workload reports a loss that looks like fast convergence; the reference eval disagrees.
    r = honest(loss=[x * 0.5 for x in BASE_LOSS], eval_loss=8.6)
    ok, reasons = check_invariants(r, BASELINE, contract)
    assert not ok
    assert any(x.startswith("loss: step") and "fake or wrong loss" in x for x in reasons)
    assert any(x.startswith("eval_loss:") for x in reasons)


def test_fewer_tokens(contract: Contract) -> None:
    seen = [TOKENS] * STEPS
    seen[3:] = [TOKENS // 4] * (STEPS - 3)
    r = honest(extra=TrialExtra(tokens_seen=seen))
    ok, reasons = check_invariants(r, BASELINE, contract)
    assert not ok
    assert any(
        "tokens_seen: step 3 fed 512 tokens" in x and "training on fewer tokens" in x
        for x in reasons
    )


def test_engine_style_extras(contract: Contract) -> None:
    # The trial engine's aggregate records these keys (tokens_seen is not carried over).
    r = honest(extra=TrialExtra(tokens_per_step_varied=[512, 2048]))
    ok, reasons = check_invariants(r, BASELINE, contract)
    assert not ok and any("training on fewer tokens" in x for x in reasons)
    r = honest(extra=TrialExtra(param_checksum=12.5, param_checksums_agree=False))
    ok, reasons = check_invariants(r, BASELINE, contract)
    assert not ok and any("gradient all-reduce skipped?" in x for x in reasons)
    r = honest(extra=TrialExtra(param_checksum=12.5, param_checksums_agree=True))
    assert check_invariants(r, BASELINE, contract) == (True, [])


def test_engine_style_cheat_signals(contract: Contract) -> None:
    # shrink_batch as the engine sees it: half the sequences per step, tokens halved too.
    r = honest(tokens_per_step=TOKENS // 2, extra=TrialExtra(sequences_seen=[8] * STEPS))
    ok, reasons = check_invariants(r, BASELINE, contract)
    assert not ok and any(
        x.startswith("sequences_seen: step 0 fed 8 sequences") and "shrunk batch" in x
        for x in reasons
    )
    # fake_loss as the engine sees it: the harness's loss is honest, the reported one is 0.8x.
    r = honest(extra=TrialExtra(workload_loss=[0.8 * x for x in BASE_LOSS]))
    ok, reasons = check_invariants(r, BASELINE, contract)
    assert not ok and any(
        x.startswith("workload_loss:") and "fake loss reported" in x for x in reasons
    )
    # fewer_tokens as the engine sees it: all 16 sequences, each cut to half its tokens.
    r = honest(tokens_per_step=TOKENS // 2, extra=TrialExtra(sequences_seen=[16] * STEPS))
    ok, reasons = check_invariants(r, BASELINE, contract)
    assert reasons == [
        "tokens_per_step: expected 2048, harness counted 1024 (training on fewer "
        "tokens: every sequence is there but shorter, tokens were dropped)"
    ]
    # Honest engine extras pass.
    r = honest(extra=TrialExtra(sequences_seen=[16] * STEPS, workload_loss=list(honest().loss)))
    assert check_invariants(r, BASELINE, contract) == (True, [])


def test_skip_allreduce(contract: Contract) -> None:
    r = honest(
        extra=TrialExtra(tokens_seen=[TOKENS] * STEPS, rank_param_checksums=[1234.5, 1229.1])
    )
    ok, reasons = check_invariants(r, BASELINE, contract)
    assert not ok
    assert any("gradient all-reduce skipped?" in x for x in reasons)
    r2 = honest(extra=TrialExtra(param_checksum_spread=0.02))
    assert any("replicas diverged" in x for x in check_invariants(r2, BASELINE, contract)[1])


def test_nan_loss(contract: Contract) -> None:
    loss = list(BASE_LOSS)
    loss[6] = math.nan
    ok, reasons = check_invariants(honest(loss=loss), BASELINE, contract)
    assert not ok and any(x.startswith("nan: loss is not finite at step(s) [6]") for x in reasons)


def test_tolerance_is_respected(contract: Contract) -> None:
    # Within atol=1e-4: ok. Just above it: violation.
    assert check_invariants(honest(loss=[x + 9e-5 for x in BASE_LOSS]), BASELINE, contract)[0]
    assert not check_invariants(honest(loss=[x + 2e-4 for x in BASE_LOSS]), BASELINE, contract)[0]


def test_a_knob_of_another_arithmetic_widens_only_its_own_candidates(contract: Contract) -> None:
    """The doctor's float8 tolerances apply to configs with float8 on; the same loss and eval
    differences in any other candidate (a code patch, say) are still violations."""
    f8 = contract.with_calibration(
        arithmetic_tolerances={"float8_linear": ArithmeticTolerance(loss_atol=1e-2, eval_atol=2e-2)}
    )
    moved = {"loss": [x + 5e-3 for x in BASE_LOSS], "eval_loss": 7.9 + 1.5e-2}
    on = honest(config={"zero_stage": 1, "float8_linear": True}, **moved)
    off = honest(config={"zero_stage": 1, "float8_linear": False}, **moved)
    assert check_invariants(on, BASELINE, f8) == (True, [])
    ok, reasons = check_invariants(off, BASELINE, f8)
    assert not ok and {r.split(":")[0] for r in reasons} >= {"loss", "eval_loss"}, reasons
    assert not check_invariants(on, BASELINE, contract)[0]  # not calibrated: the study's own
    assert not check_invariants(
        honest(config={"float8_linear": True}, loss=[x + 2e-2 for x in BASE_LOSS]), BASELINE, f8
    )[0]  # beyond its own tolerance too


def test_missing_counts_are_violations(contract: Contract) -> None:
    ok, reasons = check_invariants(
        honest(tokens_per_step=None, optimizer_steps=None), None, contract
    )
    assert not ok and len(reasons) == 2


def test_non_ok_results_are_not_rechecked(contract: Contract) -> None:
    assert check_invariants(honest(status="oom", optimizer_steps=1), BASELINE, contract) == (
        True,
        [],
    )


def test_reference_of() -> None:
    assert Reference.of(None) is None
    assert Reference.of(BASELINE) == Reference(loss=BASE_LOSS, eval_loss=7.9)


def test_stopped_early_by_the_loss_guard(contract: Contract) -> None:
    """A trial the ranks' loss guard stopped at step 2 is a violation naming the guard and the
    loss step, not a 'skipped optimizer steps' cheat; the counts are checked over the steps
    that ran, so a step-skipping cheat is still named."""
    loss = [*BASE_LOSS[:2], BASE_LOSS[2] + 0.01]
    r = honest(
        loss=loss,
        optimizer_steps=3,
        eval_loss=None,
        extra=TrialExtra(tokens_seen=[TOKENS] * 3, stopped_early="loss guard: step 2 ..."),
    )
    ok, reasons = check_invariants(r, BASELINE, contract)
    assert not ok
    assert reasons[0] == "stopped early: loss guard: step 2 ..."
    assert any(x.startswith("loss: step 2 is") for x in reasons)
    assert not any(
        "optimizer_steps" in x or "eval_loss" in x or "per-step values" in x for x in reasons
    )
    cheat = honest(
        loss=loss,
        optimizer_steps=2,
        eval_loss=None,
        extra=TrialExtra(tokens_seen=[TOKENS] * 3, stopped_early="loss guard: step 2 ..."),
    )
    _, reasons = check_invariants(cheat, BASELINE, contract)
    assert "optimizer_steps: expected 3, harness counted 2 (skipped optimizer steps)" in reasons


def test_other_data_than_the_baselines_are_a_violation(contract: Contract) -> None:
    fed = list(range(100, 100 + STEPS))
    ref = Reference(loss=list(BASE_LOSS), eval_loss=7.9, data_digests=fed)
    same = honest()
    same.extra.data_digests = list(fed)
    assert check_invariants(same, ref, contract) == (True, [])
    shuffled = honest()
    shuffled.extra.data_digests = [fed[0], fed[2], fed[1], *fed[3:]]
    ok, reasons = check_invariants(shuffled, ref, contract)
    assert not ok and reasons == [
        f"data: the token ids fed at optimizer step 1 differ from the baseline's (2 of {STEPS} "
        f"steps differ by the harness's per-step digest): training on other data, or the same "
        f"data in another order"
    ]
    # no reference digests (the doctor switched the check off), or none recorded: not checked
    assert check_invariants(shuffled, Reference(loss=list(BASE_LOSS), eval_loss=7.9), contract)[0]
    assert check_invariants(honest(), ref, contract)[0]
