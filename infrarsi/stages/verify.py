"""Stage 4, ``verify``: re-run the top candidates interleaved with the baseline and keep the wins that clear the noise.

A candidate is a knob config with its code patches (``infrarsi.study.candidate.Candidate``):
verify runs each with exactly the patches its run trials ran (a patch whose bytes changed since
is refused), and ``verify.json`` names them with their digests, which ``apply`` checks. A run
candidate whose trials ever broke an invariant is never selected, whatever shares its knobs; a
patch proposed with the baseline's knobs is a candidate (only the untouched baseline is not).

Per round, for each of ``pairs`` repetitions the baseline runs once and then each surviving
candidate once (A B C A B C ...; the candidate order rotates each pair so no candidate always runs
right after the baseline). Each candidate trial gives a paired ratio
``baseline_step_time_s / candidate_step_time_s`` with the baseline of the same repetition.

Accepted when, with every candidate trial ``ok`` (all invariants kept):

- every round's median ratio clears ``1 + noise_margin`` (the doctor's measured noise), so a win
  that fades between rounds (drift) is exposed, and a loser stops after its first round;
- over all pairs of all rounds, the lower bound of the order-statistic interval of the median
  (``infrarsi.stats.median_interval``) clears ``1 + noise_margin``, and that interval's exact
  coverage reaches ``CONFIDENCE``. With the defaults (3 pairs x 2 rounds) it is
  ``[min, max]`` of 6 ratios, 96.9%; fewer than 6 pairs in all can never be accepted, and the
  reason says so.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from infrarsi.errors import StudyError
from infrarsi.result import TrialExtra
from infrarsi.study.candidate import Candidate
from infrarsi.study.doctor_report import DoctorReport
from infrarsi.study.paths import StudyPaths
from infrarsi.study.verify_report import VerifiedCandidate, VerifyReport, VerifyRound

if TYPE_CHECKING:
    from infrarsi.orchestration.executor import StudyExecutor

log = structlog.get_logger(__name__)

CONFIDENCE = 0.95
"""The coverage verify's interval must reach for a candidate to be accepted."""


def select_candidates(study_dir: Path, top_k: int) -> list[dict[str, Any]]:
    """The top-k distinct run candidates (config + patches), and the measured-fastest one when
    it is not among them (``rank_candidates``), each as ``{"candidate": Candidate,
    "smoothed_step_time_s", "observed_step_time_s", "observations", "selected_by"}``.

    Ranked by the knob models' smoothed (posterior-mean) step time for unpatched configs and by
    the median observed step time for patched ones (the models know knobs, not patches). Left
    out: the untouched baseline, and every candidate one of whose run trials broke an invariant
    (a cheat is never re-run because its knobs look fast)."""
    from infrarsi.orchestration.common import baseline_config
    from infrarsi.orchestration.optimizer_factory import build_optimizer
    from infrarsi.study.contract import Contract
    from infrarsi.study.trial_log import read_trials, rows

    contract = Contract.load(study_dir)
    all_rows = rows(read_trials(study_dir))
    baseline = baseline_config(contract, study_dir)
    by_key: dict[str, list[float]] = {}
    cands: dict[str, Candidate] = {}
    broke: set[str] = set()
    for r in all_rows:
        if r.stage != "run" or r.extra.interrupted:
            continue
        cand = Candidate.from_row(r)
        if r.status == "invariant_violation":
            broke.add(cand.key)
        if r.status != "ok" or not r.step_time_s or cand.is_untouched(baseline):
            continue
        by_key.setdefault(cand.key, []).append(float(r.step_time_s))
        cands.setdefault(cand.key, cand)
    keys = [k for k in cands if k not in broke]
    if not keys:
        return []
    observed = {k: statistics.median(by_key[k]) for k in keys}
    smoothed: dict[str, float] = dict(observed)
    plain = [k for k in keys if not any(p.source == "proposal" for p in cands[k].patches)]
    if plain:
        try:
            opt = build_optimizer(contract, all_rows, seed=0, study_dir=study_dir)
            pred = opt.predict([dict(cands[k].config) for k in plain])
            for k, m in zip(plain, pred["step_time_mean_s"], strict=True):
                if m is not None and math.isfinite(float(m)):
                    smoothed[k] = float(m)
        except Exception as e:  # the observed median is an honest fallback
            log.warning("verify.smoothing_failed", error=str(e))
    return [
        {
            "candidate": cands[k],
            "smoothed_step_time_s": smoothed[k],
            "observed_step_time_s": observed[k],
            "observations": len(by_key[k]),
            "selected_by": why,
        }
        for k, why in rank_candidates(
            keys, smoothed, observed, {k: len(by_key[k]) for k in keys}, top_k
        )
    ]


