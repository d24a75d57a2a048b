"""Variants of infrarsi's optimizer, side by side on the surrogate problems (a research tool).

``search_efficiency.py`` compares infrarsi with its peers; this script compares infrarsi with
itself: ``Optimizer`` options (``local_every``, ``n_init``, ...) and a few model/acquisition
variations that are not options, applied inside a fresh worker process per run (so a variation
never leaks into another run's process):

- ``design: maximin``: the older pure-maximin initial design instead of the value-coverage one;
- ``kernel: matern``: a Matern-5/2 step-time kernel (same dimension-scaled lengthscale prior)
  instead of BoTorch's default RBF;
- ``sd_scale: s``: the step-time posterior sd multiplied by ``s`` in the acquisition (< 1 exploits
  more, > 1 explores more).

Each run asks, runs and tells 24 trials; best-found/oracle is scored at 12 and 24 like
``search_efficiency.py`` (the noiseless time of ``Optimizer.best()`` over the oracle).

Usage::

    python -m benchmarks.search_variants '{"default": {}, "sd07": {"sd_scale": 0.7}}' --seeds 16
"""

from __future__ import annotations

import argparse
import json
import math
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

PROBLEMS = ("surrogate_1node", "surrogate_2node")
BUDGETS = (12, 24)


def _apply_variations(opts: dict[str, Any]) -> dict[str, Any]:
    """Pop and apply the non-option variations (this process only); return the Optimizer options."""
    opts = dict(opts)
    if opts.pop("design", None) == "maximin":
        from infrarsi.search import design

        def maximin(configs, X, seen, existing, names, rng, weights=None):  # type: ignore[no-untyped-def]
            return design.maximin_pick(X, existing, rng, weights=weights)

        design.coverage_pick = maximin  # type: ignore[assignment]
    if opts.pop("kernel", None) == "matern":
        import botorch.models
        from gpytorch.kernels import MaternKernel
        from gpytorch.priors import LogNormalPrior

        import infrarsi.search.models.time_gp as time_gp

        base = botorch.models.SingleTaskGP

        def with_matern(X, Y, **kw):  # type: ignore[no-untyped-def]
            d = X.shape[-1]
            prior = LogNormalPrior(loc=math.sqrt(2) + 0.5 * math.log(d), scale=math.sqrt(3))
            return base(X, Y, covar_module=MaternKernel(nu=2.5, ard_num_dims=d, lengthscale_prior=prior).double(), **kw)

        time_gp.SingleTaskGP = with_matern  # type: ignore[misc,assignment]
    scale = opts.pop("sd_scale", None)
    if scale is not None:
        from infrarsi.search import acquisition

        orig = acquisition.predict_time

        def scaled(pred, X):  # type: ignore[no-untyped-def]
            m, s = orig(pred, X)
            return m, s * float(scale)

        acquisition.predict_time = scaled
    return opts


def run_one(job: tuple[str, dict[str, Any], str, int]) -> dict[str, Any]:
    """One 24-trial run of a variant on a problem with a seed."""
    import torch

    from benchmarks.peers import Observation
    from benchmarks.search_efficiency import InfrarsiPeer, _problem

    torch.set_num_threads(1)
    name, opts, problem_name, seed = job
    problem = _problem(problem_name)
    peer = InfrarsiPeer(problem, seed, **_apply_variations(opts))
    oracle = problem.oracle_time
    ratios: dict[int, float] = {}
    wasted_s = total_s = 0.0
    for i in range(max(BUDGETS)):
        cfg = problem.space.validate(peer.ask())
        d = problem.trial(cfg, seed, i)
        peer.tell(cfg, Observation(d.status, d.step_time_s, d.peak_memory_bytes))
        total_s += d.device_seconds
        wasted_s += d.device_seconds if d.status in ("oom", "failed") else 0.0
        if i + 1 in BUDGETS:
            best = peer.best()
            ratios[i + 1] = problem.true_time(best) / oracle if best else math.inf
    return {"variant": name, "problem": problem_name, "seed": seed, "ratios": ratios,
            "wasted_fraction": wasted_s / total_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", help='JSON: name -> options, e.g. \'{"default": {}}\'')
    ap.add_argument("--seeds", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    variants = json.loads(args.variants)
    jobs = [(v, o, p, s) for v, o in variants.items() for p in PROBLEMS for s in range(args.seeds)]
    started = time.time()
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with ProcessPoolExecutor(args.workers, max_tasks_per_child=1) as ex:
        for r in ex.map(run_one, jobs):
            runs.setdefault((r["variant"], r["problem"]), []).append(r)
    print("| variant | problem | seeds | ratio@12 median [IQR] | ratio@24 median [IQR] | wasted (median) |")
    print("|---|---|---|---|---|---|")
    for (v, p), rs in sorted(runs.items()):
        cells = []
        for b in BUDGETS:
            x = np.array([r["ratios"][b] for r in rs])
            cells.append(f"{np.median(x):.3f} [{np.percentile(x, 25):.3f}, {np.percentile(x, 75):.3f}]")
        waste = np.median([r["wasted_fraction"] for r in rs])
        print(f"| {v} | {p} | {len(rs)} | {cells[0]} | {cells[1]} | {waste:.1%} |")
    print(f"\n{len(jobs)} runs in {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
