"""The built-in model families as training jobs: ``builtin_job`` is the entry point a workload's
``model.family`` stands for, of the same kind as a user's (``infrarsi/job.py``).

``ctx.args`` holds ``family`` (``dense`` | ``moe``), ``size`` (a flavour) and ``overrides``. Data
is the harness's (synthetic, or the workload's token file); the MoE family brings its own
expert parallelism.
"""

from __future__ import annotations

from typing import Any

from infrarsi.job import JobContext, ModelShape, TrainingJob

from . import models
from .models.moe import expert_parallel


def builtin_job(ctx: JobContext) -> TrainingJob:
    """The job of built-in family ``ctx.args["family"]``, flavour ``size``, with ``overrides``."""
    family, size = str(ctx.args["family"]), str(ctx.args.get("size", "debug"))
    overrides: dict[str, Any] = dict(ctx.args.get("overrides") or {})
    args = models.model_args(family, size, overrides)
    options = dict(ctx.options)
    fam = models.MODEL_FAMILIES[family]
    return TrainingJob(
        build_model=lambda: models.build_model(family, size, overrides, options),
        shape=ModelShape(
            n_layers=args.n_layers,
            dim=args.dim,
            vocab_size=args.vocab_size,
            n_heads=args.n_heads,
            num_experts=args.num_experts if fam.is_moe else 0,
            top_k=args.top_k if fam.is_moe else 0,
            expert_hidden=args.expert_hidden if fam.is_moe else 0,
        ),
        fused_loss=_fused_loss,
        expert_parallel=expert_parallel if fam.is_moe else None,  # type: ignore[arg-type]
    )


def _fused_loss(model: Any, inputs: Any, targets: Any, chunk_tokens: int) -> Any:
    """The mean cross-entropy without the logits (the ``fused_loss_tokens`` knob): the model's
    output module fuses the projection and the loss (``models.dense.model.OutputHead``)."""
    return model(inputs, targets=targets, loss_chunk=chunk_tokens)
