"""The prior kinds an optimizer's saved state can name, and ``prior_from_spec`` that rebuilds one."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from infrarsi.errors import SearchSpaceError
from infrarsi.search.priors.mean import PriorMean
from infrarsi.search.priors.transformer import TransformerPrior

PRIORS: dict[str, Callable[[dict[str, Any]], PriorMean]] = {
    "transformer": TransformerPrior.from_spec
}
"""Prior kind -> builder from a ``spec()`` dict (a prior defined elsewhere adds its kind here)."""


def prior_from_spec(raw: Mapping[str, Any]) -> PriorMean:
    """Rebuild a prior saved with ``{"kind": ..., **spec}``."""
    kind = str(raw.get("kind"))
    if kind not in PRIORS:
        raise SearchSpaceError(
            f"optimizer state: field 'prior.kind' is {kind!r}; known kinds: {sorted(PRIORS)}."
        )
    return PRIORS[kind](dict(raw))
