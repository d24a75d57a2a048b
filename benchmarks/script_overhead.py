"""Script mode against entry-point mode: the harness's per-step cost on one model, both ways.

    .venv/bin/python -m benchmarks.script_overhead [--rounds 5] [--measured 20] [--dim 64]

The same tiny LM (``examples/scripts/ds_train.py``'s ``TinyLM``), the same data (its
``global_batch``, a function of the step) and the same knob config, trained on 2 CPU ranks (the
script's ``ds.json`` without its ``gradient_clipping``, which the entry job's engine does not do):

- *script*: ``ds_train.py`` run unchanged as a script workload (``script_job``: the script's own
  loop and loss; the harness taps ``deepspeed.initialize``'s engine, counts, times and stops it);
- *entry*: the same model and data as an entry-point job (``make_job``, ``rank_loop``: the
  harness's own loop, loss and phase clocks).

Trials alternate (entry, script, entry, script, ...; one trial at a time on the machine, each in
a fresh worker group), and each round's ratio is ``script step_time_s / entry step_time_s``
(medians of the measured steps, slowest rank). Target (issue 28): the median ratio <= 1.05.
Results go to ``benchmarks/results/script_overhead.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from infrarsi.execution.runner import TrialRunner, init_ray  # noqa: E402
from infrarsi.workload import Workload  # noqa: E402

EXAMPLE = ROOT / "examples" / "scripts"
CONFIG = {"zero_stage": 0, "micro_batch_size": 8, "dtype": "fp32"}
"""The knob config of every trial (micro-batch 8: each rank's batch in one pass)."""
TARGET_RATIO = 1.05
"""Script-mode step time over entry-mode step time the harness should stay under."""

JOB = '''\
"""The example script's model and data as an entry-point job (benchmarks/script_overhead.py)."""
from ds_train import TinyLM, global_batch

from infrarsi.job import ModelShape, TokenBatch, TrainingJob


def make_job(ctx):
    a = ctx.args
    vocab, dim, layers, seq = int(a["vocab"]), int(a["dim"]), int(a["layers"]), ctx.seq_len

    def batch(step, rows):
        x, y = global_batch(step, rows, seq, vocab, int(a["seed"]))
        return TokenBatch(x, y)

    return TrainingJob(
        build_model=lambda: TinyLM(vocab, dim, layers, heads=4, seq_len=seq),
        shape=ModelShape(n_layers=layers, dim=dim, vocab_size=vocab, n_heads=4),
        global_batch=batch,
    )
'''


def workloads(folder: Path, dim: int, layers: int, measured: int) -> dict[str, Workload]:
    """The script workload and the entry-point workload of the same model, written in ``folder``."""
    shutil.copy(EXAMPLE / "ds_train.py", folder / "ds_train.py")
    ds = json.loads((EXAMPLE / "ds.json").read_text())
    ds.pop("gradient_clipping", None)  # the entry job's engine does not clip: the same training
    (folder / "ds.json").write_text(json.dumps(ds))
    (folder / "tiny_lm_job.py").write_text(JOB)
    common: dict[str, Any] = {
        "data": {"seq_len": 64},
        "tokens_per_step": 1024,
        "steps": {"warmup": 2, "measured": measured},
        "resources": {"workers": 2, "cpus_per_worker": 1, "device": "cpu"},
        "baseline": {"zero_stage": 0, "micro_batch_size": 8},
        "search_space": str(ROOT / "search_spaces" / "deepspeed_dense.yaml"),
    }
    size = ["--dim", str(dim), "--layers", str(layers)]
    script = {
        "name": "tiny_lm_script",
        "script": {
            "path": "ds_train.py",
            "args": ["--deepspeed", "--deepspeed_config", "ds.json", "--steps", "100000", *size],
            "launcher": "deepspeed",
        },
        **common,
    }
    entry = {
        "name": "tiny_lm_entry",
        "model": {
            "entry_point": "tiny_lm_job:make_job",
            "code_dir": ".",
            "args": {"vocab": 512, "dim": dim, "layers": layers, "seed": 1234},
        },
        **common,
    }
    out = {}
    for name, data in (("script", script), ("entry", entry)):
        path = folder / f"{name}.yaml"
        path.write_text(json.dumps(data))  # JSON is YAML
        out[name] = Workload.from_yaml(path)
    return out


def one_trial(wl: Workload, trial_id: str) -> dict[str, Any]:
    """One trial in a fresh worker group; its step time and what the harness counted."""
    with TrialRunner(wl) as runner:
        res = runner.run(dict(CONFIG), trial_id=trial_id)
    if res.status != "ok":
        raise RuntimeError(f"{trial_id}: {res.status}: {res.error[-1500:]}")
    return {
        "trial_id": trial_id,
        "step_time_s": res.step_time_s,
        "step_time_samples_s": res.step_time_samples_s,
        "tokens_per_step": res.tokens_per_step,
        "optimizer_steps": res.optimizer_steps,
        "loss_last": res.loss[-1] if res.loss else None,
    }


def run(rounds: int, measured: int, dim: int, layers: int) -> dict[str, Any]:
    """``rounds`` pairs of trials, entry then script, and their ratios."""
    init_ray()
    folder = Path(tempfile.mkdtemp(prefix="infrarsi-overhead-"))
    try:
        wls = workloads(folder, dim, layers, measured)
        pairs = []
        for r in range(rounds):
            entry = one_trial(wls["entry"], f"entry-{r}")
            script = one_trial(wls["script"], f"script-{r}")
            pairs.append(
                {
                    "round": r,
                    "entry": entry,
                    "script": script,
                    "ratio": script["step_time_s"] / entry["step_time_s"],
                }
            )
            print(
                f"round {r}: entry {entry['step_time_s']:.4f} s, script "
                f"{script['step_time_s']:.4f} s, ratio {pairs[-1]['ratio']:.3f}",
                flush=True,
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    ratios = [p["ratio"] for p in pairs]
    return {
        "config": CONFIG,
        "model": {"dim": dim, "layers": layers, "vocab": 512, "seq_len": 64},
        "tokens_per_step": 1024,
        "measured_steps": measured,
        "rounds": rounds,
        "pairs": pairs,
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "entry_step_time_s_median": statistics.median(p["entry"]["step_time_s"] for p in pairs),
        "script_step_time_s_median": statistics.median(p["script"]["step_time_s"] for p in pairs),
        "target_ratio": TARGET_RATIO,
        "meets_target": statistics.median(ratios) <= TARGET_RATIO,
        "how_measured": (
            "2 CPU ranks (gloo), one trial at a time, each in a fresh worker group; step_time_s = "
            "median over the measured steps of the slowest rank's step; ratio = script / entry "
            "per round, entry first"
        ),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write(result: dict[str, Any], out_dir: Path) -> None:
    """``script_overhead.json`` and a Markdown summary."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "script_overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    rows = "\n".join(
        f"| {p['round']} | {p['entry']['step_time_s']:.4f} | {p['script']['step_time_s']:.4f} | "
        f"{p['ratio']:.3f} |"
        for p in result["pairs"]
    )
    m = result["model"]
    (out_dir / "script_overhead.md").write_text(
        f"# Script mode vs entry-point mode\n\n"
        f"`python -m benchmarks.script_overhead --rounds {result['rounds']} --measured "
        f"{result['measured_steps']} --dim {m['dim']} --layers {m['layers']}` ({result['when']}).\n"
        f"Tiny LM (dim {m['dim']}, {m['layers']} layers, vocab {m['vocab']}, seq {m['seq_len']}), "
        f"{result['tokens_per_step']} tokens per step, config {json.dumps(result['config'])}; "
        f"{result['how_measured']}.\n\n"
        f"| round | entry step_time_s | script step_time_s | script / entry |\n"
        f"|---|---|---|---|\n{rows}\n\n"
        f"Median ratio **{result['ratio_median']:.3f}** (min {result['ratio_min']:.3f}, max "
        f"{result['ratio_max']:.3f}); target <= {result['target_ratio']}: "
        f"{'met' if result['meets_target'] else 'NOT met'}.\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="entry/script trial pairs")
    ap.add_argument("--measured", type=int, default=20, help="measured steps per trial")
    ap.add_argument("--dim", type=int, default=64, help="hidden size of the tiny LM")
    ap.add_argument("--layers", type=int, default=2, help="blocks of the tiny LM")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    a = ap.parse_args()
    result = run(a.rounds, a.measured, a.dim, a.layers)
    write(result, Path(a.out))
    print(
        f"median ratio {result['ratio_median']:.3f} (target <= {TARGET_RATIO}); "
        f"results in {a.out}/script_overhead.md"
    )


if __name__ == "__main__":
    main()
