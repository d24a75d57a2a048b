"""Fixed-seed replay of the search: the configs infrarsi proposes, to show a change kept every decision.

A refactor of the search core must not change what it proposes. Record the configs before the
change, then replay after it and compare::

    python -m benchmarks.replay --out /tmp/before.json                 # on the old commit
    python -m benchmarks.replay --out /tmp/after.json --compare /tmp/before.json

By default: seeds 0 and 1 of ``surrogate_2node`` and ``tabular_dense_debug``, 24 trials each
(about 4 minutes on 2 cores). The exit code is 1 when ``--compare`` finds a difference, and the
first differing trial of each run is printed. Compare replays made on the same machine:
floating-point differences between CPUs change GP fits and, through near-ties, the picks.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.search_efficiency import run_one

DEFAULT_PROBLEMS = ("surrogate_2node", "tabular_dense_debug")


def replay(
    problems: Sequence[str], seeds: Sequence[int], trials: int
) -> dict[str, list[dict[str, Any]]]:
    """``"problem/seed"`` -> the configs infrarsi asked, in order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for problem in problems:
        for seed in seeds:
            run = run_one(problem, "infrarsi", seed, (trials,))
            out[f"{problem}/{seed}"] = [t["config"] for t in run["trials"]]
    return out


def differences(
    before: dict[str, list[dict[str, Any]]], after: dict[str, list[dict[str, Any]]]
) -> list[str]:
    """One line per run that differs: a run missing on one side, or its first differing trial."""
    lines = []
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key), after.get(key)
        if a is None or b is None:
            lines.append(f"{key}: only in {'after' if a is None else 'before'}")
            continue
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            if x != y:
                lines.append(f"{key}: trial {i} differs: {x} != {y}")
                break
        else:
            if len(a) != len(b):
                lines.append(f"{key}: {len(a)} trials before, {len(b)} after")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out", type=Path, required=True, help="Where to write the replayed configs (JSON)."
    )
    ap.add_argument(
        "--compare", type=Path, help="A JSON file of an earlier replay to compare with."
    )
    ap.add_argument("--problems", nargs="+", default=list(DEFAULT_PROBLEMS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--trials", type=int, default=24)
    args = ap.parse_args(argv)
    got = replay(args.problems, args.seeds, args.trials)
    args.out.write_text(json.dumps(got, indent=0, sort_keys=True))
    print(f"wrote {args.out}: {', '.join(f'{k} ({len(v)} configs)' for k, v in got.items())}")
    if args.compare is None:
        return 0
    diff = differences(json.loads(args.compare.read_text()), got)
    print("\n".join(diff) if diff else f"identical to {args.compare}")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
