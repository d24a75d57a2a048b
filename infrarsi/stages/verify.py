"""Stage 4, ``verify``: re-run the top candidates interleaved with the baseline and keep the wins that clear the noise.

Only wins that clear the doctor's measured noise (``DoctorReport.noise_margin``) and keep every
invariant are accepted.

Per round, for each of ``pairs`` repetitions the baseline runs once and then each surviving
candidate once (A B C A B C ...; the candidate order rotates each pair so no candidate always runs
right after the baseline). A candidate's speedup is the median of its paired ratios
``baseline_step_time_s / candidate_step_time_s`` (each candidate trial paired with the baseline of
the same repetition), with a seeded bootstrap CI. It passes a round when the CI's lower bound
clears ``1 + noise_margin`` (the doctor's measured noise) and every one of its trials kept the
invariants (status ``ok`` after the executor's invariant check). It must pass every round
(default two). Rounds are run one after another, so drift between rounds is also exposed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import structlog

from infrarsi.errors import StudyError
from infrarsi.study.doctor_report import DoctorReport
from infrarsi.study.paths import StudyPaths, write_json_atomic

log = structlog.get_logger(__name__)


def select_candidates(study_dir: Path, top_k: int) -> list[dict[str, Any]]:
    """The top-k distinct run configs by the model's smoothed (posterior-mean) step time, falling
    back to the median observed step time. Invariant violations and the baseline are excluded."""
    from infrarsi.stages.common import baseline_config
    from infrarsi.stages.optimizer_factory import build_optimizer
    from infrarsi.study.contract import Contract
    from infrarsi.study.trial_log import read_trials, rows

    contract = Contract.load(study_dir)
    all_rows = rows(read_trials(study_dir))
    baseline = baseline_config(contract, study_dir)
    by_key: dict[str, list[float]] = {}
    configs: dict[str, dict[str, Any]] = {}
    for r in all_rows:
        if r.stage != "run" or r.status != "ok" or not r.step_time_s:
            continue
        key = json.dumps(r.config, sort_keys=True)
        if r.config == baseline:
            continue
        by_key.setdefault(key, []).append(float(r.step_time_s))
        configs[key] = r.config
    if not configs:
        return []
    keys = list(configs)
    observed = {k: sorted(v)[len(v) // 2] for k, v in by_key.items()}
    smoothed: dict[str, float] = dict(observed)
    try:
        opt = build_optimizer(contract, all_rows, seed=0, study_dir=study_dir)
        pred = opt.predict([configs[k] for k in keys])
        for k, m in zip(keys, pred["step_time_mean_s"], strict=True):
            if m is not None and math.isfinite(float(m)):
                smoothed[k] = float(m)
    except Exception as e:  # the observed median is an honest fallback
        log.warning("verify.smoothing_failed", error=str(e))
    ranked = sorted(keys, key=lambda k: smoothed[k])[:top_k]
    return [{"config": configs[k], "smoothed_step_time_s": smoothed[k],
             "observed_step_time_s": observed[k], "observations": len(by_key[k])} for k in ranked]


def verify_stage(study_dir: str | Path, *, top_k: int = 3, pairs: int = 3, rounds: int = 2,
                 candidates: list[dict[str, Any]] | None = None, address: str | None = None,
                 seed: int = 0, executor: Any = None, wait_s: float | None = None) -> dict[str, Any]:
    """``_verify_stage`` holding the study lock (``wait_s``: how long to wait for another writer;
    None refuses at once with ``StudyLockedError``)."""
    from infrarsi.study.lock import hold_study

    with hold_study(study_dir, "verify", wait_s=wait_s):
        return _verify_stage(study_dir, top_k=top_k, pairs=pairs, rounds=rounds, candidates=candidates,
                             address=address, seed=seed, executor=executor)


def _verify_stage(study_dir: str | Path, *, top_k: int, pairs: int, rounds: int,
                  candidates: list[dict[str, Any]] | None, address: str | None,
                  seed: int, executor: Any) -> dict[str, Any]:
    """Verify candidates and write ``verify.json``. ``candidates`` overrides the selection
    (a list of knob configs), e.g. to check a config by hand. ``executor`` is an already open
    ``StudyExecutor`` to use (and leave open); by default verify opens and closes its own."""
    from infrarsi.stages.executor import StudyExecutor
    from infrarsi.stats import accept, speedup_ci

    paths = StudyPaths(Path(study_dir).resolve())
    noise_margin = float(DoctorReport.load(paths.root).noise_margin or 0.0)
    if candidates is None:
        chosen = select_candidates(paths.root, top_k)
    else:
        chosen = [{"config": c, "smoothed_step_time_s": None, "observed_step_time_s": None,
                   "observations": 0} for c in candidates]
    if not chosen:
        result: dict[str, Any] = {"best": None, "candidates": [], "noise_margin": noise_margin,
                                  "reason": "no ok run trial to verify"}
        write_json_atomic(paths.verify, result)
        return result
    if pairs < 2 or rounds < 1:
        raise StudyError(f"verify: needs pairs >= 2 and rounds >= 1, got pairs={pairs}, rounds={rounds}.")
    ex = executor if executor is not None else StudyExecutor(paths.root, address=address)
    try:
        baseline_cfg = ex.full_config(dict(ex.workload.baseline))
        for c in chosen:
            c["config"] = ex.full_config(c["config"])
            c.update({"rounds": [], "alive": True, "trial_ids": [], "ratios": [], "pairs": []})
        for rnd in range(rounds):
            alive = [c for c in chosen if c["alive"]]
            if not alive:
                break
            base_times: list[float | None] = []
            cand_times: dict[int, list[float | None]] = {id(c): [] for c in alive}
            cand_status: dict[int, list[str]] = {id(c): [] for c in alive}
            reasons: dict[int, list[str]] = {id(c): [] for c in alive}
            for p in range(pairs):
                b = ex.run_trial(baseline_cfg, "verify", extra={"role": "baseline", "round": rnd, "pair": p})
                base_times.append(b["step_time_s"] if b["status"] == "ok" else None)
                order = alive[p % len(alive):] + alive[: p % len(alive)]
                for c in order:
                    r = ex.run_trial(c["config"], "verify",
                                     extra={"role": "candidate", "round": rnd, "pair": p,
                                            "candidate": chosen.index(c)})
                    c["trial_ids"].append(r["trial_id"])
                    cand_times[id(c)].append(r["step_time_s"] if r["status"] == "ok" else None)
                    cand_status[id(c)].append(r["status"])
                    if r["status"] != "ok":
                        reasons[id(c)].append(f"{r['trial_id']}: {r['status']}: {r['error'][:300]}")
            for c in alive:
                pairs_ok = [(bt, ct) for bt, ct in zip(base_times, cand_times[id(c)], strict=True)
                            if bt and ct]
                ratios = [bt / ct for bt, ct in pairs_ok]
                c["pairs"].extend(pairs_ok)
                c["ratios"].extend(ratios)
                rec: dict[str, Any] = {"round": rnd, "ratios": ratios, "statuses": cand_status[id(c)]}
                if len(ratios) < 2 or reasons[id(c)]:
                    rec.update({"passed": False, "speedup": None, "ci_low": None, "ci_high": None,
                                "reason": "; ".join(reasons[id(c)]) or "fewer than two valid pairs"})
                else:
                    s = speedup_ci([b for b, _ in pairs_ok], [x for _, x in pairs_ok], seed=seed + rnd)
                    passed = accept(s.ci_low, noise_margin)
                    rec.update({"passed": passed, "speedup": s.speedup, "ci_low": s.ci_low,
                                "ci_high": s.ci_high,
                                "reason": "" if passed else
                                f"CI lower bound {s.ci_low:.3f} does not clear 1 + noise margin "
                                f"{1 + noise_margin:.3f}"})
                c["rounds"].append(rec)
                if not rec["passed"]:
                    c["alive"] = False
        out_cands = []
        for c in chosen:
            accepted = c["alive"] and len(c["rounds"]) == rounds
            summary = (speedup_ci([b for b, _ in c["pairs"]], [x for _, x in c["pairs"]], seed=seed)
                       if len(c["pairs"]) >= 2 else None)
            out_cands.append({
                "config": c["config"],
                "accepted": accepted,
                "speedup": summary.speedup if summary else None,
                "ci_low": summary.ci_low if summary else None,
                "ci_high": summary.ci_high if summary else None,
                "rounds": c["rounds"],
                "trial_ids": c["trial_ids"],
                "smoothed_step_time_s": c["smoothed_step_time_s"],
                "observed_step_time_s": c["observed_step_time_s"],
                "diff_vs_baseline": {k: [baseline_cfg.get(k), v] for k, v in c["config"].items()
                                     if baseline_cfg.get(k) != v},
            })
    finally:
        if executor is None:
            ex.close()
    accepted = [c for c in out_cands if c["accepted"]]
    best = max(accepted, key=lambda c: c["speedup"] or 0.0) if accepted else None
    result = {
        "best": ({k: best[k] for k in ("config", "speedup", "ci_low", "ci_high", "accepted")} if best else None),
        "candidates": out_cands,
        "baseline_config": baseline_cfg,
        "noise_margin": noise_margin,
        "pairs": pairs,
        "rounds": rounds,
        "rule": "accept iff every round's bootstrap CI lower bound of the median paired ratio > 1 + noise_margin "
                "and every candidate trial kept the invariants",
    }
    write_json_atomic(paths.verify, result)
    from infrarsi.stages.bank_feed import add_to_bank

    add_to_bank(paths.root, stage="verify")  # the experience bank (never fails the stage)
    return result
