"""Time and host memory of the end-of-trial checks (checksum and eval) on one rank, for a model size.

    .venv/bin/python -m benchmarks.end_checks [--size debug|big] [--zero-stage 0] [--repeats 2]

One process, a gloo world of 1, DeepSpeed fp32 at the given ZeRO stage, one torch thread. ``big``
is the dense family widened to 97.5M parameters (dim 768, 12 layers, vocab 8192). For each repeat
it prints the wall seconds of ``build_reference`` + ``checksum_and_load`` + ``eval_loss`` and the
peak host allocation above the start (glibc ``mallinfo2``, polled every 2 ms), which the
host-memory bound in ``infrarsi/execution/end_checks.py`` is about. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BIG = {"dim": 768, "n_layers": 12, "n_heads": 12, "vocab_size": 8192, "ffn_hidden": 2048}
"""The ``big`` flavour's overrides of the dense debug model."""


def peak_during(fn: Callable[[], Any]) -> tuple[Any, float, int]:
    """``fn()``'s result, its wall seconds and the peak host bytes allocated above the start."""
    from infrarsi.execution.memory import malloc_in_use_bytes

    base, peak, stop = malloc_in_use_bytes(), [0], threading.Event()

    def poll() -> None:
        while not stop.wait(0.002):
            peak[0] = max(peak[0], malloc_in_use_bytes() - base)

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    t0 = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t0
    stop.set()
    th.join()
    return out, dt, peak[0]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=("debug", "big"), default="big")
    ap.add_argument("--zero-stage", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--port", default="29533")
    args = ap.parse_args(argv)
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=args.port, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"
    )
    import deepspeed
    import torch
    import torch.distributed as dist

    from infrarsi.execution import end_checks
    from infrarsi.workload import Workload

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)
    deepspeed.init_distributed(dist_backend="gloo", dist_init_required=False)
    raw = Workload.from_yaml(ROOT / "workloads" / "dense_debug.yaml").to_yaml_dict()
    if args.size == "big":
        raw["model"]["overrides"] = dict(BIG)
    wl = Workload.from_dict(raw)
    from infrarsi.execution.data_sources import MarkovSource
    from workloads import models

    torch.manual_seed(0)
    model = models.build_model(wl.model.family, wl.model.size, wl.model.overrides, {})
    n = sum(p.numel() for p in model.parameters())
    cfg = {
        "train_batch_size": 1,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": args.zero_stage},
    }
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), config=cfg
    )
    margs = models.model_args(wl.model.family, wl.model.size, wl.model.overrides)

    def checks() -> tuple[float, float]:
        r = end_checks.build_reference(
            lambda: models.build_model(wl.model.family, wl.model.size, wl.model.overrides, {}),
            engine.device,
        )
        c = end_checks.checksum_and_load(model, None, r, engine.device)
        batch = MarkovSource(margs.vocab_size, wl.data.seq_len, wl.data.seed).eval_batch()
        return c, end_checks.eval_loss(r, batch, engine.device, margs.vocab_size)

    for i in range(args.repeats):
        (c, e), dt, peak = peak_during(checks)
        print(
            f"{args.size} zero{args.zero_stage} params={n / 1e6:.1f}M ({n * 4 / 2**20:.0f} MiB fp32) "
            f"repeat {i}: end_checks_s={dt:.3f} peak_host_bytes=+{peak / 2**20:.0f} MiB "
            f"checksum={c!r} eval_loss={e!r}",
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