def rank_candidates(
    keys: list[str],
    smoothed: dict[str, float],
    observed: dict[str, float],
    counts: dict[str, int],
    top_k: int,
) -> list[tuple[str, list[str]]]:
    """The candidates verify runs, each with what selected it: the ``top_k`` lowest smoothed
    (posterior-mean) step times (``"posterior"``), and always the lowest measured median
    (``"measured"``; ties: more measurements, then the earlier key), added after them when the
    posterior ranks it lower, so verify's paired runs settle a disagreement between the two
    (``search.best_choice``). Up to ``top_k + 1`` candidates, posterior picks first."""
    if not keys or top_k < 1:
        return []
    ranked = sorted(keys, key=lambda k: smoothed[k])[:top_k]
    order = {k: i for i, k in enumerate(keys)}
    measured = min(keys, key=lambda k: (observed[k], -counts[k], order[k]))
    out = [(k, ["posterior", "measured"] if k == measured else ["posterior"]) for k in ranked]
    if measured not in ranked:
        out.append((measured, ["measured"]))
    return out


def _as_candidate(c: Any) -> Candidate:
    """A ``candidates=`` entry: a ``Candidate``, its ``to_dict()``, or a bare knob config."""
    if isinstance(c, Candidate):
        return c
    if isinstance(c, dict) and "config" in c and isinstance(c["config"], dict):
        return Candidate.from_dict(c)
    return Candidate(config=dict(c))


def verify_stage(
    study_dir: str | Path,
    *,
    top_k: int = 3,
    pairs: int = 3,
    rounds: int = 2,
    candidates: list[Any] | None = None,
    address: str | None = None,
    seed: int = 0,
    executor: StudyExecutor | None = None,
    wait_s: float | None = None,
) -> dict[str, Any]:
    """``_verify_stage`` holding the study lock (``wait_s``: how long to wait for another writer;
    None refuses at once with ``StudyLockedError``)."""
    from infrarsi.study.lock import hold_study

    with hold_study(study_dir, "verify", wait_s=wait_s):
        return _verify_stage(
            study_dir,
            top_k=top_k,
            pairs=pairs,
            rounds=rounds,
            candidates=candidates,
            address=address,
            seed=seed,
            executor=executor,
        )


def _verify_stage(
    study_dir: str | Path,
    *,
    top_k: int,
    pairs: int,
    rounds: int,
    candidates: list[Any] | None,
    address: str | None,
    seed: int,
    executor: StudyExecutor | None,
) -> dict[str, Any]:
    """Verify candidates and write ``verify.json``. ``candidates`` overrides the selection
    (``Candidate`` records, their dicts, or bare knob configs), e.g. to check one by hand.
    ``executor`` is an already open ``StudyExecutor`` to use (and leave open); by default verify
    opens and closes its own. ``seed`` is kept for callers; the interval is exact, not sampled."""
    from infrarsi.orchestration.executor import StudyExecutor

    del seed
    paths = StudyPaths(Path(study_dir).resolve())
    noise_margin = float(DoctorReport.load(paths.root).noise_margin or 0.0)
    if candidates is None:
        chosen = select_candidates(paths.root, top_k)
    else:
        chosen = [
            {
                "candidate": _as_candidate(c),
                "smoothed_step_time_s": None,
                "observed_step_time_s": None,
                "observations": 0,
                "selected_by": ["given"],
            }
            for c in candidates
        ]
    if not chosen:
        empty = VerifyReport(
            noise_margin=noise_margin,
            reason="no ok run trial to verify (the baseline itself and candidates "
            "that broke an invariant are never verified)",
        )
        empty.save(paths.root)
        return empty.to_dict()
    if pairs < 2 or rounds < 1:
        raise StudyError(
            f"verify: needs pairs >= 2 and rounds >= 1, got pairs={pairs}, rounds={rounds}."
        )
    ex = executor if executor is not None else StudyExecutor(paths.root, address=address)
    try:
        baseline_cfg = ex.full_config(dict(ex.workload.baseline))
        for c in chosen:
            cand: Candidate = c["candidate"]
            c["candidate"] = Candidate(
                config=ex.full_config(dict(cand.config)), patches=cand.patches
            )
            c.update({"rounds": [], "alive": True, "trial_ids": [], "ratios": []})
        for rnd in range(rounds):
            alive = [c for c in chosen if c["alive"]]
            if not alive:
                break
            _verify_round(ex, chosen, alive, baseline_cfg, rnd, pairs, noise_margin)
        out_cands = [_summary(c, baseline_cfg, rounds, noise_margin) for c in chosen]
    finally:
        if executor is None:
            ex.close()
    accepted = [c for c in out_cands if c.accepted]
    report = VerifyReport(
        best=max(accepted, key=lambda c: c.speedup or 0.0) if accepted else None,
        candidates=out_cands,
        baseline_config=baseline_cfg,
        noise_margin=noise_margin,
        pairs=pairs,
        rounds=rounds,
        confidence=CONFIDENCE,
        rule=(
            f"accept iff every candidate trial kept the invariants, every round's median paired "
            f"ratio > 1 + noise_margin, and over all pairs the order-statistic interval of the "
            f"median covers >= {CONFIDENCE:.0%} (exact, binomial) with its lower bound > 1 + "
            f"noise_margin"
        ),
    )
    report.save(paths.root)
    from infrarsi.bank.feed import add_to_bank

    add_to_bank(paths.root, stage="verify")  # the experience bank (never fails the stage)
    return report.to_dict()


