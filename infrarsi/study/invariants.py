"""Invariant checks: is a trial the same training job as the baseline, only faster?

Invariant checks: is a trial's result the same training job as the baseline, only faster?

``check_invariants(result, baseline, contract)`` compares one trial with the contract and the
baseline's reference (same seed and data order) and returns ``(ok, reasons)``. Each reason names
the cheat it detects in plain words, e.g.
``"optimizer_steps: expected 10, harness counted 5 (skipped optimizer steps)"``.

Checked (only results with ``status == "ok"``; any other status already disqualifies a trial):

- NaN/inf in the loss, the eval loss or the step time;
- ``tokens_per_step`` counted by the harness == the contract's (shrunk batch);
- per-step ``extra.tokens_seen`` (tokens the harness saw enter the model at each optimizer
  step), every entry == the contract's tokens per step (training on fewer tokens);
- ``optimizer_steps`` counted by the harness == the contract's, and one loss per step;
- loss per step within ``atol + rtol*|baseline|`` of the baseline's loss (fake loss);
- ``eval_loss`` (reference model code on a held-out batch) within the eval tolerance;
- ``extra.data_digests`` equal to the baseline's, step by step (training on other data, or on
  the same data in another order), when the doctor found the job's data order repeatable;
- ``extra.stopped_early`` (the ranks' loss guard stopped training once a step's loss left the
  tolerance): a violation by itself; step counts are then checked over the steps that ran;
- replica divergence: ``extra.param_checksum_spread`` (relative max-min of the parameter
  checksum over data-parallel ranks) or ``extra.rank_param_checksums`` above the contract's
  ``replica_checksum_rtol``, or ``extra.param_checksums_agree is False`` (gradient
  all-reduce skipped).

Also read, as the trial engine records them: ``extra.tokens_per_step_varied`` (the distinct
per-step token counts when they varied), ``extra.sequences_seen`` (global sequences fed per
step; each must be tokens_per_step / seq_len: shrunk batch), ``extra.sequences_per_step``, and
``extra.workload_loss`` (the loss the workload reported per step, which must match the
harness's own loss from the same logits: fake loss).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from infrarsi.result import TrialResult
from infrarsi.study.contract import Contract


@dataclass
class Reference:
    """What a candidate is compared with: the baseline's losses (same seed and data order)."""

    loss: list[float]
    """Baseline training loss per optimizer step."""
    eval_loss: float | None = None
    """Baseline held-out eval loss (None: the eval check is skipped)."""
    data_digests: list[int] = field(default_factory=list)
    """Baseline per-step digests of the token ids fed (``TrialExtra.data_digests``; empty: the
    data check is skipped)."""

    @classmethod
    def of(cls, baseline: TrialResult | Reference | Sequence[float] | None) -> Reference | None:
        if baseline is None or isinstance(baseline, Reference):
            return baseline
        if isinstance(baseline, TrialResult):
            return cls(
                loss=list(baseline.loss),
                eval_loss=baseline.eval_loss,
                data_digests=list(baseline.extra.data_digests or []),
            )
        return cls(loss=[float(x) for x in baseline])


