"""A hypothesis strategy of random valid search spaces (for the search-core tests only)."""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import strategies as st


@st.composite
def fuzz_space(draw: st.DrawFn) -> str:
    """A random search space YAML: every knob kind, memory tags, defaults, ``when`` conditions on
    earlier knobs and constraints that may divide by zero or compare a number with a string."""
    n = draw(st.integers(1, 5))
    knobs: list[dict[str, Any]] = []
    for i in range(n):
        name = f"k{i}"
        kind = draw(
            st.sampled_from(["int", "int_range", "float", "float_range", "bool", "choice", "mixed"])
        )
        entry: dict[str, Any] = {"name": name}
        if kind == "int":
            entry.update(
                type="int",
                values=draw(st.lists(st.integers(-2, 16), min_size=1, max_size=5, unique=True)),
            )
        elif kind == "int_range":
            lo = draw(st.integers(0, 4))
            entry.update(
                type="int",
                range=[lo, lo + draw(st.integers(1, 40))],
                log=lo > 0 and draw(st.booleans()),
            )
        elif kind == "float":
            entry.update(
                type="float",
                values=draw(
                    st.lists(
                        st.sampled_from([0.0, 0.5, 1.0, 2.5, -1.0]),
                        min_size=1,
                        max_size=4,
                        unique=True,
                    )
                ),
            )
        elif kind == "float_range":
            entry.update(
                type="float",
                range=[1e-4, draw(st.sampled_from([1e-3, 1.0, 50.0]))],
                log=draw(st.booleans()),
                grid=draw(st.integers(2, 6)),
            )
        elif kind == "bool":
            entry.update(type="bool")
        elif kind == "choice":
            entry.update(
                type="choice",
                values=draw(
                    st.lists(
                        st.sampled_from(["a", "b", "auto", "none"]),
                        min_size=1,
                        max_size=4,
                        unique=True,
                    )
                ),
            )
        else:  # numbers and strings in one knob, as reduce_bucket_size: [auto, 500000]
            entry.update(
                type="choice",
                values=draw(
                    st.lists(
                        st.sampled_from(["auto", 0, 1, 5, 50]), min_size=2, max_size=4, unique=True
                    )
                ),
            )
        entry["memory"] = draw(st.sampled_from(["neutral", "hungry", "saver"]))
        if i and draw(st.booleans()):
            entry["when"] = _fuzz_expr(draw, knobs[:i])
        if draw(st.integers(0, 3)) == 0 and "values" in entry:
            entry["default"] = draw(st.sampled_from(entry["values"]))
        knobs.append(entry)
    cons = [_fuzz_expr(draw, knobs) for _ in range(draw(st.integers(0, 3)))]
    return yaml.safe_dump({"name": "fuzz", "knobs": knobs, "constraints": cons}, sort_keys=False)


def _fuzz_expr(draw: st.DrawFn, knobs: list[dict[str, Any]]) -> str:
    x = draw(st.sampled_from(knobs))["name"]
    y = draw(st.sampled_from(knobs))["name"]
    c = draw(st.integers(-1, 8))
    return draw(
        st.sampled_from(
            [
                f"{x} >= {c}",
                f"{x} != {c}",
                f"not ({x} == {c} and {y} == {c})",
                f"{c + 8} // {x} >= 1",
                f"{x} % 2 == 0",
                f"{x} in [{c}, 'auto', 'a']",
                f"{x} or {y}",
                f"{x} * {y} <= {c}",
                f"{x} == 'auto'",
                f"{x} < 'b'",
                f"16 % ({x} * {y}) == 0",
                "true",
            ]
        )
    )
