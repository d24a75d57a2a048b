"""A Hugging Face ``transformers`` causal LM (Llama or Mixtral) as an infrarsi training job.

Use it from a workload YAML (see ``workloads/hf_llama_debug.yaml``)::

    model:
      entry_point: hf_job:make_job
      code_dir: ../examples
      args: {arch: llama, hidden_size: 128, num_hidden_layers: 2, num_attention_heads: 4, vocab_size: 4096}

``ctx.args``: ``arch`` (``llama`` | ``mixtral``), ``attn_implementation`` (default ``sdpa``),
``experts_implementation`` (Mixtral; default: transformers' own choice), and any field of the
architecture's config class (``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
``num_key_value_heads``, ``intermediate_size``, ``vocab_size``, ``max_position_embeddings``,
``num_local_experts``, ``num_experts_per_tok``, ``initializer_range``...); an unknown field is an
error. ``max_position_embeddings`` defaults to the workload's ``data.seq_len``.

The model is built from its config with random weights (nothing is downloaded), in fp32 (the
harness and DeepSpeed cast it for ``bf16``), with ``use_cache=False``. Its weights are drawn
the same, for the same seed, however the harness builds it:

- transformers draws its weights in ``post_init`` over the finished model (``_init_weights``),
  but under ZeRO-3 the harness builds inside ``deepspeed.zero.Init``, which partitions every
  module's parameters as soon as that module's ``__init__`` returns: ``post_init`` would then
  draw into empty partitions and leave the constructors' own draws in place (a different
  distribution, kaiming-uniform, from a whole build's N(0, ``initializer_range``)). So the
  model is constructed under transformers' ``no_init_weights`` (no draw at all), then
  ``init_weights`` runs transformers' own ``_init_weights`` module by module, in one fixed
  order, each module's parameters gathered first when they are ZeRO-3 partitions (every rank
  draws the same values; rank 0's are kept), and always drawn in fp32 (``zero.Init`` builds a
  ``bf16`` trial's parameters in bf16 already).
- on the meta device (``infrarsi init``'s preflight, the eval check's reference model) nothing
  is drawn.

Activation checkpointing (``ctx.options["activation_checkpointing"]``): ``full`` checkpoints
every decoder layer (transformers' own, non-reentrant); ``selective`` checkpoints the attention
sub-layer of every decoder layer (non-reentrant ``torch.utils.checkpoint`` around each
attention module's forward), like the built-in dense family; ``none`` nothing. Either way the
numbers are those of the plain model; only memory and time change.

The ``fused_loss_tokens`` knob works: ``fuse_loss`` lets the model compute the harness's loss in
``lm_head``'s forward a chunk of tokens at a time, the logits never whole (the memory a larger
micro-batch needs; ``infrarsi/execution/knobs/fused_loss.py``).

``forward`` passes the token ids positionally (``model(inputs, use_cache=False).logits``): the
harness counts the tokens it feeds to the model from the first positional argument.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from infrarsi.execution.knobs.fused_loss import fused_linear_cross_entropy
from infrarsi.job import JobContext, ModelShape, TrainingJob

ARCHS = ("llama", "mixtral")
"""The architectures this job builds (``ctx.args["arch"]``)."""
JOB_ARGS = ("arch", "attn_implementation", "experts_implementation")
"""``ctx.args`` keys read by the job itself; every other key is a field of the config class."""


def _classes(arch: str) -> tuple[type[Any], type[nn.Module]]:
    import transformers

    if arch == "llama":
        return transformers.LlamaConfig, transformers.LlamaForCausalLM
    if arch == "mixtral":
        return transformers.MixtralConfig, transformers.MixtralForCausalLM
    raise ValueError(f"model.args.arch must be one of {', '.join(ARCHS)}, got {arch!r}")


def make_config(args: Mapping[str, Any], seq_len: int) -> Any:
    """The transformers config of ``args`` (``arch`` plus config fields), fp32, no KV cache."""
    arch = str(args.get("arch", "llama"))
    config_cls, _ = _classes(arch)
    fields = {k: v for k, v in args.items() if k not in JOB_ARGS}
    known = set(config_cls().to_dict())
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(
            f"model.args: {unknown} are not fields of transformers.{config_cls.__name__} "
            f"(nor one of {', '.join(JOB_ARGS)})"
        )
    fields.setdefault("max_position_embeddings", seq_len)
    if int(fields["max_position_embeddings"]) < seq_len:
        raise ValueError(
            f"model.args.max_position_embeddings ({fields['max_position_embeddings']}) is shorter "
            f"than data.seq_len ({seq_len})"
        )
    fields.update(
        use_cache=False,
        dtype="float32",  # fp32 at build: the harness and DeepSpeed cast for bf16
        attn_implementation=str(args.get("attn_implementation", "sdpa")),
    )
    config = config_cls(**fields)
    if args.get("experts_implementation") is not None:
        config._experts_implementation = str(args["experts_implementation"])
    return config


def model_shape(config: Any) -> ModelShape:
    """The harness's architecture numbers of ``config`` (a Llama or Mixtral config)."""
    experts = int(getattr(config, "num_local_experts", 0) or 0)
    return ModelShape(
        n_layers=int(config.num_hidden_layers),
        dim=int(config.hidden_size),
        vocab_size=int(config.vocab_size),
        n_heads=int(config.num_attention_heads),
        num_experts=experts,
        top_k=int(config.num_experts_per_tok) if experts else 0,
        expert_hidden=int(config.intermediate_size) if experts else 0,
    )


