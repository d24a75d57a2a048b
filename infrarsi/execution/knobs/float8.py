"""The ``float8_linear`` knob: the model's large linear layers run their matmuls in float8.

torchao's float8 training (``torchao.float8.convert_to_float8_training``) swaps each chosen
``nn.Linear`` for a ``Float8Linear`` whose forward and backward matmuls cast their inputs to
float8 with one dynamic scale per tensor (e4m3 for activations and weights, e5m2 for gradients)
and run them on the GPU's float8 tensor cores (H100/H200: twice the bf16 rate); the weights,
the optimizer and everything outside those matmuls keep the trial's dtype. torchao reports
+10-25% throughput on 8B-class models (torchtitan); small matmuls can lose to the casts.

It is **another arithmetic**, not the same sums to the dtype's rounding: the knob is registered
``arithmetic="different"``, so a study searches it only when its contract allows it by name
(``infrarsi init --allow float8_linear``). The doctor then runs the baseline with it on and
calibrates the loss and eval tolerances of float8 candidates from that trial
(``Invariants.arithmetic_tolerances``): every other candidate keeps the study's own tolerances.

Which layers: every plain ``nn.Linear`` (a subclass with a ``forward`` of its own keeps it) whose
dimensions are multiples of 16 (``torch._scaled_mm``'s rule), except the output projection
(hidden size in, vocabulary out) and an MoE router (``num_experts`` out), which stay in the
trial's dtype, as torchtitan leaves them; the token dimension is padded to 16 where it is not
(``pad_inner_dim``). The built-in MoE family's experts are batched matmuls, not ``nn.Linear``:
there only attention runs in float8. torchao's casts are separate kernels unless the blocks are
compiled (``compile_block``), which is where its published gains were measured.

Refused at build for ZeRO-3 (DeepSpeed partitions the weights the float8 casts read; untested,
so not offered) and without torchao (``pip install 'infrarsi[gpu]'``). On CUDA it needs compute
capability 8.9 or newer; on the CPU ``torch._scaled_mm`` has a float8 kernel of its own (slow,
for tests: ``tests/execution/knobs/test_float8.py``). Converting patches torchao's Inductor
min/max codegen for the process (numerically the same): later compiled trials of that warm
worker run under it.

In a search space::

    - name: float8_linear
      type: bool
      default: false
"""

from __future__ import annotations

from typing import Any

from infrarsi.errors import KnobError
from infrarsi.execution.knobs.registry import KnobContext, TrialBuild, boolean, register_knob
from infrarsi.knob_names import FLOAT8_LINEAR, ZERO_STAGE

MIN_CUDA_CAPABILITY = (8, 9)
"""The oldest CUDA compute capability with float8 tensor cores (Ada, Hopper and newer)."""
ALIGNMENT = 16
"""``torch._scaled_mm`` needs both dimensions of each matmul to be multiples of 16."""


@register_knob(FLOAT8_LINEAR, values=boolean(), default=False, arithmetic="different")
def float8_linear(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """Runs the model's large linear layers' matmuls in float8 with dynamic per-tensor scales
    (torchao's ``Float8Linear``; the output projection stays in the trial's dtype).

    Another arithmetic: searched only when the contract allows it (``init --allow
    float8_linear``), and the doctor then calibrates the tolerances with it. Refused under ZeRO-3
    and without torchao (the ``gpu`` extra); needs compute capability 8.9+ on CUDA. Adds a model
    transform; no DeepSpeed key."""
    if not value:
        return
    stage = int(ctx.config.get(ZERO_STAGE, 0) or 0)
    if stage == 3:
        raise KnobError(
            f"knob {FLOAT8_LINEAR!r}=true with {ZERO_STAGE}=3: DeepSpeed's ZeRO-3 partitions the "
            f"weights torchao's float8 casts read, a combination infrarsi does not offer. Fix: add "
            f'the constraint "not ({FLOAT8_LINEAR} and {ZERO_STAGE} == 3)" to the search space.'
        )
    _converter()  # torchao is there, or the trial is refused at build
    build.runtime[FLOAT8_LINEAR] = True
    build.model_transforms.append(convert)


def convert(model: Any, shape: Any) -> list[str]:
    """Swap ``model``'s eligible ``nn.Linear`` layers for torchao's ``Float8Linear`` in place and
    return their names. Eligible: a plain ``nn.Linear`` (its ``forward`` not overridden), both
    dimensions multiples of ``ALIGNMENT``, and neither the output projection (``shape.dim`` in,
    ``shape.vocab_size`` out) nor an MoE router (``shape.num_experts`` out).
    ``KnobError`` on a CUDA device older than ``MIN_CUDA_CAPABILITY`` or when nothing is
    eligible (the knob would change nothing)."""
    import torch

    convert_to_float8_training, config_class = _converter()
    device = next((p.device for p in model.parameters() if p.device.type != "meta"), None)
    if device is not None and device.type == "cuda":
        cap = torch.cuda.get_device_capability(device)
        if cap < MIN_CUDA_CAPABILITY:
            raise KnobError(
                f"knob {FLOAT8_LINEAR!r}=true: this GPU has compute capability "
                f"{cap[0]}.{cap[1]}, and float8 matmuls need "
                f"{MIN_CUDA_CAPABILITY[0]}.{MIN_CUDA_CAPABILITY[1]} or newer (H100, H200, L40S). "
                f"Fix: init the study without --allow {FLOAT8_LINEAR} on this cluster."
            )
    chosen: list[str] = []

    head = (int(shape.dim), int(shape.vocab_size))
    router = (int(shape.dim), int(getattr(shape, "num_experts", 0) or 0))

    def eligible(mod: torch.nn.Module, fqn: str) -> bool:
        ok = (
            isinstance(mod, torch.nn.Linear)
            and type(mod).forward is torch.nn.Linear.forward
            and mod.in_features % ALIGNMENT == 0
            and mod.out_features % ALIGNMENT == 0
            and (mod.in_features, mod.out_features) not in (head, router)
        )
        if ok:
            chosen.append(fqn)
        return ok

    convert_to_float8_training(
        model, module_filter_fn=eligible, config=config_class(pad_inner_dim=True)
    )
    if not chosen:
        raise KnobError(
            f"knob {FLOAT8_LINEAR!r}=true: the model has no nn.Linear layer with both dimensions "
            f"multiples of {ALIGNMENT} other than its output projection and router, so float8 "
            f"would change nothing. Fix: init the study without --allow {FLOAT8_LINEAR}."
        )
    return chosen


def _converter() -> tuple[Any, Any]:
    """torchao's ``convert_to_float8_training`` and ``Float8LinearConfig``; ``KnobError`` naming
    the fix without torchao."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as e:
        raise KnobError(
            f"knob {FLOAT8_LINEAR!r}=true needs torchao ({e}). Fix: pip install 'infrarsi[gpu]' "
            f"(or torchao) on every node, or init the study without --allow {FLOAT8_LINEAR}."
        ) from e
    return convert_to_float8_training, Float8LinearConfig
