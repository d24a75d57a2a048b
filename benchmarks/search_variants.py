"""Variants of infrarsi's optimizer, side by side on the surrogate problems (a research tool).

``search_efficiency.py`` compares infrarsi with its peers; this script compares infrarsi with
itself. A variant is a JSON object of options: any ``OptimizerSettings`` field
(``local_every``, ``n_init``, ``local_radius``, ``config_deviation_sd``, ...; the variant is
built as ``OptimizerSettings.from_dict``), the names earlier runs used for some of them, and a
few changes to the analytic prior:

- ``design: maximin``: the older pure-maximin initial design instead of the value-coverage one
  (``design_rule``);
- ``kernel: matern``: a Matern-5/2 step-time kernel (same dimension-scaled lengthscale prior)
  instead of BoTorch's default RBF (``time_kernel``);
- ``sd_scale: s``: the step-time posterior sd multiplied by ``s`` in the acquisition (< 1 exploits
  more, > 1 explores more; ``acquisition_sd_scale``);
- ``local_radius: r``: local steps score configs within ``r`` knob changes of the incumbent
  (default 2);
- ``config_sd: s``: the sd (log seconds) of the step-time kernel's per-config deviation term
  (``config_deviation_sd``; 0 turns the term off);
- ``coef_prior_sd: s``: the sd of each step-time log coefficient's prior around nominal
  (``prior_time_coef_sd``; smaller keeps the fitted prior nearer its nominal shape);
- ``time_noise_sd: s``: the assumed sd of log step time around the fitted prior in the coefficient
  fit (``prior_time_noise_sd``);
- ``acq_config_sd: s``: the sd (log seconds) of the per-config deviation term as the acquisition
  credits it to untried configs (``acquisition_config_sd``, default 0.04; 0.08, the model's
  ``config_deviation_sd``, credits it in full);
- ``outliers: off``: no trimming of slow outliers (stragglers) from the step-time model
  (``outlier_min_points`` out of reach; ``infrarsi/search/models/outliers.py``);
- ``prior: null``: no analytic prior (the optimizer as before it had one);
- ``prior_hardware_error: f``: every nominal hardware figure of the prior (peak FLOP/s, bandwidths,
  CPU Adam rate, fixed memory) multiplied by its own random factor in ``[1/f, f]`` (log-uniform,
  drawn per seed): a prior that has the wrong datasheet;
- ``prior_memory_error: f``: every memory term of the prior (model states, activations, logits,
  buffers, fixed) multiplied by its own random factor in ``[1/f, f]`` (log-uniform, drawn per
  seed): memory formulas that miss the framework's real allocations (allocator fragmentation,
  temporary buffers, a different attention kernel), so memory has to be learned from trials;
- ``prior_terms: coarse``: a prior that only knows compute time and model-state + activation
  memory (every other term zero): a prior with missing physics.

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
"""Default problems (any of ``benchmarks.problems.PROBLEMS`` may be named with ``--problems``)."""
BUDGETS = (12, 24)


LEGACY_NAMES = {
    "config_sd": "config_deviation_sd",
    "acq_config_sd": "acquisition_config_sd",
    "sd_scale": "acquisition_sd_scale",
    "coef_prior_sd": "prior_time_coef_sd",
    "time_noise_sd": "prior_time_noise_sd",
    "design": "design_rule",
    "kernel": "time_kernel",
}
"""Variant option names of earlier runs -> ``OptimizerSettings`` fields."""


def variant_settings(opts: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Split a variant's options into ``OptimizerSettings`` and the other ``Optimizer`` keyword
    arguments (``prior``)."""
    import dataclasses

    from infrarsi.search import OptimizerSettings

    rest = dict(opts)
    names = {f.name for f in dataclasses.fields(OptimizerSettings)}
    values: dict[str, Any] = {}
    if rest.pop("outliers", None) == "off":
        values["outlier_min_points"] = 10**9  # the trimming loop never starts: one plain fit
    for key in list(rest):
        name = LEGACY_NAMES.get(key, key)
        if name in names:
            values[name] = rest.pop(key)
    return OptimizerSettings.from_dict(values), rest


