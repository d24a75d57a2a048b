"""Pure analysis of the doctor's repeated baseline trials: noise, stragglers, phases, peak, tolerance."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from infrarsi.result import TrialResult
from infrarsi.search.space import SearchSpace
from infrarsi.stats import noise_margin
from infrarsi.study.arithmetic_tolerance import ArithmeticTolerance
from infrarsi.study.doctor_report import (
    DataOrder,
    DoctorReport,
    HonestChange,
    StepTimeNoise,
    Stragglers,
)

LOSS_TOLERANCE_FLOOR = 1e-4
"""Absolute per-step loss tolerance floor. Measured on CPU: fp32 configs agree to <= 1.2e-6 over
20 steps, MoE ZeRO-3 vs ZeRO-0 differ by ~1.2e-4, bf16 vs fp32 by ~2e-4 (measured on 2 CPU cores,
torch 2.13). The floor lets
reduction-order differences pass and leaves precision changes to the contract's choice."""

LOSS_TOLERANCE_FACTOR = 10.0
"""The calibrated tolerance is this factor times the largest run-to-run loss difference."""

HONEST_CHANGE_FACTOR = 3.0
"""...and at least this factor times the largest loss difference of an honest change
(``honest_change_configs``: the baseline with another micro-batch split, and with another ZeRO
stage). Identical runs can agree bitwise (bf16 on one GPU) or nearly, so run-to-run spread alone
would reject honest configs. Measured on an H200 (dense 1.5B, bf16, 4 steps,
``benchmarks/results/gpu/20261204T125628Z``): run-to-run 0.0020, micro-batch 1 -> 2 0.0025, but
ZeRO-3 -> ZeRO-0 (micro-batch 8) 0.029: a micro-batch split alone would have set 0.020 and
rejected the fastest honest config."""

NOISE_MARGIN_FACTOR = 1.0
"""Verify's noise margin is this factor times the step-time coefficient of variation (the larger
of run-to-run and within-trial), floored at 1% (``infrarsi.stats.noise_margin``)."""


