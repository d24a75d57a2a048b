"""Sizes and durations: what parses, and the ``ConfigError`` (exit code 2) for everything else."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from malformed import PROPERTY

from infrarsi.errors import ConfigError
from infrarsi.units import format_bytes, parse_duration, parse_size


def test_sizes_and_durations_with_units() -> None:
    assert (
        parse_size("512MiB") == 512 * 2**20
        and parse_size("80GB") == 80 * 10**9
        and parse_size(4096) == 4096
    )
    assert (
        parse_duration("90s") == 90.0
        and parse_duration("10m") == 600.0
        and parse_duration(2) == 2.0
    )
    assert format_bytes(2**30) == "1.00 GiB"


@pytest.mark.parametrize(
    "text", ["1e400GiB", "1e400", "0", "-5", "lots", "5 parsecs", True, float("inf"), float("nan")]
)
def test_bad_sizes_name_the_flag(text: object) -> None:
    with pytest.raises(ConfigError, match="--memory-capacity"):
        parse_size(text, what="--memory-capacity")  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["1e400s", "0s", "-1m", "soon", False, float("inf"), float("nan")])
def test_bad_durations_name_the_flag(text: object) -> None:
    with pytest.raises(ConfigError, match="--timeout"):
        parse_duration(text, what="--timeout")  # type: ignore[arg-type]


@PROPERTY
@given(
    text=st.one_of(
        st.text(max_size=16),
        st.floats(),
        st.integers(-(10**30), 10**30),
        st.from_regex(r"\A-?[0-9]{0,400}\.?[0-9]{0,3}(e[+-]?[0-9]{1,4})? ?[a-zA-Z]{0,4}\Z"),
    )
)
def test_any_text_is_a_positive_finite_quantity_or_a_config_error(text: object) -> None:
    for parse, what in ((parse_size, "--memory-capacity"), (parse_duration, "--time-budget")):
        try:
            value = parse(text, what=what)  # type: ignore[operator]
        except ConfigError as e:
            assert what in str(e)
        else:
            assert math.isfinite(value) and value > 0


@pytest.mark.parametrize("text", ["160", "2.5", " 7 ", "1e9"])
def test_a_flag_refuses_a_size_without_a_unit(text: str) -> None:
    with pytest.raises(
        ConfigError, match=r"--memory-capacity: .* has no unit.*Fix: --memory-capacity .*MiB\? "
    ):
        parse_size(text, what="--memory-capacity", unit_required=True)
    assert parse_size(text) == int(float(text))  # YAML and the Python API: bytes, as before


def test_a_unit_ful_size_or_a_byte_count_is_taken_where_a_unit_is_required() -> None:
    assert parse_size("160MiB", unit_required=True) == 160 * 2**20
    assert parse_size("80GB", unit_required=True) == 80 * 10**9
    assert parse_size("4096B", unit_required=True) == 4096
    assert parse_size(4096, unit_required=True) == 4096  # numbers are bytes in the Python API
