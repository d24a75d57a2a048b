"""The report's figures, drawn with matplotlib's Agg backend and returned as PNG bytes.

Each function takes a ``StudyData`` and returns ``(png_bytes, caption)``, or None when the study
holds nothing to draw for it (the report then says why).
"""

from __future__ import annotations

import io
from collections import defaultdict
from collections.abc import Mapping

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from infrarsi.errors import UserInputError
from infrarsi.report.data import StudyData
from infrarsi.result import STATUSES, TrialResult
from infrarsi.search.ask_info import AskInfo

Png = tuple[bytes, str]

_STATUS_COLORS = {
    "ok": "#2a7ab9",
    "oom": "#d62728",
    "failed": "#7f7f7f",
    "timeout": "#ff7f0e",
    "nan": "#9467bd",
    "invariant_violation": "#8c564b",
}
GIB = float(1 << 30)


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def best_so_far(data: StudyData) -> Png | None:
    """Best observed step time against run trials and against cumulative device-hours."""
    runs = [r for r in data.trials if r.stage == "run"]
    if not runs:
        return None
    xs, hours, best, cur, dh = [], [], [], float("inf"), 0.0
    for i, r in enumerate(runs, 1):
        dh += r.device_seconds / 3600.0
        if r.ok and r.step_time_s:
            cur = min(cur, r.step_time_s)
        xs.append(i)
        hours.append(dh)
        best.append(cur if cur < float("inf") else float("nan"))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    base = data.baseline.step_time_s if data.baseline else None
    seen = [r.step_time_s for r in runs if r.ok and r.step_time_s] + ([base] if base else [])
    top = max(seen) * 1.08 if seen else 1.0  # where trials without a step time are marked
    for ax, x, xl in ((axes[0], xs, "run trial #"), (axes[1], hours, "cumulative device-hours")):
        ax.step(x, best, where="post", color="#2a7ab9", label="best so far")
        labelled: set[str] = set()
        for r, xi in zip(runs, x, strict=True):
            if r.ok and r.step_time_s:
                ax.plot(xi, r.step_time_s, "o", ms=3, color="#9ecae1")
            else:
                ax.plot(
                    xi,
                    top,
                    "x",
                    ms=6,
                    color=_STATUS_COLORS.get(r.status, "k"),
                    label=r.status if r.status not in labelled else None,
                )
                labelled.add(r.status)
        if base:
            ax.axhline(base, ls="--", color="#555", label=f"baseline {base:.3g} s")
        ax.set_xlabel(xl)
        ax.set_ylabel("step time (s)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return _png(fig), (
        "Best step time found so far against run trials (left) and device-hours "
        "burned, failed trials included (right). Dots: ok trials; crosses along the "
        "top: trials with no valid step time (oom, failed, invariant violation...)."
    )


def time_vs_memory(data: StudyData) -> Png | None:
    """Step time against peak memory; OOM trials as censored arrows at the capacity line."""
    ok = [r for r in data.trials if r.ok and r.step_time_s and r.peak_memory_bytes]
    oom = [r for r in data.trials if r.status == "oom"]
    if not ok and not oom:
        return None
    cap = data.capacity_bytes
    fig, ax = plt.subplots(figsize=(7, 4.2))
    if ok:
        ax.scatter(
            [float(r.peak_memory_bytes or 0) / GIB for r in ok],
            [float(r.step_time_s or 0) for r in ok],
            s=18,
            c="#2a7ab9",
            label="ok trial",
            zorder=3,
        )
    ys = [r.step_time_s for r in ok if r.step_time_s] or [1.0]
    lo, hi = min(ys), max(ys)
    starts = [max(float(r.peak_memory_bytes or 0), float(cap or 0)) / GIB for r in oom]
    xs_all = [float(r.peak_memory_bytes or 0) / GIB for r in ok] + starts + [float(cap or 0) / GIB]
    span = max(xs_all) or 1.0
    tips = []
    for i, (r, x0) in enumerate(zip(oom, starts, strict=True)):
        del r
        y = lo + (hi - lo) * (i + 1) / (len(oom) + 1) if hi > lo else lo * (1 + 0.05 * i)
        tip = x0 + 0.15 * span
        tips.append(tip)
        ax.annotate(
            "",
            xy=(tip, y),
            xytext=(x0, y),
            arrowprops={"arrowstyle": "-|>", "color": "#d62728", "lw": 1.8},
        )
        ax.plot(
            x0,
            y,
            "|",
            color="#d62728",
            ms=12,
            mew=2,
            label="OOM: peak >= mark (censored), step time unknown" if i == 0 else None,
        )
    if tips:
        ax.set_xlim(right=max(tips) * 1.03)
    if cap:
        ax.axvline(cap / GIB, color="#d62728", ls="--", lw=1, label=f"capacity {cap / GIB:.3g} GiB")
    for side, marker in ((data.baseline, "s"), (data.best, "*")):
        if side and side.step_time_s and side.peak_memory_bytes:
            ax.plot(
                side.peak_memory_bytes / GIB,
                side.step_time_s,
                marker,
                ms=12,
                mfc="none",
                mec="k",
                label=side.label,
            )
    ax.set_xlabel("peak memory per device (GiB)")
    ax.set_ylabel("step time (s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig), (
        "Step time against peak memory per device. Out-of-memory trials are "
        "censored: their peak is only known to exceed the capacity (or the recorded "
        "lower bound), drawn as arrows starting at that line."
    )


def predicted_peak_memory_bytes(row: TrialResult) -> float | None:
    """The peak memory the optimizer predicted when it asked for the row's config (its
    ``AskInfo`` in ``extra.ask_info``), or None."""
    raw = row.extra.ask_info
    if not isinstance(raw, Mapping) or not raw:
        return None
    try:
        return AskInfo.from_dict(raw).predicted_peak_memory_bytes
    except UserInputError:  # not an ask info
        return None


