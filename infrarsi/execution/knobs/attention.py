"""The ``attention_backend`` knob: which kernel ``F.scaled_dot_product_attention`` runs.

PyTorch's SDPA dispatches to one of several kernels (FlashAttention-2, memory-efficient
attention, cuDNN's fused attention, or the plain math composition) by its own heuristics; on an
H100 the cuDNN backend can be much faster than FlashAttention-2 (PyTorch 2.5 release notes), and
the heuristic does not always pick the fastest one for a given shape. This knob pins the choice
for the whole trial with ``torch.nn.attention.sdpa_kernel``, so every job whose attention calls
``F.scaled_dot_product_attention`` is covered without a code change: the built-in dense and MoE
families, and Hugging Face models built with ``attn_implementation="sdpa"`` (transformers'
default), which is how ``examples/hf_job.py`` builds them.

Values: ``auto`` (the default: PyTorch's own choice), ``flash``, ``efficient``, ``cudnn`` and
``math``. Each kernel computes the same attention to the dtype's rounding (the equivalence test
in ``tests/execution/knobs/test_attention.py`` compares losses and gradients on the CPU, where
``flash`` and ``math`` exist); the loss invariant judges each trial as always. ``efficient`` and
``cudnn`` exist only on CUDA: a CPU trial asking for them is refused when it is built. A kernel
that cannot run the trial's shapes or dtype (FlashAttention in fp32 on a GPU, say) makes
PyTorch raise "No available kernel", and the trial ends ``failed`` with that message.

The choice holds from the engine's build to the trial's end (``rank_loop`` enters the
context for the trial, so activation checkpointing's recomputation in backward runs the same
kernel) and is restored afterwards, so a warm worker's next trial starts from PyTorch's defaults.

In a search space::

    - name: attention_backend
      type: choice
      values: [auto, flash, cudnn, efficient]
"""

from __future__ import annotations

import contextlib
from typing import Any, Literal

from infrarsi.errors import KnobError
from infrarsi.execution.knobs.registry import KnobContext, TrialBuild, one_of, register_knob
from infrarsi.knob_names import ATTENTION_BACKEND

AttentionBackend = Literal["auto", "flash", "efficient", "cudnn", "math"]
"""A value of the knob: ``auto`` leaves PyTorch's dispatch alone; the others pin one kernel."""
ATTENTION_BACKENDS: tuple[AttentionBackend, ...] = ("auto", "flash", "efficient", "cudnn", "math")
"""Every value the knob accepts."""
CUDA_ONLY: frozenset[str] = frozenset({"efficient", "cudnn"})
"""Backends PyTorch has only on CUDA."""


@register_knob(ATTENTION_BACKEND, values=one_of(*ATTENTION_BACKENDS), default="auto")
def attention_backend(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """The kernel ``F.scaled_dot_product_attention`` runs for the whole trial (``auto``:
    PyTorch's own dispatch; ``flash``, ``efficient``, ``cudnn`` or ``math`` pin one).

    Covers every job whose attention calls SDPA (the built-in families, Hugging Face models with
    ``attn_implementation="sdpa"``); the same attention to the dtype's rounding, which the loss
    invariant judges. ``efficient`` and ``cudnn`` are CUDA-only. Sets runtime
    ``attention_backend``; no DeepSpeed key."""
    name = str(value)
    if ctx.device != "cuda" and name in CUDA_ONLY:
        raise KnobError(
            f"knob {ATTENTION_BACKEND!r}={name!r}: PyTorch has the {name} attention kernel only on "
            f"CUDA, and this trial runs on {ctx.device!r}. Fix: offer only auto, flash or math in a "
            f"search space for {ctx.device} workloads."
        )
    build.runtime[ATTENTION_BACKEND] = name


def backend_context(name: str) -> contextlib.AbstractContextManager[Any]:
    """A context in which SDPA runs only the ``name`` kernel (a null context for ``auto``)."""
    if name == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kernel = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }[name]
    return sdpa_kernel([kernel])


__all__ = [
    "ATTENTION_BACKENDS",
    "CUDA_ONLY",
    "AttentionBackend",
    "attention_backend",
    "backend_context",
]