def check_invariants(
    result: TrialResult,
    baseline: TrialResult | Reference | Sequence[float] | None,
    contract: Contract,
) -> tuple[bool, list[str]]:
    """Check ``result`` against the contract and the baseline reference.

    Args:
        result: the trial to check (only ``status == "ok"`` results are checked).
        baseline: the baseline trial, a ``Reference``, or its per-step losses; None skips the
            loss and eval comparisons (e.g. while the baseline itself runs).
        contract: the study's contract (its ``invariants`` give the numbers and tolerances).

    Returns:
        ``(ok, reasons)``: ``ok`` is True when no invariant is violated; each reason names the
        field, the expected and counted values, and the cheat it points to.
    """
    if result.status != "ok":
        return True, []
    inv = contract.invariants
    reasons: list[str] = []
    ref = Reference.of(baseline)
    # stopped early by the loss guard: a violation by itself; the counts are checked over the
    # steps that ran (a cheat that skips steps is still named), the eval check did not run
    stopped = str(result.extra.stopped_early or "")
    if stopped:
        reasons.append(f"stopped early: {stopped}")

    # --- NaN / inf
    bad = [i for i, x in enumerate(result.loss) if not math.isfinite(x)]
    if bad:
        reasons.append(f"nan: loss is not finite at step(s) {bad[:5]} (numerical blow-up)")
    if result.eval_loss is not None and not math.isfinite(result.eval_loss):
        reasons.append("nan: eval_loss is not finite (numerical blow-up)")
    if result.step_time_s is not None and not math.isfinite(result.step_time_s):
        reasons.append(f"nan: step_time_s is {result.step_time_s} (broken timing)")

    # --- tokens per step (harness-counted) and per-step tokens seen
    want_tok = inv.tokens_per_step
    if result.tokens_per_step is None:
        reasons.append(
            f"tokens_per_step: expected {want_tok}, harness counted nothing "
            f"(token counting missing: cannot prove the batch is intact)"
        )
    seqs = result.extra.sequences_per_step
    wl_seq = contract.workload.get("data", {}).get("seq_len")
    if result.tokens_per_step is not None and result.tokens_per_step != want_tok:
        seq_counts = result.extra.sequences_seen or ([seqs] if seqs is not None else [])
        want_seqs = want_tok // int(wl_seq) if wl_seq else None
        seqs_intact = (
            bool(seq_counts)
            and want_seqs is not None
            and all(int(n) == want_seqs for n in seq_counts)
        )
        if result.tokens_per_step > want_tok:
            kind = "grown batch: the tokens per optimizer step changed"
        elif seqs_intact:
            kind = (
                "training on fewer tokens: every sequence is there but shorter, tokens were dropped"
            )
        elif seq_counts:
            kind = "shrunk batch: fewer sequences per optimizer step"
        else:
            kind = "shrunk batch or fewer tokens: the tokens per optimizer step changed"
        reasons.append(
            f"tokens_per_step: expected {want_tok}, harness counted "
            f"{result.tokens_per_step} ({kind})"
        )
    if seqs is not None and wl_seq:
        want_seqs = want_tok // int(wl_seq)
        if int(seqs) != want_seqs:
            reasons.append(
                f"sequences_per_step: expected {want_seqs}, harness counted {seqs} (shrunk batch)"
            )
    seq_list = result.extra.sequences_seen
    if isinstance(seq_list, (list, tuple)) and seq_list and wl_seq:
        want_seqs = want_tok // int(wl_seq)
        off_steps = [(i, int(n)) for i, n in enumerate(seq_list) if int(n) != want_seqs]
        if off_steps:
            i, n = off_steps[0]
            what = "shrunk batch" if n < want_seqs else "grown batch"
            reasons.append(
                f"sequences_seen: step {i} fed {n} sequences to the model, contract "
                f"fixes {want_seqs} ({len(off_steps)} of {len(seq_list)} steps differ: "
                f"{what})"
            )
    seen = result.extra.tokens_seen
    if isinstance(seen, (list, tuple)) and seen:
        short = [(i, int(t)) for i, t in enumerate(seen) if int(t) != want_tok]
        if short:
            i, t = short[0]
            reasons.append(
                f"tokens_seen: step {i} fed {t} tokens to the model, contract fixes "
                f"{want_tok} ({len(short)} of {len(seen)} steps differ: training on "
                f"fewer tokens)"
                if t < want_tok
                else f"tokens_seen: step {i} fed {t} tokens, contract fixes {want_tok} "
                f"({len(short)} of {len(seen)} steps differ: token count changed)"
            )
        if (
            not stopped
            and len(seen) != inv.optimizer_steps
            and result.optimizer_steps == inv.optimizer_steps
        ):
            reasons.append(
                f"tokens_seen: {len(seen)} steps recorded, expected "
                f"{inv.optimizer_steps} (token count incomplete)"
            )

    varied = result.extra.tokens_per_step_varied
    if isinstance(varied, (list, tuple)) and not seen:
        off = sorted({int(t) for t in varied if int(t) != want_tok})
        if off:
            what = "training on fewer tokens" if min(off) < want_tok else "token count changed"
            reasons.append(
                f"tokens_seen: some steps fed {off} tokens to the model, contract "
                f"fixes {want_tok} ({what})"
            )

    # --- optimizer steps
    want_steps = len(result.loss) if stopped else inv.optimizer_steps
    if result.optimizer_steps is None:
        reasons.append(
            f"optimizer_steps: expected {want_steps}, harness counted nothing "
            f"(step counting missing)"
        )
    elif result.optimizer_steps != want_steps:
        what = (
            "skipped optimizer steps"
            if result.optimizer_steps < want_steps
            else "extra optimizer steps"
        )
        reasons.append(
            f"optimizer_steps: expected {want_steps}, harness counted "
            f"{result.optimizer_steps} ({what})"
        )
    if result.loss and len(result.loss) != want_steps:
        reasons.append(
            f"loss: {len(result.loss)} per-step values, expected {want_steps} "
            f"(one per optimizer step; steps skipped or loss not from training)"
        )

    # --- loss per step vs baseline
    reasons += _loss_reasons(result, ref, contract)

    # --- the workload's reported loss vs the harness's own loss (same logits, same step)
    wl_loss = result.extra.workload_loss
    if isinstance(wl_loss, (list, tuple)) and wl_loss and result.loss:
        atol, rtol = inv.loss_tolerance()
        pairs = [
            (i, float(w), float(h))
            for i, (w, h) in enumerate(zip(wl_loss, result.loss, strict=False))
            if math.isfinite(float(w)) and math.isfinite(float(h))
        ]
        fake = [(i, w, h) for i, w, h in pairs if abs(w - h) > atol + rtol * abs(h)]
        if fake:
            i, w, h = max(fake, key=lambda t: abs(t[1] - t[2]))
            reasons.append(
                f"workload_loss: step {i} the workload reported {w:.6g}, the harness "
                f"computed {h:.6g} from the same logits ({len(fake)} of {len(pairs)} "
                f"steps differ: fake loss reported)"
            )

    # --- eval loss vs baseline (reference model code on a held-out batch)
    ref_eval = ref.eval_loss if ref is not None and not stopped else None
    if ref_eval is not None and math.isfinite(ref_eval):
        atol, rtol = inv.eval_tolerance(result.config)
        tol = atol + rtol * abs(ref_eval)
        if result.eval_loss is None:
            reasons.append("eval_loss: missing, but the baseline has one (eval check not run)")
        elif math.isfinite(result.eval_loss) and abs(result.eval_loss - ref_eval) > tol:
            reasons.append(
                f"eval_loss: {result.eval_loss:.6g} vs baseline {ref_eval:.6g} "
                f"(|diff| {abs(result.eval_loss - ref_eval):.3g} > tolerance "
                f"{tol:.3g}: the trained parameters differ from the baseline's)"
            )

    # --- the data fed, step by step, vs the baseline's (the doctor found it repeatable)
    reasons += _data_reasons(result, ref)

    # --- replica divergence
    spread = result.extra.param_checksum_spread
    checks = result.extra.rank_param_checksums
    if spread is None and isinstance(checks, (list, tuple)) and len(checks) > 1:
        vals = [float(c) for c in checks]
        scale = max(max(abs(v) for v in vals), 1e-30)
        spread = (max(vals) - min(vals)) / scale
    if spread is None and result.extra.param_checksums_agree is False:
        reasons.append(
            "replicas diverged: the ranks' parameter checksums disagree after "
            "training (param_checksums_agree is false): gradient all-reduce skipped?"
        )
    if spread is not None and (
        not math.isfinite(float(spread)) or float(spread) > inv.replica_checksum_rtol
    ):
        reasons.append(
            f"replicas diverged: parameter checksums differ across ranks by "
            f"{float(spread):.3g} (relative; tolerance {inv.replica_checksum_rtol:.1g}): "
            f"gradient all-reduce skipped?"
        )

    return (not reasons), reasons


