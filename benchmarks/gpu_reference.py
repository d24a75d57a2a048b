"""Plain-PyTorch reference loop: the dense 1b model trained by hand on one GPU.

The same model code as ``workloads/`` (no DeepSpeed, no Ray, no harness), autocast bf16, fused
AdamW, a given micro-batch, no checkpointing, so the harness's best can be compared with what a
user writes by hand. Prints one JSON line: step_time_s, tokens_per_s, mfu (infrarsi's FLOPs
formula over the device's peak), peak_memory_bytes; ``{"skipped": "no CUDA"}`` without CUDA.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mbs", type=int, default=8, help="micro-batch (sequences)")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--global-batch", type=int, default=16, help="sequences per optimizer step")
    ap.add_argument("--size", default="1b")
    ap.add_argument("--steps", type=int, default=5, help="measured steps (after 2 warm-up steps)")
    a = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        out = {"skipped": "no CUDA"}
        print(json.dumps(out))
        return out
    import torch.nn.functional as F

    from infrarsi.execution.flops import flops_per_token, peak_flops_per_s
    from workloads.models import build_model, model_args

    over = {"max_seq_len": a.seq}
    args = model_args("dense", a.size, over)
    torch.manual_seed(0)
    model = build_model("dense", a.size, over).cuda()
    n = sum(p.numel() for p in model.parameters())
    fpt = flops_per_token(args, n, a.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    tokens = torch.randint(0, args.vocab_size, (a.global_batch, a.seq + 1), device="cuda")
    gas = a.global_batch // a.mbs

    def step() -> None:
        for i in range(gas):
            x = tokens[i * a.mbs : (i + 1) * a.mbs, :-1]
            y = tokens[i * a.mbs : (i + 1) * a.mbs, 1:]
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(x)
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1)) / gas
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    times = []
    for s in range(2 + a.steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        if s >= 2:
            times.append(time.perf_counter() - t)
    med = statistics.median(times)
    tps = a.global_batch * a.seq / med
    peak = peak_flops_per_s("cuda")
    out = {
        "what": "plain torch, autocast bf16, fused AdamW, no checkpointing",
        "device": torch.cuda.get_device_name(),
        "mbs": a.mbs,
        "params": n,
        "step_time_s": med,
        "tokens_per_s": tps,
        "mfu": fpt * tps / peak,
        "peak_flops_per_s": peak,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(),
    }
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