class _WrappedPrior:
    """A prior that edits another prior's terms (``_edit``); names and spec stay the inner one's."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.kind, self.time_names, self.memory_names = (
            inner.kind,
            inner.time_names,
            inner.memory_names,
        )

    def terms(self, configs: Any) -> tuple[np.ndarray, np.ndarray]:
        return self._edit(*self.inner.terms(configs))

    def _edit(self, T: np.ndarray, M: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def spec(self) -> dict[str, Any]:
        return dict(self.inner.spec())


class _ScaledMemoryPrior(_WrappedPrior):
    """A prior whose memory terms are each off by a fixed factor."""

    def __init__(self, inner: Any, factors: np.ndarray) -> None:
        super().__init__(inner)
        self.factors = factors

    def _edit(self, T: np.ndarray, M: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return T, M * self.factors


class _CoarsePrior(_WrappedPrior):
    """A prior with only the compute time and model-state + activation memory terms."""

    TIME_KEEP = ("compute_bf16", "compute_fp32", "fixed")
    MEMORY_KEEP = ("model_states", "activations", "fixed")

    def _edit(self, T: np.ndarray, M: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        T[:, [i for i, n in enumerate(self.time_names) if n not in self.TIME_KEEP]] = 0.0
        M[:, [i for i, n in enumerate(self.memory_names) if n not in self.MEMORY_KEEP]] = 0.0
        return T, M


def _misspecify_prior(problem: Any, opts: dict[str, Any], seed: int) -> dict[str, Any]:
    """Apply ``prior_hardware_error`` / ``prior_terms`` to the problem's prior (module docstring)."""
    from dataclasses import replace

    from infrarsi.search.priors.transformer import TransformerPrior

    err = opts.pop("prior_hardware_error", None)
    mem_err = opts.pop("prior_memory_error", None)
    coarse = opts.pop("prior_terms", None) == "coarse"
    if err is None and mem_err is None and not coarse:
        return opts
    prior = problem.prior
    if err is not None:
        rng = np.random.default_rng([seed, 99])
        fields = (
            "peak_flops",
            "memory_bytes_per_s",
            "intra_bytes_per_s",
            "inter_bytes_per_s",
            "host_bytes_per_s",
            "cpu_adam_params_per_s",
            "fixed_memory_bytes",
        )
        lf = math.log(float(err))
        shape = replace(
            prior.shape,
            **{f: getattr(prior.shape, f) * math.exp(rng.uniform(-lf, lf)) for f in fields},
        )
        prior = TransformerPrior(shape)
    if mem_err is not None:
        lm = math.log(float(mem_err))
        factors = np.exp(
            np.random.default_rng([seed, 98]).uniform(-lm, lm, size=len(prior.memory_names))
        )
        prior = _ScaledMemoryPrior(prior, factors)
    if coarse:
        prior = _CoarsePrior(prior)
    opts["prior"] = prior
    return opts


def run_one(job: tuple[str, dict[str, Any], str, int]) -> dict[str, Any]:
    """One 24-trial run of a variant on a problem with a seed."""
    import torch

    from benchmarks.peers import Observation
    from benchmarks.search_efficiency import InfrarsiPeer, _problem

    torch.set_num_threads(1)
    name, opts, problem_name, seed = job
    problem = _problem(problem_name)
    opts = _misspecify_prior(problem, dict(opts), seed)
    settings, options = variant_settings(opts)
    peer = InfrarsiPeer(problem, seed, settings=settings, **options)
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
    return {
        "variant": name,
        "problem": problem_name,
        "seed": seed,
        "ratios": ratios,
        "wasted_fraction": wasted_s / total_s,
    }


def main() -> None:
    from benchmarks.problems import PROBLEMS as ALL_PROBLEMS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", help="JSON: name -> options, e.g. '{\"default\": {}}'")
    ap.add_argument("--seeds", type=int, default=16)
    ap.add_argument("--first-seed", type=int, default=0, help="seeds run from here (default 0)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--problems", nargs="+", default=list(PROBLEMS), choices=sorted(ALL_PROBLEMS))
    ap.add_argument(
        "--jsonl", help="also write one JSON line per run (per-seed ratios) to this file"
    )
    args = ap.parse_args()
    variants = json.loads(args.variants)
    jobs = [
        (v, o, p, s)
        for v, o in variants.items()
        for p in args.problems
        for s in range(args.first_seed, args.first_seed + args.seeds)
    ]
    started = time.time()
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with ProcessPoolExecutor(args.workers, max_tasks_per_child=1) as ex:
        for r in ex.map(run_one, jobs):
            runs.setdefault((r["variant"], r["problem"]), []).append(r)
    if args.jsonl:
        with open(args.jsonl, "w") as f:
            for rs in runs.values():
                for r in rs:
                    f.write(json.dumps(r) + "\n")
    print(
        "| variant | problem | seeds | ratio@12 median [IQR] | ratio@24 median [IQR] | wasted (median) |"
    )
    print("|---|---|---|---|---|---|")
    for (v, p), rs in sorted(runs.items()):
        cells = []
        for b in BUDGETS:
            x = np.array([r["ratios"][b] for r in rs])
            cells.append(
                f"{np.median(x):.3f} [{np.percentile(x, 25):.3f}, {np.percentile(x, 75):.3f}]"
            )
        waste = np.median([r["wasted_fraction"] for r in rs])
        print(f"| {v} | {p} | {len(rs)} | {cells[0]} | {cells[1]} | {waste:.1%} |")
    print(f"\n{len(jobs)} runs in {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