def predicted_vs_measured(data: StudyData) -> Png | None:
    """The optimizer's predicted peak memory against the measured one (censored for OOM)."""
    pts = [
        (r, p)
        for r in data.trials
        if r.peak_memory_bytes is not None and (p := predicted_peak_memory_bytes(r)) is not None
    ]
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(5.2, 4.2))
    xs = [p / GIB for _, p in pts]
    ys = [float(r.peak_memory_bytes or 0) / GIB for r, _ in pts]
    m = max(xs + ys) * 1.1
    ax.plot([0, m], [0, m], color="#999", lw=1, label="perfect prediction")
    for (r, _), x, y in zip(pts, xs, ys, strict=True):
        if r.memory_censored:
            ax.annotate(
                "",
                xy=(x, y + 0.08 * m),
                xytext=(x, y),
                arrowprops={"arrowstyle": "->", "color": "#d62728"},
            )
            ax.plot(x, y, "_", color="#d62728", ms=10)
        else:
            ax.plot(x, y, "o", color="#2a7ab9", ms=4)
    if data.capacity_bytes:
        ax.axhline(data.capacity_bytes / GIB, color="#d62728", ls="--", lw=1, label="capacity")
    ax.set_xlabel("predicted peak memory (GiB)")
    ax.set_ylabel("measured peak memory (GiB)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _png(fig), (
        "Predicted (by the memory model, before the trial ran) against measured "
        "peak memory. Red arrows: OOM trials, whose true peak is above the mark."
    )


def phases(data: StudyData) -> Png | None:
    """Per-step phase breakdown, baseline vs best (stacked bars)."""
    sides = [s for s in (data.baseline, data.best) if s and s.phases()]
    if not sides:
        return None
    names = sorted({k for s in sides for k in s.phases()})
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.8 * len(sides)))
    cmap = plt.get_cmap("tab10")
    for i, s in enumerate(sides):
        left = 0.0
        ph = s.phases()
        for j, n in enumerate(names):
            v = ph.get(n, 0.0)
            ax.barh(i, v, left=left, color=cmap(j % 10), label=n if i == 0 else None)
            left += v
    ax.set_yticks(range(len(sides)), [s.label for s in sides])
    ax.set_xlabel("seconds per optimizer step (median)")
    ax.legend(fontsize=8, ncol=min(len(names), 5), loc="upper center", bbox_to_anchor=(0.5, -0.35))
    return _png(fig), "Where a step's time goes, baseline vs best (median per-step seconds)."


def device_seconds(data: StudyData) -> Png | None:
    """Device-seconds burned per status, stacked by stage."""
    if not data.trials:
        return None
    acc: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in data.trials:
        acc[r.stage][r.status] += r.device_seconds
    statuses = [s for s in STATUSES if any(acc[st].get(s) for st in acc)]
    if not statuses:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.2))
    bottom = [0.0] * len(statuses)
    for stage, col in zip(
        sorted(acc), ("#2a7ab9", "#ff7f0e", "#2ca02c", "#9467bd", "#d62728"), strict=False
    ):
        vals = [acc[stage].get(s, 0.0) for s in statuses]
        ax.bar(statuses, vals, bottom=bottom, color=col, label=stage)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_ylabel("device-seconds")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    return _png(
        fig
    ), "Device-seconds burned per trial status, stacked by stage (failed trials count)."


def loss_curves(data: StudyData) -> Png | None:
    """Per-step training loss, baseline vs best (the loss invariant)."""
    sides = [s for s in (data.baseline, data.best) if s and s.loss()]
    if not sides:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for s, style in zip(sides, ("-", "--"), strict=False):
        ax.plot(range(len(s.loss())), s.loss(), style, marker=".", label=s.label)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _png(fig), (
        "Training loss per optimizer step, same seed and data order: the best "
        "config must stay within the contract's tolerance of the baseline."
    )


def long_check_curves(data: StudyData) -> Png | None:
    """The long check's loss curves past the trial's horizon: baseline, candidate, and the honest
    change that calibrated the tolerance, with the trial's horizon and the checkpoint marked."""
    lc = data.long_check or {}
    base, cand = lc.get("baseline_loss") or [], lc.get("candidate_loss") or []
    if not base or not cand:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.plot(range(len(base)), base, "-", label="baseline")
    ax.plot(range(len(cand)), cand, "--", label="candidate")
    cal = lc.get("calibration_loss") or []
    if cal:
        ax.plot(range(len(cal)), cal, ":", label="honest change (calibration)")
    steps = lc.get("trial_steps")
    if steps:
        ax.axvline(float(steps) - 0.5, color="#7f7f7f", lw=1, label="a trial's horizon")
    ck = (lc.get("checkpoint") or {}).get("step")
    if ck:
        ax.axvline(
            float(ck) - 0.5,
            color="#2ca02c",
            lw=1,
            ls="-.",
            label="checkpoint saved, engine rebuilt",
        )
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _png(fig), (
        f"The long check: {len(cand)} optimizer steps of the candidate beside the baseline (a trial "
        f"runs {steps}); every step must stay within {lc.get('loss_atol', 0):.3g} of the baseline."
    )


FIGURES = {
    "best_so_far": best_so_far,
    "time_vs_memory": time_vs_memory,
    "predicted_vs_measured": predicted_vs_measured,
    "phases": phases,
    "device_seconds": device_seconds,
    "loss_curves": loss_curves,
}
"""Figure name -> function (the report draws them in this order)."""
