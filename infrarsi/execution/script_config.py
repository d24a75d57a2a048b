"""A script's own DeepSpeed config, and the trial's knobs merged into it.

A user's script (``script:`` in the workload YAML) hands ``deepspeed.initialize`` its config as
``config=`` (a dict or a JSON path), ``config_params=`` (DeepSpeed's older name) or
``args.deepspeed_config`` (the ``--deepspeed_config ds.json`` of DeepSpeed's
``add_config_arguments``). ``script_ds_config`` reads it, whichever way it came.

``merge_trial_config(script, trial, knobs, ...)`` is the config the engine is really built from:

- the batch keys (``train_batch_size``, ``train_micro_batch_size_per_gpu``,
  ``gradient_accumulation_steps``) are the trial's: the contract fixes tokens per step, the
  ``micro_batch_size`` knob splits them;
- every ZeRO key a knob owns (``ZERO_KNOB_KEYS``: stage, offload, overlap, buckets, the stage-3
  limits) is the trial's; the script's other ZeRO keys stay;
- with the ``dtype`` knob in the search space, ``bf16``/``fp16`` are the trial's;
- the script's other keys stay (its optimizer block, gradient clipping, scheduler...);
- a client optimizer under ZeRO needs ``zero_allow_untested_optimizer`` (set true), and keeps
  the script's optimizer under offload (``zero_force_ds_cpu_optimizer`` false);
- ``"auto"`` (Hugging Face's placeholder) is resolved where the harness knows the value
  (``resolve_auto``); any other ``"auto"`` is an error naming the key.

``SCRIPT_PINNED`` lists the knobs that cannot reach a script (they change the model build or the
harness's own optimizer/loss, which a script owns), with the reason; ``init`` pins them at the
baseline and says so.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from infrarsi.errors import WorkloadError
from infrarsi.execution.knobs.deepspeed import auto_bucket_elements

BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
"""Top-level keys the contract and the ``micro_batch_size`` knob own."""

ZERO_KNOB_KEYS = (
    "stage",
    "offload_optimizer",
    "offload_param",
    "overlap_comm",
    "reduce_bucket_size",
    "allgather_bucket_size",
    "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold",
    "stage3_max_live_parameters",
    "stage3_max_reuse_distance",
)
"""``zero_optimization`` keys the built-in knob handlers own (``knobs/deepspeed.py``)."""

SCRIPT_PINNED: dict[str, str] = {
    "activation_checkpointing": "the script builds its own model; the harness cannot wrap its blocks",
    "optimizer_impl": "the script builds (or configures) its own optimizer",
    "expert_parallel": "the script builds its own model and experts",
    "loss_chunk_tokens": "the script computes its own loss",
    "fused_loss_tokens": "the script computes its own loss",
    "attention_backend": "the script runs its attention in its own process, outside the harness's context",
    "float8_linear": "the script builds its own model; the harness cannot swap its linear layers",
}
"""Knob -> why it cannot reach a script: such knobs are pinned at the baseline (``init``)."""


def pinned_knobs(knob_names: list[str]) -> dict[str, str]:
    """The knobs of ``knob_names`` a script run cannot honour, with the reason."""
    return {k: SCRIPT_PINNED[k] for k in knob_names if k in SCRIPT_PINNED}


def script_ds_config(
    args: Any, config: Any, config_params: Any, *, cwd: str | Path = "."
) -> dict[str, Any]:
    """The script's DeepSpeed config as a fresh dict: ``config``, else ``config_params``, else
    ``args.deepspeed_config`` (or the deprecated ``args.deepscale_config``); a JSON path is read
    relative to ``cwd``. Raises ``WorkloadError`` when there is none or it is not JSON."""
    cfg = config if config is not None else config_params
    from_args = getattr(args, "deepspeed_config", None) or getattr(args, "deepscale_config", None)
    if cfg is not None and from_args is not None:
        raise WorkloadError(
            "script: deepspeed.initialize got a config both in config= and in "
            "args.deepspeed_config; DeepSpeed refuses that too. Fix: pass one of them"
        )
    cfg = cfg if cfg is not None else from_args
    if cfg is None:
        raise WorkloadError(
            "script: deepspeed.initialize got no DeepSpeed config (no config=, no "
            "--deepspeed_config). Fix: add --deepspeed_config ds.json to script.args"
        )
    if isinstance(cfg, dict):
        return copy.deepcopy(cfg)
    path = Path(str(cfg))
    if not path.is_absolute():
        path = Path(cwd) / path
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise WorkloadError(
            f"script: the DeepSpeed config {str(cfg)!r} ({path}) cannot be read as JSON: {e}. "
            f"Fix the path in script.args (relative to the workload YAML's folder)"
        ) from None
    if not isinstance(data, dict):
        raise WorkloadError(
            f"script: the DeepSpeed config {path} must hold a JSON object, got {type(data).__name__}"
        )
    return data


def merge_trial_config(
    script: dict[str, Any],
    trial: dict[str, Any],
    knobs: list[str],
    *,
    num_params: int,
    hidden_size: int,
    client_optimizer: bool,
) -> dict[str, Any]:
    """The script's config with the trial's knob keys in (see the module docstring).

    ``script``: the script's own config; ``trial``: ``build_trial(...).ds_config``; ``knobs``: the
    knob names of the trial's config; ``client_optimizer``: the script passed ``optimizer=``."""
    out = merge_trial_keys(script, trial, knobs, client_optimizer=client_optimizer)
    return resolve_auto(out, num_params=num_params, hidden_size=hidden_size)


