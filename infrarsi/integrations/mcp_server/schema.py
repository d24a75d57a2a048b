"""JSON schemas of the MCP tools' knob configs, built from the study's search space.

An agent sees, in the tool list alone, which knobs it may set and to what: the ``config`` of
``propose`` and ``predict`` is an object whose properties are the study's editable knobs, each
with its allowed values (``enum`` for a listed knob, ``type``/``minimum``/``maximum`` for a
range), the baseline's value, its ``when`` condition and a description taken from the knob's
handler documentation (``infrarsi.execution.knobs``). Knobs the contract pins are not
properties (``additionalProperties: false``): the config's description names them and their
values instead. Descriptions are plain text (no RST quoting), as agents read them verbatim.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from infrarsi.search.knob import Knob
from infrarsi.search.space import SearchSpace

_RST_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")
_RST_LITERAL = re.compile(r"``([^`]*)``")
_BLANK_LINE = re.compile(r"\n\s*\n")


def plain_text(text: str) -> str:
    """``text`` without RST quoting (````x```` and ``:func:`x``` become ``x``), each paragraph on one line."""
    text = _RST_LITERAL.sub(r"\1", _RST_ROLE.sub(r"\1", text.strip()))
    return "\n\n".join(" ".join(p.split()) for p in _BLANK_LINE.split(text) if p.strip())


def knob_doc(name: str) -> str:
    """The first paragraph of the knob's registered documentation (``register_knob(doc=)``, the
    text docs/KNOBS.md shows), as plain text; "" for a knob with no registration."""
    try:
        from infrarsi.execution.knobs import KNOBS
    except ImportError:  # the execution side is not installed: describe the knob by its values only
        return ""
    spec = KNOBS.get(name)
    return plain_text(spec.doc).split("\n\n")[0] if spec is not None and spec.doc else ""


def knob_schema(knob: Knob, baseline: Any, doc: str = "") -> dict[str, Any]:
    """The JSON schema of one knob's value: its allowed values and a description (``doc``, the
    baseline's value, the memory tag and the ``when`` condition)."""
    schema: dict[str, Any]
    if knob.type == "bool":
        schema = {"type": "boolean"}
    elif knob.is_range:
        schema = {
            "type": "integer" if knob.type == "int" else "number",
            "minimum": knob.lo,
            "maximum": knob.hi,
        }
    else:
        schema = {"enum": list(knob.values)}
        if knob.type == "int":
            schema["type"] = "integer"
    parts = [doc] if doc else []
    parts.append(f"Baseline: {baseline!r}.")
    if knob.memory == "saver":
        parts.append("Memory saver: later values (and true) use less memory.")
    elif knob.memory == "hungry":
        parts.append("Memory hungry: later values use more memory.")
    if knob.when is not None:
        parts.append(
            f"Active only where '{knob.when.text}' holds; elsewhere it stays at {knob.default!r}, "
            f"and a proposal setting it to another value is refused."
        )
    schema["description"] = " ".join(parts)
    schema["default"] = baseline
    return schema


def config_schema(
    space: SearchSpace, editable: Sequence[str], baseline: Mapping[str, Any]
) -> dict[str, Any]:
    """The JSON schema of a config the agent may pass: the editable knobs of ``space`` (every
    knob when ``editable`` names them all) as properties; knobs left out keep the baseline's."""
    free = [k for k in space.knobs if k.name in editable]
    pinned = {k.name: baseline[k.name] for k in space.knobs if k.name not in editable}
    desc = (
        "Knob name -> value; knobs left out keep the baseline's value. The rule between knobs: "
        + ("; ".join(f"'{c.text}'" for c in space.constraints) or "none")
        + "."
    )
    if pinned:
        desc += f" Pinned by the contract (not settable): {pinned}."
    return {
        "type": "object",
        "description": desc,
        "additionalProperties": False,
        "properties": {k.name: knob_schema(k, baseline[k.name], knob_doc(k.name)) for k in free},
    }
