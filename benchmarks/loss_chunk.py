"""Memory and time of the harness's loss over a 128k vocabulary, plain and chunked (``loss_chunk_tokens``).

One forward and backward of the harness's mean cross-entropy over bf16 logits ``[tokens,
128256]`` (the 1b/8b flavours' vocabulary), each variant in a fresh process: the plain
``F.cross_entropy(logits.float(), targets)`` (``loss_chunk_tokens: 0``) and
``chunked_cross_entropy`` at each chunk size. Peak memory above the logits and targets:
``ru_maxrss`` growth on CPU, ``torch.cuda.max_memory_allocated`` growth on a GPU. Also reports the
loss (the same for every variant, to fp32 rounding) and the wall time of that one call.

    python -m benchmarks.loss_chunk [--tokens 2048] [--chunks 0,512,1024] [--device cpu|cuda]

writes ``benchmarks/results/loss_chunk.md`` and ``.json`` (``--out`` to change the name).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

VOCAB = 128256
"""The 1b/8b flavours' vocabulary (Llama 3's)."""
RESULTS = Path(__file__).resolve().parent / "results"


def peak_bytes(device: str, *, reset: bool = False) -> int:
    """The process's peak memory so far, after the device's queued work: ``ru_maxrss`` on CPU,
    ``torch.cuda.max_memory_allocated`` on a GPU (``reset``: its peak restarted here first)."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
        if reset:
            torch.cuda.reset_peak_memory_stats()
        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def one(tokens: int, chunk: int, device: str, threads: int) -> dict[str, float]:
    """Measure one variant in this process (called in a fresh subprocess by ``main``)."""
    import torch
    import torch.nn.functional as F

    from infrarsi.execution.knobs.loss_chunk import chunked_cross_entropy

    torch.set_num_threads(threads)
    g = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(
        tokens, VOCAB, generator=g, dtype=torch.bfloat16, device=device
    ).requires_grad_()
    tgt = torch.randint(0, VOCAB, (tokens,), generator=g, device=device)
    base = peak_bytes(device, reset=True)
    t = time.perf_counter()
    loss = (
        chunked_cross_entropy(logits, tgt, chunk) if chunk else F.cross_entropy(logits.float(), tgt)
    )
    loss.backward()
    peak = peak_bytes(device)
    wall_s = time.perf_counter() - t
    return {
        "loss_chunk_tokens": chunk,
        "loss": float(loss.item()),
        "peak_above_inputs_bytes": int(peak - base),
        "logits_bytes": logits.numel() * 2,
        "wall_s": wall_s,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--chunks", default="0,512,1024")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="loss_chunk")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one is not None:
        print(json.dumps(one(a.tokens, a.one, a.device, a.threads)))
        return 0
    rows = []
    for c in (int(x) for x in a.chunks.split(",")):
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.loss_chunk",
                "--one",
                str(c),
                "--tokens",
                str(a.tokens),
                "--device",
                a.device,
                "--threads",
                str(a.threads),
            ],
            capture_output=True,
            text=True,
            check=True,
            env=os.environ.copy(),
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    meta = {
        "command": "python -m benchmarks.loss_chunk "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": commit,
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs",
        "load_avg": os.getloadavg()[0],
        "tokens": a.tokens,
        "vocab": VOCAB,
        "device": a.device,
        "threads": a.threads,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{a.out}.json").write_text(
        json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n"
    )
    mib = 2**20
    lines = [
        f"# The harness's loss over a {VOCAB}-token vocabulary, plain and chunked",
        "",
        f"`{meta['command']}` at commit {commit}, {meta['machine']}, device {a.device}, {a.threads} thread(s), "
        f"load average {meta['load_avg']:.1f} (a shared machine: the times are one call each, under that load).",
        f"One forward and backward of the mean cross-entropy over bf16 logits [{a.tokens}, {VOCAB}] "
        f"({rows[0]['logits_bytes'] / mib:.0f} MiB), each variant in a fresh process. Peak: "
        + (
            "`ru_maxrss` growth"
            if a.device == "cpu"
            else "`torch.cuda.max_memory_allocated` growth"
        )
        + " above the logits and targets (the gradient buffer of the logits included).",
        "",
        "| loss_chunk_tokens | loss | peak above inputs (MiB) | x logits | wall (s) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['loss_chunk_tokens']} | {r['loss']:.6f} | {r['peak_above_inputs_bytes'] / mib:.0f} | "
            f"{r['peak_above_inputs_bytes'] / r['logits_bytes']:.2f} | {r['wall_s']:.2f} |"
        )
    lines.append("")
    lines.append(
        "`0` is the plain `F.cross_entropy(logits.float(), targets)`; a chunk at least the token "
        "count is the same call."
    )
    (RESULTS / f"{a.out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