def _verify_round(
    ex: StudyExecutor,
    chosen: list[dict[str, Any]],
    alive: list[dict[str, Any]],
    baseline_cfg: dict[str, Any],
    rnd: int,
    pairs: int,
    noise_margin: float,
) -> None:
    """One round: ``pairs`` x (the baseline, then each alive candidate in a rotating order);
    each candidate's round record is appended, and a candidate failing it is no longer alive."""
    from infrarsi.stats import median_interval, paired_ratios

    base_times: list[float | None] = []
    cand_times: dict[int, list[float | None]] = {id(c): [] for c in alive}
    cand_status: dict[int, list[str]] = {id(c): [] for c in alive}
    reasons: dict[int, list[str]] = {id(c): [] for c in alive}
    for p in range(pairs):
        b = ex.run_trial(
            baseline_cfg, "verify", extra=TrialExtra(role="baseline", round=rnd, pair=p)
        )
        base_times.append(b["step_time_s"] if b["status"] == "ok" else None)
        order = alive[p % len(alive) :] + alive[: p % len(alive)]
        for c in order:
            r = ex.run_candidate(
                c["candidate"],
                "verify",
                extra=TrialExtra(role="candidate", round=rnd, pair=p, candidate=chosen.index(c)),
            )
            c["trial_ids"].append(r["trial_id"])
            cand_times[id(c)].append(r["step_time_s"] if r["status"] == "ok" else None)
            cand_status[id(c)].append(r["status"])
            if r["status"] != "ok":
                reasons[id(c)].append(f"{r['trial_id']}: {r['status']}: {r['error'][:300]}")
    for c in alive:
        pairs_ok = [
            (bt, ct) for bt, ct in zip(base_times, cand_times[id(c)], strict=True) if bt and ct
        ]
        ratios = (
            paired_ratios([b for b, _ in pairs_ok], [x for _, x in pairs_ok]).tolist()
            if pairs_ok
            else []
        )
        c["ratios"].extend(ratios)
        rec = VerifyRound(round=rnd, ratios=ratios, statuses=cand_status[id(c)])
        if len(ratios) < 2 or reasons[id(c)]:
            rec.reason = "; ".join(reasons[id(c)]) or "fewer than two valid pairs"
        else:
            med = median_interval(ratios).speedup
            rec.passed, rec.median_ratio = med > 1.0 + noise_margin, med
            if not rec.passed:
                rec.reason = (
                    f"round {rnd}: median paired ratio {med:.3f} does not clear 1 + noise margin "
                    f"{1 + noise_margin:.3f}"
                )
        c["rounds"].append(rec)
        if not rec.passed:
            c["alive"] = False


def _summary(
    c: dict[str, Any], baseline_cfg: dict[str, Any], rounds: int, noise_margin: float
) -> VerifiedCandidate:
    """A candidate's record in ``verify.json``: the candidate (config, patches with digests), the
    interval over all its pairs with its exact coverage, and the decision with its reason."""
    from infrarsi.stats import median_interval

    cand: Candidate = c["candidate"]
    iv = median_interval(c["ratios"], confidence=CONFIDENCE) if len(c["ratios"]) >= 2 else None
    passed_rounds = c["alive"] and len(c["rounds"]) == rounds
    if not passed_rounds:
        failed = next((r for r in c["rounds"] if not r.passed), None)
        reason = failed.reason if failed else "not every round ran"
    elif iv is None:
        reason = "fewer than two valid pairs"
    elif not iv.reaches_confidence:
        reason = (
            f"{iv.n_pairs} pairs: the widest interval covers only {iv.coverage:.1%} < "
            f"{CONFIDENCE:.0%}; run at least 6 pairs in all (--pairs x --rounds)"
        )
    elif not iv.ci_low > 1.0 + noise_margin:
        reason = (
            f"lower bound {iv.ci_low:.3f} of the {iv.label()} does not clear 1 + noise margin "
            f"{1 + noise_margin:.3f}"
        )
    else:
        reason = ""
    return VerifiedCandidate(
        config=dict(cand.config),
        patches=[p.to_dict() for p in cand.patches],
        candidate_key=cand.key,
        accepted=reason == "",
        reason=reason,
        speedup=iv.speedup if iv else None,
        ci_low=iv.ci_low if iv else None,
        ci_high=iv.ci_high if iv else None,
        ci_coverage=iv.coverage if iv else None,
        ci_method=iv.label() if iv else None,
        n_pairs=len(c["ratios"]),
        rounds=c["rounds"],
        trial_ids=c["trial_ids"],
        smoothed_step_time_s=c["smoothed_step_time_s"],
        observed_step_time_s=c["observed_step_time_s"],
        selected_by=list(c.get("selected_by") or []),
        diff_vs_baseline={
            k: [baseline_cfg.get(k), v] for k, v in cand.config.items() if baseline_cfg.get(k) != v
        },
    )