def _data_reasons(result: TrialResult, ref: Reference | None) -> list[str]:
    """The per-step data comparison with the baseline (empty when equal, or either has no
    digests)."""
    mine = list(result.extra.data_digests or [])
    if ref is None or not ref.data_digests or not mine:
        return []
    off = [i for i, (a, b) in enumerate(zip(mine, ref.data_digests, strict=False)) if a != b]
    if not off:
        return []
    return [
        f"data: the token ids fed at optimizer step {off[0]} differ from the baseline's "
        f"({len(off)} of {min(len(mine), len(ref.data_digests))} steps differ by the harness's "
        f"per-step digest): training on other data, or the same data in another order"
    ]


def _loss_reasons(result: TrialResult, ref: Reference | None, contract: Contract) -> list[str]:
    """The per-step loss comparison with the baseline (empty when within tolerance)."""
    if ref is None or not ref.loss:
        return []
    atol, rtol = contract.invariants.loss_tolerance(result.config)
    if not result.loss:
        return ["loss: no per-step loss recorded, cannot compare with the baseline"]
    worst: tuple[float, int, float, float, float] | None = None
    n_bad = 0
    for i, (x, b) in enumerate(zip(result.loss, ref.loss, strict=False)):
        if not (math.isfinite(x) and math.isfinite(b)):
            continue
        tol = atol + rtol * abs(b)
        d = abs(x - b)
        if d > tol:
            n_bad += 1
            if worst is None or d - tol > worst[0]:
                worst = (d - tol, i, x, b, tol)
    if worst is None:
        return []
    _, i, x, b, tol = worst
    return [
        f"loss: step {i} is {x:.6g} vs baseline {b:.6g} (|diff| {abs(x - b):.3g} "
        f"> tolerance {tol:.3g}; {n_bad} of {min(len(result.loss), len(ref.loss))} "
        f"steps off: fake or wrong loss, or changed numerics such as dtype)"
    ]


__all__ = ["Reference", "check_invariants"]