def _no_init_weights() -> contextlib.AbstractContextManager[Any]:
    """transformers' switch that skips every weight draw while a model is constructed."""
    try:
        from transformers.initialization import no_init_weights  # transformers 5
    except ImportError:
        from transformers.modeling_utils import no_init_weights  # type: ignore[attr-defined,no-redef]  # transformers 4
    return no_init_weights()  # type: ignore[no-any-return]


@contextlib.contextmanager
def _arange_keeps_its_dtype() -> Iterator[None]:
    """Inside ``deepspeed.zero.Init``, ``torch.arange`` again returns the dtype it is asked for.
    zero.Init turns every floating tensor its constructors make into the training dtype, and
    transformers computes RoPE's ``inv_freq`` from ``torch.arange(..., dtype=torch.float)``: a
    bf16 ZeRO-3 trial would get bf16 frequencies where ZeRO-0..2 (whose engine casts parameters
    only) keep fp32 ones. (transformers' own ZeRO-3 loader does the same with
    ``prevent_arange_dtype_change``, entered before zero.Init; here zero.Init is already on.)"""
    pp = sys.modules.get("deepspeed.runtime.zero.partition_parameters")
    orig = getattr(pp, "_orig_torch_arange", None)
    if orig is None or torch.arange is orig:
        yield
        return
    patched = torch.arange
    device = torch.empty(0).device  # zero.Init's constructors create on its device: keep that

    def arange(*args: Any, **kwargs: Any) -> torch.Tensor:
        if kwargs.get("device") is None:
            kwargs["device"] = device
        return orig(*args, **kwargs)  # type: ignore[no-any-return]

    torch.arange = arange  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.arange = patched


def _zero3(params: list[nn.Parameter]) -> list[nn.Parameter]:
    return [p for p in params if hasattr(p, "ds_id")]


@contextlib.contextmanager
def _gathered_fp32(params: list[nn.Parameter]) -> Iterator[None]:
    """Inside: ``params`` whole (ZeRO-3 partitions gathered; on exit rank 0's values are
    broadcast and re-partitioned) and in fp32 (a bf16 parameter's data is swapped for an fp32
    copy, rounded back on exit), so a draw gives the values of a whole fp32 build."""
    zero3 = _zero3(params)
    gather: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    if zero3:
        import deepspeed

        gather = deepspeed.zero.GatheredParameters(zero3, modifier_rank=0)
    with gather:
        swapped = [(p, p.data) for p in params if p.dtype != torch.float32]
        for p, data in swapped:
            p.data = torch.empty_like(data, dtype=torch.float32).copy_(data)
        try:
            yield
        finally:
            for p, data in swapped:
                data.copy_(p.data)
                p.data = data


def init_weights(model: nn.Module) -> None:
    """Draw ``model``'s weights with transformers' own ``_init_weights``, module by module in
    post-order (a nested ``PreTrainedModel`` with its own ``_init_weights``, like
    ``PreTrainedModel.initialize_weights``), each module's and its direct children's
    parameters gathered and in fp32 while it is initialised. Nothing is drawn when the
    parameters are on the meta device."""
    from transformers import PreTrainedModel

    if any(p.is_meta for p in model.parameters()):
        return
    custom = bool(getattr(model, "is_remote_code", lambda: False)())

    def visit(module: nn.Module, owner: Any) -> None:
        for child in module.children():
            visit(child, child if isinstance(child, PreTrainedModel) else owner)
        params = list(module.parameters(recurse=False))
        for child in module.children():
            if not isinstance(child, PreTrainedModel):
                params.extend(child.parameters(recurse=False))
        init_one = owner._initialize_weights
        with _gathered_fp32(params):
            if "is_custom_code" in inspect.signature(init_one).parameters:  # transformers 5
                init_one(module, custom)
            else:
                init_one(module)

    with torch.no_grad():
        visit(model, model)


