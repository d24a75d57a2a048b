"""Human-readable differences between a contract and its frozen copy (for ``ContractError``s).

``Contract.load`` refuses an edited contract; these helpers say what changed: a field-level diff
against ``.contract.frozen.json`` when it exists, else which top-level sections no longer match
their recorded hashes.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def sha256(text: str) -> str:
    """Hex sha256 of ``text``."""
    return hashlib.sha256(text.encode()).hexdigest()


def canonical(data: Any) -> str:
    """Canonical JSON (sorted keys, no spaces): what the contract hashes cover."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)


def field_diff(old: Any, new: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """Field-level differences between two JSON-like values: (dotted path, old, new)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[tuple[str, Any, Any]] = []
        for k in sorted(set(old) | set(new), key=str):
            p = f"{prefix}.{k}" if prefix else str(k)
            if k not in old:
                out.append((p, "<absent>", new[k]))
            elif k not in new:
                out.append((p, old[k], "<absent>"))
            else:
                out.extend(field_diff(old[k], new[k], p))
        return out
    return [] if old == new else [(prefix or "(root)", old, new)]


def describe_sections(content: dict[str, Any], section_hashes: dict[str, str]) -> str:
    """Which top-level fields of ``content`` no longer match their recorded section hashes."""
    now = {k: sha256(canonical(v))[:16] for k, v in content.items()}
    changed = sorted(
        k for k in set(now) | set(section_hashes) if now.get(k) != section_hashes.get(k)
    )
    where = f"changed section(s): {changed}" if changed else "the section hashes were edited too"
    return f"{where} (the frozen copy .contract.frozen.json is missing, so no field-level diff)"


def describe_diff(frozen: dict[str, Any] | None, now: dict[str, Any]) -> str:
    """The changed fields of ``now`` against the ``frozen`` copy (at most 10 shown)."""
    if frozen is None:
        return ""
    skip = ("contract_hash", "section_hashes")
    old = {k: v for k, v in frozen.items() if k not in skip}
    new = {k: v for k, v in now.items() if k not in skip}
    diffs = field_diff(old, new)
    if not diffs:
        return "no field differs from the frozen copy (only the hash was edited)"
    shown = [f"{p}: frozen {a!r}, now {b!r}" for p, a, b in diffs[:10]]
    more = f" (+{len(diffs) - 10} more)" if len(diffs) > 10 else ""
    return "changed field(s): " + "; ".join(shown) + more
