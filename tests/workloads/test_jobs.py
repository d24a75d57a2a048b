"""The built-in families as a training job (``workloads.jobs:builtin_job``)."""

from __future__ import annotations

import torch

from infrarsi.execution.job_loader import check_job
from infrarsi.job import JobContext
from workloads.jobs import builtin_job
from workloads.models import build_model


def _ctx(family: str, **options: str) -> JobContext:
    return JobContext(
        args={"family": family, "size": "debug", "overrides": {"n_layers": 2}},
        options=options,
        device="cpu",
        rank=0,
        world_size=1,
        seq_len=32,
    )


def test_builtin_job_builds_the_family_model_with_the_knob_options() -> None:
    job = check_job(
        builtin_job(_ctx("dense", activation_checkpointing="full")), "workloads.jobs:builtin_job"
    )
    torch.manual_seed(0)
    model = job.build_model()
    torch.manual_seed(0)
    same = build_model("dense", "debug", {"n_layers": 2}, {"activation_checkpointing": "full"})
    assert model.checkpointing == "full"
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), same.parameters(), strict=True)
    )
    assert (job.shape.n_layers, job.shape.dim, job.shape.num_experts) == (2, 256, 0)
    logits = job.forward(model, torch.zeros(1, 8, dtype=torch.long))
    assert logits.shape == (1, 8, job.shape.vocab_size)
    assert job.expert_parallel is None and job.global_batch is None


def test_the_moe_family_brings_its_expert_parallelism() -> None:
    job = builtin_job(_ctx("moe"))
    assert job.shape.num_experts == 8 and job.shape.top_k == 2
    assert job.expert_parallel is not None and hasattr(job.expert_parallel, "parallelize_moe")


def test_the_model_and_its_buffers_land_on_the_build_device() -> None:
    """The harness builds inside ``torch.device(...)`` (or zero.Init) and never moves a ZeRO-3
    model: every parameter and buffer must follow the build device (meta stands for a GPU here)."""
    for family in ("dense", "moe"):
        job = builtin_job(_ctx(family))
        with torch.device("meta"):
            model = job.build_model()
        where = {n: t.device.type for n, t in [*model.named_parameters(), *model.named_buffers()]}
        assert set(where.values()) == {"meta"}, {n: d for n, d in where.items() if d != "meta"}