def _checkpoint_attention(model: nn.Module) -> int:
    """Wrap the forward of every decoder layer's ``self_attn`` in non-reentrant
    ``torch.utils.checkpoint`` (while training with autograd on); returns how many."""
    n = 0
    for layer in getattr(getattr(model, "model", model), "layers", []):
        attn = getattr(layer, "self_attn", None)
        if attn is None:
            continue
        inner = attn.forward

        @functools.wraps(inner)
        def forward(
            *args: Any, __inner: Any = inner, __mod: nn.Module = attn, **kwargs: Any
        ) -> Any:
            if __mod.training and torch.is_grad_enabled():
                return checkpoint(__inner, *args, use_reentrant=False, **kwargs)
            return __inner(*args, **kwargs)

        attn.forward = forward
        n += 1
    return n


def apply_checkpointing(model: nn.Module, mode: str) -> None:
    """``full``: every decoder layer (transformers' own, non-reentrant); ``selective``: the
    attention sub-layer of every decoder layer; ``none``: nothing."""
    if mode == "full":
        enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.2x
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )  # type: ignore[operator]
    elif mode == "selective":
        if not _checkpoint_attention(model):
            raise ValueError(
                f"activation_checkpointing 'selective': {type(model).__name__} has no "
                "decoder layers with a self_attn module"
            )
    elif mode != "none":
        raise ValueError(f"activation_checkpointing must be none, selective or full, got {mode!r}")


def fuse_loss(model: nn.Module) -> nn.Module:
    """Give the causal LM ``model`` the fused loss (the ``fused_loss_tokens`` knob), in place.

    Called with ``targets`` (and ``loss_chunk``), ``model`` returns the mean cross-entropy of its
    logits against them, computed by ``fused_linear_cross_entropy`` a chunk of tokens at a time
    in ``lm_head``'s own forward (where ZeRO-3 has gathered its weight), so the logits
    ``[b, s, vocab]`` are never whole; without ``targets`` both forwards are transformers' own.
    Each forward is replaced on the instance, not the class, so parameter names, the config and
    every other method stay transformers'."""
    head = model.lm_head
    if not isinstance(head, nn.Linear) or head.bias is not None:
        raise ValueError(
            f"{type(model).__name__}.lm_head is not a bias-free nn.Linear: the fused loss needs one"
        )
    head_forward, lm_forward, body = head.forward, model.forward, model.model

    def fused_head(
        x: torch.Tensor, targets: torch.Tensor | None = None, loss_chunk: int = 0
    ) -> torch.Tensor:
        if targets is None:
            return head_forward(x)  # type: ignore[no-any-return]
        return fused_linear_cross_entropy(x, head.weight, targets, loss_chunk)

    def forward(
        *args: Any, targets: torch.Tensor | None = None, loss_chunk: int = 0, **kwargs: Any
    ) -> Any:
        if targets is None:
            return lm_forward(*args, **kwargs)
        hidden = body(*args, use_cache=False, **kwargs).last_hidden_state
        return head(hidden, targets, loss_chunk)

    head.forward = fused_head  # type: ignore[method-assign]
    model.forward = forward  # type: ignore[method-assign]
    return model


def fused_loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, chunk: int) -> Any:
    """``TrainingJob.fused_loss``: the harness's mean cross-entropy without the logits whole
    (``fuse_loss``); the ids go positionally, where the harness counts tokens."""
    return model(inputs, targets=targets, loss_chunk=chunk)


def build(config: Any, checkpointing: str = "none") -> nn.Module:
    """The causal LM of ``config``, in place (the caller's device or ``zero.Init`` context),
    weights drawn by ``init_weights`` from the current torch seed."""
    _, model_cls = _classes(str(config.model_type))
    with _arange_keeps_its_dtype():
        with _no_init_weights():
            model = model_cls(config)
        init_weights(model)
    model.tie_weights()  # type: ignore[operator]
    apply_checkpointing(model, checkpointing)
    return fuse_loss(model).train()


def logits(model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """``[b, s, vocab]`` logits; the ids go positionally, where the harness counts tokens."""
    return model(inputs, use_cache=False).logits  # type: ignore[no-any-return]


def make_job(ctx: JobContext) -> TrainingJob:
    """The entry point: a Llama or Mixtral causal LM from ``ctx.args``, with the trial's
    activation checkpointing; data and loss are the harness's."""
    config = make_config(ctx.args, ctx.seq_len)
    mode = str(ctx.options.get("activation_checkpointing", "none"))
    return TrainingJob(
        build_model=lambda: build(config, mode),
        shape=model_shape(config),
        forward=logits,
        fused_loss=fused_loss,
    )
