"""Re-score ``Optimizer.best()`` on recorded search-efficiency runs at several ``best_confidence``
values, without asking again.

Each run's trials are told again with the same draws (``BenchProblem.trial`` is seeded by the seed,
the trial index and the config), one fit per (run, budget), and the recommendation of every
confidence is read off that fit's ``BestChoice`` (its two picks and ``p_measured_slower``). A
confidence of 0.5 is the posterior-mean rule ``best()`` had before ``best_choice``. ``best()`` never
changes what ``ask()`` proposes, so one set of runs serves every confidence::

    python -m benchmarks.search_efficiency --searchers infrarsi --seeds 12 --budgets 12 24 --out /tmp/se
    python -m benchmarks.best_rescore /tmp/se/search_efficiency_runs.main.jsonl

Prints, per (problem, budget), the median and mean true-time ratio over seeds of each confidence,
the reasons at the default confidence, and every run where the two picks disagreed.
"""

from __future__ import annotations

import argparse
import collections
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.search_efficiency import _problem

CONFIDENCES = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
SEARCHERS = {"infrarsi": "", "infrarsi_no_prior": " [no prior]"}
"""The searchers whose runs are re-scored (re-told with the prior, or without it), and the label
suffix of each in the printout."""


def rescore(runs: list[dict[str, Any]], confidences: Sequence[float] = CONFIDENCES) -> None:
    """Print the table described in the module docstring for the infrarsi runs of ``runs`` (with
    and without the prior, ``SEARCHERS``)."""
    import torch

    from infrarsi.search import Optimizer, Outcome
    from infrarsi.search.settings import DEFAULT_SETTINGS

    torch.set_num_threads(1)
    ratios: dict[tuple[str, int], list[list[float]]] = collections.defaultdict(list)
    reasons: collections.Counter[tuple[str, int, str]] = collections.Counter()
    cases: list[str] = []
    problems: dict[str, Any] = {}
    for r in (r for r in runs if r["searcher"] in SEARCHERS):
        p = problems.setdefault(r["problem"], _problem(r["problem"]))
        label = r["problem"] + SEARCHERS[r["searcher"]]
        draws = [
            p.trial(p.space.validate(t["config"]), r["seed"], i) for i, t in enumerate(r["trials"])
        ]
        for b in r["budgets"]:
            opt = Optimizer(
                p.space,
                memory_capacity=p.capacity,
                seed=r["seed"],
                baseline=p.baseline,
                prior=None if r["searcher"] == "infrarsi_no_prior" else p.prior,
            )
            for t, d in zip(r["trials"][:b], draws[:b], strict=True):
                opt.tell(
                    t["config"],
                    Outcome(d.status, step_time=d.step_time_s, peak_memory=d.peak_memory_bytes),
                )
            ch = opt.best_choice()
            if ch is None:
                continue
            reasons[(label, b, ch.reason)] += 1
            chosen = p.true_time(ch.config) / p.oracle_time
            if ch.alternative is None or ch.p_measured_slower is None:
                ratios[(label, b)].append([chosen] * len(confidences))
                continue
            other = p.true_time(ch.alternative.config) / p.oracle_time
            measured, posterior = (
                (chosen, other)
                if ch.reason == "measured_faster_posterior_uncertain"
                else (other, chosen)
            )
            ratios[(label, b)].append(
                [posterior if ch.p_measured_slower >= c else measured for c in confidences]
            )
            cases.append(
                f"{label} seed {r['seed']} at {b}: P(measured slower) "
                f"{ch.p_measured_slower:.3f}, true/oracle of the measured pick {measured:.4f} "
                f"(n={ch.n_measured if measured == chosen else ch.alternative.n_measured}), of the "
                f"posterior pick {posterior:.4f}"
            )
    print("confidences:", " ".join(f"{c:g}" for c in confidences))
    for (prob, b), rows in sorted(ratios.items()):
        a = np.array(rows)
        med = " ".join(f"{x:.3f}" for x in np.median(a, 0))
        mean = " ".join(f"{x:.4f}" for x in a.mean(0))
        print(f"{prob} at {b} ({len(rows)} seeds): median {med} | mean {mean}")
    print(f"reasons at best_confidence {DEFAULT_SETTINGS.best_confidence}:")
    for (prob, b, why), n in sorted(reasons.items()):
        print(f"  {prob} at {b}: {why} x{n}")
    print("disagreements:")
    for c in cases:
        print("  " + c)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path, nargs="+", help="search_efficiency_runs.*.jsonl files")
    args = ap.parse_args(argv)
    runs = [
        json.loads(line) for path in args.runs for line in path.read_text().splitlines() if line
    ]
    rescore(runs)


if __name__ == "__main__":
    main()