def _cv(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean > 0 else 0.0


DEVICE_MEMORY_KEYS = (
    "memory_per_device_bytes",
    "device_memory_bytes",
    "device_memory_capacity_bytes",
)
"""Hardware-dict keys under which a backend may report the memory of one device, bytes."""


def device_memory_capacity_bytes(hardware: Mapping[str, Any]) -> int | None:
    """The memory of one device a trial's hardware dict reports (``DEVICE_MEMORY_KEYS``), else None."""
    for key in DEVICE_MEMORY_KEYS:
        v = hardware.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            return int(v)
    return None


def _split_change(
    baseline: Mapping[str, Any], space: SearchSpace, per_rank_batch: int
) -> dict[str, Any] | None:
    if "micro_batch_size" not in space.names:
        return None
    mbs = baseline.get("micro_batch_size")
    if not isinstance(mbs, int):
        return None
    values = [
        v
        for v in space.knob("micro_batch_size").values
        if isinstance(v, int) and v != mbs and v > 0 and per_rank_batch % v == 0
    ]
    for v in sorted((v for v in values if v < mbs), reverse=True) + sorted(
        v for v in values if v > mbs
    ):
        cfg = {**baseline, "micro_batch_size": v}
        if space.is_valid(cfg):
            return cfg
    return None


def _zero_change(baseline: Mapping[str, Any], space: SearchSpace) -> dict[str, Any] | None:
    if "zero_stage" not in space.names:
        return None
    stage = baseline.get("zero_stage")
    others = [
        v for v in space.knob("zero_stage").values if v != stage and _same_numerics(baseline, v)
    ]
    # the far end first (the largest honest difference), the lower stage on a tie
    for v in sorted(others, key=lambda v: (-abs(int(v) - int(stage or 0)), int(v))):
        cfg = {**baseline, "zero_stage": v}
        if space.is_valid(cfg):
            return cfg
    return None


def _same_numerics(baseline: Mapping[str, Any], stage: Any) -> bool:
    """Whether ZeRO stage ``stage`` trains the baseline with the same arithmetic. Under bf16/fp16,
    DeepSpeed without ZeRO (stage 0) keeps no fp32 master weights (its ``DDP_BFLOAT16`` path: the
    optimizer updates 16-bit weights), while stages 1-3 keep fp32 masters; so 0 and >= 1 are not
    the same training (measured on an H200 at 1.5B: ZeRO-0 moved the eval loss 0.050 after 4
    steps, ZeRO-2 0.003), and the doctor never uses one as the other's honest change."""
    if str(baseline.get("dtype", "fp32")) not in ("bf16", "fp16"):
        return True
    return (int(stage) == 0) == (int(baseline.get("zero_stage", 0)) == 0)


def honest_change_configs(
    baseline: Mapping[str, Any], space: SearchSpace, per_rank_batch: int
) -> list[tuple[str, dict[str, Any]]]:
    """(knob, config) of the doctor's honest changes: configs that train the same job (same
    sequences, tokens and optimizer steps) by another route, as honest candidates do. The
    baseline with another micro-batch split (the nearest smaller ``micro_batch_size`` that
    divides ``per_rank_batch``, else the nearest larger), with another ZeRO stage of the same
    arithmetic (the farthest stage the space allows, the lower one on a tie; never
    across ZeRO-0 and ZeRO >= 1 in 16-bit, see ``_same_numerics``), and with each knob of
    another arithmetic on (``_arithmetic_changes``; the doctor runs only those the contract
    allows). A change the space has no valid value for is left out."""
    out = []
    split = _split_change(baseline, space, per_rank_batch)
    if split is not None:
        out.append(("micro_batch_size", split))
    zero = _zero_change(baseline, space)
    if zero is not None:
        out.append(("zero_stage", zero))
    out.extend(_arithmetic_changes([baseline, *([zero] if zero else [])], space))
    return out


def _arithmetic_changes(
    bases: Sequence[Mapping[str, Any]], space: SearchSpace
) -> list[tuple[str, dict[str, Any]]]:
    """Each knob of another arithmetic (``float8_linear``...) at its first other value, on the
    first of ``bases`` (the baseline, then its ZeRO change) where that is valid: when the contract
    allows such a knob (the doctor drops the changes it does not, with ``scope_violation``), its
    effect on the loss is part of what the tolerance must cover."""
    from infrarsi.execution.knobs import different_arithmetic_knobs

    out = []
    for name in different_arithmetic_knobs(space.names):
        found = None
        for base in bases:
            for v in space.knob(name).values:
                cfg = space.resolve({**base, name: v})
                if v != base.get(name) and space.is_valid(cfg):
                    found = cfg
                    break
            if found is not None:
                out.append((name, found))
                break
    return out


def honest_change_loss_diff(variant: TrialResult | None, reference: list[float]) -> float | None:
    """Largest per-step |loss - reference loss| of an honest-change trial (None when it did not
    end ``ok`` or has no common steps)."""
    if variant is None or variant.status != "ok" or not variant.loss or not reference:
        return None
    n = min(len(variant.loss), len(reference))
    return max(
        abs(float(a) - float(b)) for a, b in zip(variant.loss[:n], reference[:n], strict=True)
    )


def honest_change_eval_diff(
    variant: TrialResult | None, reference_eval: float | None
) -> float | None:
    """|eval loss - the baseline's median eval loss| of an honest-change trial (None when it did
    not end ``ok`` or either has no eval loss)."""
    if (
        variant is None
        or variant.status != "ok"
        or variant.eval_loss is None
        or reference_eval is None
    ):
        return None
    return abs(float(variant.eval_loss) - float(reference_eval))


def analyse_baseline(
    rows: list[TrialResult],
    *,
    tolerance_floor: float = LOSS_TOLERANCE_FLOOR,
    honest_changes: Sequence[tuple[str, TrialResult]] = (),
) -> DoctorReport:
    """Summarise R baseline trials (and the honest-change trials, ``(knob changed, row)``, see
    ``honest_change_configs``; those of a knob of another arithmetic calibrate only that knob's
    ``arithmetic_tolerances``). Only ``ok`` rows count; the caller decides what to do when
    fewer than two are ok (the analysis still returns what it can, with ``ok_trials``)."""
    from infrarsi.execution.knobs import different_arithmetic_knobs

    ok = [r for r in rows if r.status == "ok" and r.step_time_s]
    out: dict[str, Any] = {
        "trials": len(rows),
        "ok_trials": len(ok),
        "statuses": {
            s: sum(1 for r in rows if r.status == s) for s in sorted({r.status for r in rows})
        },
    }
    if not ok:
        return DoctorReport.model_validate(out)
    medians = [float(r.step_time_s or 0.0) for r in ok]
    within = [_cv(list(r.step_time_samples_s)) for r in ok if len(r.step_time_samples_s) > 1]
    run_cv = _cv(medians)
    within_cv = statistics.median(within) if within else 0.0
    out["step_time_s"] = StepTimeNoise(
        median=statistics.median(medians),
        per_trial=medians,
        run_to_run_cv=run_cv,
        within_trial_cv=within_cv,
    )
    # The noise margin verify must clear: the larger of the run-to-run and the within-trial CV
    # (the within-trial CV divided by sqrt(steps) would understate drift between trials).
    out["noise_margin"] = noise_margin(max(run_cv, within_cv), k=NOISE_MARGIN_FACTOR)
    out["stragglers"] = Stragglers.model_validate(_stragglers(ok, max(run_cv, within_cv)))
    phases: dict[str, list[float]] = {}
    for r in ok:
        for k, v in (r.phase_times_s or {}).items():
            phases.setdefault(k, []).append(float(v))
    out["phase_times_s"] = {k: statistics.median(v) for k, v in phases.items()}
    out["peak_memory_bytes"] = max(int(r.peak_memory_bytes or 0) for r in ok)
    out["tokens_per_s"] = statistics.median(float(r.tokens_per_s or 0.0) for r in ok)
    mfus = [float(r.mfu) for r in ok if r.mfu is not None]
    out["mfu"] = statistics.median(mfus) if mfus else None
    peaks = [
        float(r.hardware["peak_flops_per_s"]) for r in ok if r.hardware.get("peak_flops_per_s")
    ]
    out["peak_flops_per_s"] = statistics.median(peaks) if peaks else None
    out["hardware"] = ok[0].hardware
    caps = [c for c in (device_memory_capacity_bytes(r.hardware) for r in ok) if c]
    out["device_memory_capacity_bytes"] = min(caps) if caps else None
    # Loss: run-to-run spread per step, and the reference loss curve (the per-step median).
    n = min(len(r.loss) for r in ok)
    spread = 0.0
    reference: list[float] = []
    for i in range(n):
        vals = [r.loss[i] for r in ok]
        spread = max(spread, max(vals) - min(vals))
        reference.append(statistics.median(vals))
    out["loss_run_to_run_max_abs_diff"] = spread
    evals = [r.eval_loss for r in ok if r.eval_loss is not None]
    ref_eval = statistics.median(evals) if evals else None
    changes = [
        HonestChange(
            changed=k,
            config=dict(r.config),
            status=r.status,
            loss_max_abs_diff=honest_change_loss_diff(r, reference),
            eval_loss_abs_diff=honest_change_eval_diff(r, ref_eval),
        )
        for k, r in honest_changes
    ]
    other = set(different_arithmetic_knobs([c.changed for c in changes]))
    same = [c for c in changes if c.changed not in other]  # only these widen the shared gate
    diffs = [c.loss_max_abs_diff for c in same if c.loss_max_abs_diff is not None]
    honest = max(diffs) if diffs else None
    out["honest_changes"] = changes
    out["loss_honest_change_max_abs_diff"] = honest
    out["loss_tolerance"] = max(
        tolerance_floor, LOSS_TOLERANCE_FACTOR * spread, HONEST_CHANGE_FACTOR * (honest or 0.0)
    )
    out["loss_tolerance_floor"] = tolerance_floor
    out["reference_loss"] = reference
    out["reference_eval_loss"] = ref_eval
    eval_spread = (max(evals) - min(evals)) if len(evals) > 1 else 0.0
    out["eval_run_to_run_abs_diff"] = eval_spread
    eval_diffs = [c.eval_loss_abs_diff for c in same if c.eval_loss_abs_diff is not None]
    out["eval_tolerance"] = max(
        tolerance_floor,
        LOSS_TOLERANCE_FACTOR * eval_spread,
        HONEST_CHANGE_FACTOR * max(eval_diffs, default=0.0),
    )
    out["arithmetic_tolerances"] = {
        c.changed: ArithmeticTolerance(
            loss_atol=max(out["loss_tolerance"], HONEST_CHANGE_FACTOR * c.loss_max_abs_diff),
            eval_atol=max(
                out["eval_tolerance"], HONEST_CHANGE_FACTOR * (c.eval_loss_abs_diff or 0.0)
            ),
        )
        for c in changes
        if c.changed in other and c.loss_max_abs_diff is not None
    }
    order = data_order(ok, [r for _, r in honest_changes])
    out["data_order"] = order
    if order is not None and order.repeatable and order.same_under_honest_changes is not False:
        out["reference_data_digests"] = list(ok[0].extra.data_digests or [])
    out["tokens_per_step"] = ok[0].tokens_per_step
    out["optimizer_steps"] = ok[0].optimizer_steps
    walls = [float(r.ended_at - r.started_at) for r in ok if r.ended_at > r.started_at]
    out["baseline_trial_wall_s"] = statistics.median(walls) if walls else None
    out["setup_time_s"] = statistics.median(float(r.setup_time_s or 0.0) for r in ok)
    out["warmup_time_s"] = statistics.median(float(r.warmup_time_s or 0.0) for r in ok)
    return DoctorReport.model_validate(out)


def data_order(ok: Sequence[TrialResult], honest: Sequence[TrialResult]) -> DataOrder | None:
    """Compare the per-step data digests of the ok baseline trials ``ok`` with each other, and
    those of the ok ``honest`` change trials with the first baseline's (None: some baseline trial
    recorded none). Steps are compared over the length the two runs share."""
    if not ok or any(not r.extra.data_digests for r in ok):
        return None
    first = list(ok[0].extra.data_digests or [])
    diff: tuple[int, str] | None = None
    for r in ok[1:]:
        other = list(r.extra.data_digests or [])
        step = next((i for i, (a, b) in enumerate(zip(first, other, strict=False)) if a != b), None)
        if step is not None and (diff is None or step < diff[0]):
            diff = (step, r.trial_id)
    same: bool | None = None
    for r in honest:
        if r.status == "ok" and r.extra.data_digests:
            n = min(len(first), len(r.extra.data_digests))
            same = (same is not False) and list(r.extra.data_digests)[:n] == first[:n]
    return DataOrder(
        repeatable=diff is None,
        first_differing_step=None if diff is None else diff[0],
        differing_trial_ids=[] if diff is None else [ok[0].trial_id, diff[1]],
        same_under_honest_changes=same,
    )


def _stragglers(ok: list[TrialResult], cv: float) -> dict[str, Any]:
    """A rank is a straggler when it is the slowest in every trial and its median step is slower
    than the median rank by more than the noise (at least 5%)."""
    per_trial = [list(r.rank_step_time_s) for r in ok if len(r.rank_step_time_s) > 1]
    if not per_trial:
        return {"flag": False, "rank": None, "spread": 0.0, "reason": "fewer than two ranks"}
    slowest = [max(range(len(t)), key=lambda i: t[i]) for t in per_trial]
    spreads = [max(t) / statistics.median(t) - 1.0 for t in per_trial if statistics.median(t) > 0]
    spread = statistics.median(spreads) if spreads else 0.0
    same = len(set(slowest)) == 1
    flag = bool(same and len(per_trial) >= 2 and spread > max(0.05, 2 * cv))
    return {
        "flag": flag,
        "rank": slowest[0] if flag else None,
        "spread": spread,
        "slowest_rank_per_trial": slowest,
        "rule": "slowest in every trial and > max(5%, 2 x CV) above the median rank",
    }
