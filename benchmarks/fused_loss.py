"""Memory and time of the output projection and loss over a 128k vocabulary, plain and fused (``fused_loss_tokens``).

One forward and backward of the mean cross-entropy of the logits ``hidden [tokens, dim] @
weight [128256, dim].T`` (bf16, the 1b flavour's width and Llama 3's vocabulary), each variant in
a fresh process: ``0`` builds the whole logits and takes ``F.cross_entropy(logits.float(),
targets)`` (the harness's plain path), ``N`` is ``fused_linear_cross_entropy`` N tokens at a time
(the logits never whole). Peak memory above the inputs (hidden state, weight, targets):
``ru_maxrss`` growth on CPU, ``torch.cuda.max_memory_allocated`` growth on a GPU; both gradients
(the hidden state's and the weight's) are inside it. Also the loss (the same for every variant,
to fp32 rounding) and the wall time of that one call.

    python -m benchmarks.fused_loss [--tokens 4096] [--chunks 0,1024,4096] [--device cpu|cuda]

writes ``benchmarks/results/fused_loss.md`` and ``.json`` (``--out`` to change the name).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.loss_chunk import peak_bytes

VOCAB = 128256
"""The 1b/8b flavours' vocabulary (Llama 3's)."""
DIM = 2048
"""The 1b flavour's hidden size."""
RESULTS = Path(__file__).resolve().parent / "results"


def one(
    tokens: int, chunk: int, device: str, threads: int, vocab: int, dim: int
) -> dict[str, float]:
    """Measure one variant in this process (called in a fresh subprocess by ``main``)."""
    import torch
    import torch.nn.functional as F

    from infrarsi.execution.knobs.fused_loss import fused_linear_cross_entropy

    torch.set_num_threads(threads)
    g = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn(tokens, dim, generator=g, dtype=torch.bfloat16, device=device)
    weight = torch.randn(vocab, dim, generator=g, dtype=torch.bfloat16, device=device) * 0.02
    hidden.requires_grad_()
    weight.requires_grad_()
    tgt = torch.randint(0, vocab, (tokens,), generator=g, device=device)
    base = peak_bytes(device, reset=True)
    t = time.perf_counter()
    loss = (
        fused_linear_cross_entropy(hidden, weight, tgt, chunk)
        if chunk
        else F.cross_entropy((hidden @ weight.t()).float(), tgt)
    )
    loss.backward()
    peak = peak_bytes(device)
    wall_s = time.perf_counter() - t
    return {
        "fused_loss_tokens": chunk,
        "loss": float(loss.item()),
        "peak_above_inputs_bytes": int(peak - base),
        "logits_bytes": tokens * vocab * 2,
        "wall_s": wall_s,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--chunks", default="0,1024,4096")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=VOCAB)
    ap.add_argument("--dim", type=int, default=DIM)
    ap.add_argument("--out", default="fused_loss")
    ap.add_argument("--results", type=Path, default=RESULTS, help="folder of the outputs")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one is not None:
        print(json.dumps(one(a.tokens, a.one, a.device, a.threads, a.vocab, a.dim)))
        return 0
    rows = []
    for c in (int(x) for x in a.chunks.split(",")):
        cmd = [sys.executable, "-m", "benchmarks.fused_loss", "--one", str(c)]
        for flag in ("tokens", "device", "threads", "vocab", "dim"):
            cmd += [f"--{flag}", str(getattr(a, flag))]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=os.environ.copy())
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    command = "python -m benchmarks.fused_loss " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    meta = {
        "command": command,
        "commit": commit,
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs",
        "load_avg": os.getloadavg()[0],
        "tokens": a.tokens,
        "vocab": a.vocab,
        "dim": a.dim,
        "device": a.device,
        "threads": a.threads,
    }
    a.results.mkdir(parents=True, exist_ok=True)
    (a.results / f"{a.out}.json").write_text(
        json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n"
    )
    mib = 2**20
    how = "`ru_maxrss` growth" if a.device == "cpu" else "`torch.cuda.max_memory_allocated` growth"
    lines = [
        f"# The output projection and loss over a {a.vocab}-token vocabulary, plain and fused",
        "",
        f"`{command}` at commit {commit}, {meta['machine']}, device {a.device}, {a.threads} "
        f"thread(s), load average {meta['load_avg']:.1f} (the times are one call each).",
        f"One forward and backward of the mean cross-entropy of bf16 `hidden [{a.tokens}, {a.dim}] @ "
        f"weight [{a.vocab}, {a.dim}].T` (whole logits: {rows[0]['logits_bytes'] / mib:.0f} MiB), "
        f"each variant in a fresh process. Peak: {how} above the inputs, both gradients included.",
        "",
        "| fused_loss_tokens | loss | peak above inputs (MiB) | x logits | wall (s) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['fused_loss_tokens']} | {r['loss']:.6f} | {r['peak_above_inputs_bytes'] / mib:.0f} | "
            f"{r['peak_above_inputs_bytes'] / r['logits_bytes']:.2f} | {r['wall_s']:.2f} |"
        )
    lines += ["", "`0` builds the whole logits, then `F.cross_entropy(logits.float(), targets)`."]
    (a.results / f"{a.out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