def merge_trial_keys(
    script: dict[str, Any], trial: dict[str, Any], knobs: list[str], *, client_optimizer: bool
) -> dict[str, Any]:
    """``merge_trial_config`` before ``resolve_auto``: the script's ``"auto"`` values stay (what
    ``apply`` writes into a Trainer script's config, whose ``"auto"`` transformers resolves)."""
    out = copy.deepcopy(script)
    for key in BATCH_KEYS:
        out[key] = trial[key]
    zero = dict(out.get("zero_optimization") or {})
    for key in ZERO_KNOB_KEYS:
        zero.pop(key, None)
    zero.update(copy.deepcopy(trial.get("zero_optimization") or {}))
    out["zero_optimization"] = zero
    if "dtype" in knobs:
        out.pop("fp16", None)
        out.pop("bf16", None)
        if "bf16" in trial:
            out["bf16"] = copy.deepcopy(trial["bf16"])
    if client_optimizer:
        out["zero_allow_untested_optimizer"] = True
        if zero.get("offload_optimizer"):
            out["zero_force_ds_cpu_optimizer"] = False
    return out


def trial_keys(engine: dict[str, Any], knobs: list[str]) -> dict[str, Any]:
    """The keys of an engine config (``merge_trial_config``'s output, as a trial logs it) that the
    trial's knobs own: the batch keys, the ``ZERO_KNOB_KEYS`` and, with ``dtype`` among ``knobs``,
    ``bf16``. Merged into the script's own config again they give that engine config back
    (``apply`` writes the winner this way)."""
    zero = engine.get("zero_optimization") or {}
    out: dict[str, Any] = {key: engine[key] for key in BATCH_KEYS}
    out["zero_optimization"] = {k: copy.deepcopy(v) for k, v in zero.items() if k in ZERO_KNOB_KEYS}
    if "dtype" in knobs and "bf16" in engine:
        out["bf16"] = copy.deepcopy(engine["bf16"])
    return out


def resolve_auto(cfg: dict[str, Any], *, num_params: int, hidden_size: int) -> dict[str, Any]:
    """``cfg`` with every ``"auto"`` replaced: bucket sizes as the knobs' ``auto``
    (``auto_bucket_elements``), the ZeRO-3 limits as the ``zero_stage`` knob sets them,
    ``enabled: "auto"`` (fp16/bf16 without a Hugging Face flag) false. Any other ``"auto"`` raises
    ``WorkloadError`` naming the key."""
    n = max(int(num_params), 1)
    known = {
        "reduce_bucket_size": auto_bucket_elements(n),
        "allgather_bucket_size": auto_bucket_elements(n),
        "stage3_prefetch_bucket_size": min(50_000_000, n),
        "stage3_param_persistence_threshold": 10 * max(int(hidden_size), 1),
        "stage3_max_live_parameters": min(1_000_000_000, n),
        "stage3_max_reuse_distance": min(1_000_000_000, n),
        "enabled": False,
    }

    def walk(node: Any, where: str) -> Any:
        if isinstance(node, dict):
            return {k: walk(v, f"{where}.{k}" if where else str(k)) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, f"{where}[{i}]") for i, v in enumerate(node)]
        if node == "auto":
            leaf = where.rsplit(".", 1)[-1]
            if leaf not in known:
                raise WorkloadError(
                    f"script: DeepSpeed config key {where!r} is 'auto', which only Hugging Face's "
                    f"Trainer resolves and infrarsi does not know for it. Fix: set a value in "
                    f"your DeepSpeed config"
                )
            return known[leaf]
        return node

    return walk(cfg, "")  # type: ignore[no-any-return]


__all__ = [
    "BATCH_KEYS",
    "SCRIPT_PINNED",
    "ZERO_KNOB_KEYS",
    "merge_trial_config",
    "merge_trial_keys",
    "pinned_knobs",
    "resolve_auto",
    "script_ds_config",
    "trial_keys",
]
