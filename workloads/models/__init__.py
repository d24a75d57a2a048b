"""Model-family registry: ``MODEL_FAMILIES[family]`` holds the flavour table and the builder.

``build_model(family, size, overrides, options)`` builds the single-device model; parallelism
(expert parallelism) is applied afterwards by the harness, torchtitan style.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from .dense.model import FLAVOURS as DENSE_FLAVOURS
from .dense.model import ModelArgs, Transformer
from .moe.model import FLAVOURS as MOE_FLAVOURS
from .moe.model import build_moe_transformer


@dataclass(frozen=True)
class ModelFamily:
    """One model family."""

    flavours: dict[str, ModelArgs]
    """Flavour name -> architecture."""
    builder: Callable[..., nn.Module]
    """``builder(args, activation_checkpointing=...)`` -> single-device model."""
    is_moe: bool
    """True when the family routes tokens to experts (expert parallelism applies)."""


MODEL_FAMILIES: dict[str, ModelFamily] = {
    "dense": ModelFamily(DENSE_FLAVOURS, lambda a, **kw: Transformer(a, **kw), is_moe=False),
    "moe": ModelFamily(MOE_FLAVOURS, build_moe_transformer, is_moe=True),
}
"""Family name -> flavours and builder."""

BUILD_OPTIONS = ("activation_checkpointing",)
"""Options ``build_model`` understands (others are harness-level, e.g. ``expert_parallel``)."""


def model_args(family: str, size: str, overrides: dict[str, Any] | None = None) -> ModelArgs:
    """The architecture of ``family``/``size`` with ``overrides`` applied."""
    if family not in MODEL_FAMILIES:
        raise KeyError(f"unknown model family {family!r}; valid: {sorted(MODEL_FAMILIES)}")
    fam = MODEL_FAMILIES[family]
    if size not in fam.flavours:
        raise KeyError(f"unknown {family} flavour {size!r}; valid: {sorted(fam.flavours)}")
    return fam.flavours[size].with_overrides(dict(overrides or {}))


def build_model(
    family: str,
    size: str,
    overrides: dict[str, Any] | None = None,
    options: dict[str, Any] | None = None,
) -> nn.Module:
    """Build the single-device model of ``family``/``size``. ``options`` may hold
    ``activation_checkpointing`` (``none`` | ``selective`` | ``full``); other keys are ignored
    here (the harness applies them)."""
    args = model_args(family, size, overrides)
    opts = options or {}
    return MODEL_FAMILIES[family].builder(
        args, activation_checkpointing=opts.get("activation_checkpointing", "none")
    )


__all__ = [
    "BUILD_OPTIONS",
    "MODEL_FAMILIES",
    "ModelArgs",
    "ModelFamily",
    "build_model",
    "model_args",
]
