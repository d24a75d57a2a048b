"""Hypothesis strategies of malformed input, for the property-based bad-input tests: junk values
of every YAML type, and a YAML mapping with one part replaced by junk."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**20),
    st.floats(),
    st.text(max_size=12),
    st.lists(
        st.one_of(st.integers(-3, 9), st.text(max_size=3), st.none(), st.floats()), max_size=4
    ),
    st.dictionaries(st.one_of(st.text(max_size=4), st.integers(0, 3)), st.integers(), max_size=2),
    st.dates(),
    st.binary(max_size=3),
    st.sampled_from(
        [
            "",
            "1/0 > 0",
            "stage.real",
            "stage >",
            "__import__('os')",
            "stage ** 99 ** 99 > 1",
            "[stage] * 10**9 == []",
            "'%999999999d' % 1 == ''",
            "stage < 'x'",
            "nope == 1",
            "lambda: 1",
            "mbs % 0 == 0",
            "stage",
            "if",
            "true",
            "-" * 300 + "stage",
            "stage in 3",
            "-5",
            "1e400GiB",
            "../../etc/passwd",
            "/abs/path.yaml",
        ]
    ),
)
"""A junk YAML value: every scalar type, lists, mappings (non-string keys too), dates, bytes,
and strings that break the expression grammar, sizes and paths."""

PROPERTY = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
"""A few seconds per property; derandomized, so the suite is reproducible."""


@st.composite
def mutated(
    draw: st.DrawFn, base: dict[str, Any], nested: dict[str, list[str]], list_key: str | None = None
) -> Any:
    """``base`` (a parsed YAML mapping) with one part broken: a top-level field, a field of a
    nested mapping (``nested``: section -> its fields), an entry of the list ``list_key``
    replaced or duplicated, a field deleted, an unknown field added, or the whole document junk."""
    raw = copy.deepcopy(base)
    kinds = ["top", "nested", "delete", "document"] + (["entry", "duplicate"] if list_key else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "top":
        raw[draw(st.sampled_from([*base, "unknown_field", 7]))] = draw(JUNK)
    elif kind == "nested":
        section = draw(st.sampled_from(sorted(nested)))
        target = raw[section]
        if isinstance(target, list):
            target = target[draw(st.integers(0, len(target) - 1))]
        target[draw(st.sampled_from([*nested[section], "bogus", 3]))] = draw(JUNK)
    elif kind == "delete":
        del raw[draw(st.sampled_from(sorted(base)))]
    elif kind == "entry":
        assert list_key is not None
        raw[list_key][draw(st.integers(0, len(raw[list_key]) - 1))] = draw(JUNK)
    elif kind == "duplicate":
        assert list_key is not None
        raw[list_key].append(copy.deepcopy(draw(st.sampled_from(raw[list_key]))))
    else:
        return draw(JUNK)
    return raw


def refused(res: Any, *needles: str) -> None:
    """A CLI result (typer's ``CliRunner``) that exited 2 with each needle in its output and no
    traceback: the bad input was handled and explained."""
    out = res.output.replace("\n", "")
    assert res.exit_code == 2, res.output
    assert isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in out
    for n in needles:
        assert n in out, (n, res.output)
