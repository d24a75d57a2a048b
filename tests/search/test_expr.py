"""The safe expression grammar of `when` and `constraints`."""

from __future__ import annotations

import pytest

from infrarsi.errors import ExpressionError, ExpressionEvaluationError
from infrarsi.search.expr import Expression, reserved_name

KNOWN = frozenset({"zero_stage", "dtype", "mbs", "offload"})


def parse(text: str) -> Expression:
    return Expression.parse(text, known=KNOWN, file="space.yaml", knob="offload")


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("zero_stage >= 1", {"zero_stage": 0}, False),
        ("zero_stage >= 1", {"zero_stage": 2}, True),
        ("pp == 1 or zero_stage <= 1".replace("pp", "mbs"), {"mbs": 2, "zero_stage": 3}, False),
        (
            "not (offload and dtype == 'bf16' and zero_stage == 0)",
            {"offload": True, "dtype": "bf16", "zero_stage": 0},
            False,
        ),
        ("dtype in ['bf16', 'fp16']", {"dtype": "fp32"}, False),
        ("dtype not in ('bf16', 'fp16')", {"dtype": "fp32"}, True),
        ("mbs * 2 ** 3 // 4 % 5 - 1 + 7 / 7 == 4", {"mbs": 2}, True),
        ("-mbs < 0 and +mbs > 0", {"mbs": 1}, True),
        ("1 < mbs < 4", {"mbs": 2}, True),
        ("offload == true", {"offload": True}, True),
    ],
)
def test_grammar_evaluates(text: str, env: dict, expected: bool) -> None:
    assert parse(text).holds(env) is expected


def test_names_are_collected() -> None:
    assert parse("zero_stage >= 1 and dtype == 'bf16'").names == {"zero_stage", "dtype"}


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("__import__('os')", "function call"),
        ("__import__", "'__import__'"),
        ("dtype.upper() == 'BF16'", "function call"),
        ("zero_stage.real > 1", "attribute access"),
        ("len(dtype) > 1", "function call"),
        ("dtype[0] == 'b'", "subscripting"),
        ("(lambda: 1)() == 1", "function call"),
        ("[x for x in dtype]", "ListComp"),
        ("pipeline_stages > 1", "'pipeline_stages' is unknown"),
        ("zero_stage := 3", "valid expression syntax"),
        ("{'a': 1} == dtype", "Dict"),
        ("mbs if dtype else 1", "IfExp"),
        ("zero_stage is None", "comparison Is"),
        ("mbs & 1", "operator BitAnd"),
    ],
)
def test_refused_constructs_name_file_knob_and_expression(text: str, rule: str) -> None:
    with pytest.raises(ExpressionError) as info:
        parse(text)
    msg = str(info.value)
    assert "space.yaml" in msg
    assert "knob 'offload'" in msg
    assert repr(text) in msg
    assert rule in msg


def test_runtime_type_error_is_an_expression_error() -> None:
    expr = parse("dtype > 3")
    with pytest.raises(ExpressionError, match="must evaluate without error"):
        expr.holds({"dtype": "bf16"})


def test_huge_power_is_refused_at_evaluation() -> None:
    with pytest.raises(ExpressionError, match="exponent"):
        parse("mbs ** 1000000 > 1").holds({"mbs": 10})


def test_non_string_expression_is_refused() -> None:
    with pytest.raises(ExpressionError, match="must be a string"):
        Expression.parse(["zero_stage"], known=KNOWN, file="f.yaml", knob="k")


@pytest.mark.parametrize(
    ("text", "env", "rule"),
    [
        ("[mbs] * 1000000000 == []", {"mbs": 1}, "repetition"),
        ("mbs * 'x' == ''", {"mbs": 10**9}, "repetition"),
        ("'%999999999d' % mbs == ''", {"mbs": 1}, "formatting"),
        ("((mbs ** 64) ** 64) ** 64 > 1", {"mbs": 10**6}, "bits"),
    ],
)
def test_runaway_values_are_refused_at_evaluation(text: str, env: dict, rule: str) -> None:
    """Repetition, %-formatting and huge integer powers would take the memory or the time of
    the machine; they cannot be evaluated, so the constraint counts as violated."""
    with pytest.raises(ExpressionError, match=rule):
        parse(text).holds(env)


def test_deep_nesting_is_refused_at_parse_time() -> None:
    with pytest.raises(ExpressionError, match="levels of nesting"):
        parse("-" * 500 + "mbs")
    assert parse("zero_stage >= 1 and (mbs == 2 or mbs in [1, 2, 4])").names == {
        "zero_stage",
        "mbs",
    }


def test_an_evaluation_error_carries_its_cause() -> None:
    with pytest.raises(ExpressionEvaluationError) as e:
        parse("4 // mbs > 1").holds({"mbs": 0})
    assert e.value.cause is ZeroDivisionError


@pytest.mark.parametrize("name", ["if", "None", "True", "true", "false", "lambda"])
def test_reserved_names(name: str) -> None:
    assert reserved_name(name)
    assert not reserved_name("zero_stage")
