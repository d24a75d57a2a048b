"""The safe expression grammar of ``when`` and ``constraints`` (parsed with ``ast``, never ``eval``).

Allowed: knob names, ``True``/``False``/``true``/``false``, numbers, strings, lists and tuples
(for ``in``), ``+ - * / // % **``, ``== != < <= > >=``, ``in``/``not in``, ``and``/``or``/``not``
and parentheses. Everything else (calls, attributes, subscripts, lambdas, comprehensions, unknown
names, dunder names) is refused with an ``ExpressionError`` naming the file, the knob and the
expression.
"""

from __future__ import annotations

import ast
import keyword
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from infrarsi.errors import ExpressionError, ExpressionEvaluationError

_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_CMPOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_SEQUENCES = (str, list, tuple)
_LITERAL_NAMES = {"True": True, "False": False, "true": True, "false": False}
_MAX_POW_EXPONENT = 64
_MAX_INT_BITS = 4096
"""An integer power whose result would exceed this many bits is refused (``(10**64)**64**...``)."""
_MAX_TEXT = 1000
_MAX_DEPTH = 100
_ALLOWED = "knob names, numbers, strings, lists, + - * / // % ** == != < <= > >= and or not in, parentheses"


def reserved_name(name: str) -> bool:
    """True for a name no knob may take: a Python keyword (``if``, ``None``...) or a literal of
    the grammar (``true``, ``false``), which an expression could never refer to."""
    return keyword.iskeyword(name) or name in _LITERAL_NAMES


def _where(file: str, knob: str, text: str) -> str:
    return f"{file}: knob '{knob}', expression {text!r}"


@dataclass(frozen=True)
class Expression:
    """A parsed, whitelisted boolean expression over knob values."""

    text: str
    """The expression as written in the YAML."""
    tree: ast.Expression
    """The checked syntax tree."""
    names: frozenset[str]
    """Knob names the expression reads."""
    file: str
    """The YAML file it came from (for error messages)."""
    knob: str
    """The knob (or ``constraints[i]``) it belongs to (for error messages)."""

    @classmethod
    def parse(
        cls, text: object, *, known: set[str] | frozenset[str], file: str, knob: str
    ) -> Expression:
        """Parse and check ``text``; raise ``ExpressionError`` if it leaves the grammar."""
        if isinstance(text, bool) or not isinstance(text, (str, int, float)):
            raise ExpressionError(
                f"{_where(file, knob, str(text))}: rule: an expression must be a string; "
                f'got {type(text).__name__}. Fix: quote it, e.g. "zero_stage >= 1".'
            )
        text = str(text)
        if len(text) > _MAX_TEXT:
            raise ExpressionError(
                f"{_where(file, knob, text[:40] + '...')}: rule: at most {_MAX_TEXT} characters."
            )
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError as exc:
            raise ExpressionError(
                f"{_where(file, knob, text)}: rule: must be valid expression syntax ({exc.msg}). "
                f"Allowed: {_ALLOWED}."
            ) from None
        if _depth(tree.body) > _MAX_DEPTH:
            raise ExpressionError(
                f"{_where(file, knob, text)}: rule: at most {_MAX_DEPTH} levels of nesting "
                f"(operators and parentheses). Fix: split it into several constraints."
            )
        names: set[str] = set()
        _check(tree.body, known, names, file, knob, text)
        return cls(text=text, tree=tree, names=frozenset(names), file=file, knob=knob)

    def evaluate(self, env: Mapping[str, Any]) -> Any:
        """Evaluate against ``env`` (knob name -> value).

        Raises ``ExpressionEvaluationError`` (its ``cause`` the underlying exception's class) when
        the expression cannot be evaluated for these values.
        """
        try:
            return _eval(self.tree.body, env)
        except ExpressionError:
            raise
        except Exception as exc:  # e.g. a type mismatch: 'bf16' < 3, or a division by zero
            raise ExpressionEvaluationError(
                f"{_where(self.file, self.knob, self.text)}: rule: must evaluate without error; "
                f"got {type(exc).__name__}: {exc} with values "
                f"{ {k: env.get(k) for k in sorted(self.names)} }.",
                cause=type(exc),
            ) from None

    def holds(self, env: Mapping[str, Any]) -> bool:
        """True when the expression is truthy under ``env``."""
        return bool(self.evaluate(env))


def _depth(root: ast.AST) -> int:
    """Nesting depth of a syntax tree (iterative: a deep tree must not exhaust the stack here)."""
    deepest, stack = 0, [(root, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        stack.extend((child, d + 1) for child in ast.iter_child_nodes(node))
    return deepest


def _check(
    node: ast.AST,
    known: set[str] | frozenset[str],
    names: set[str],
    file: str,
    knob: str,
    text: str,
) -> None:
    def refuse(what: str) -> ExpressionError:
        return ExpressionError(
            f"{_where(file, knob, text)}: rule: {what} is not allowed in the safe grammar. "
            f"Allowed: {_ALLOWED}."
        )

    if isinstance(node, ast.BoolOp):
        for v in node.values:
            _check(v, known, names, file, knob, text)
    elif isinstance(node, ast.UnaryOp):
        if not isinstance(node.op, (ast.Not, ast.USub, ast.UAdd)):
            raise refuse(f"the operator {type(node.op).__name__}")
        _check(node.operand, known, names, file, knob, text)
    elif isinstance(node, ast.BinOp):
        if type(node.op) not in _BINOPS:
            raise refuse(f"the operator {type(node.op).__name__}")
        _check(node.left, known, names, file, knob, text)
        _check(node.right, known, names, file, knob, text)
    elif isinstance(node, ast.Compare):
        for op in node.ops:
            if type(op) not in _CMPOPS:
                raise refuse(f"the comparison {type(op).__name__}")
        _check(node.left, known, names, file, knob, text)
        for c in node.comparators:
            _check(c, known, names, file, knob, text)
    elif isinstance(node, ast.Name):
        if node.id.startswith("__"):
            raise refuse(f"the name {node.id!r}")
        if node.id in _LITERAL_NAMES:
            return
        if node.id not in known:
            raise ExpressionError(
                f"{_where(file, knob, text)}: rule: names must be knobs of the space; "
                f"{node.id!r} is unknown. Known knobs: {sorted(known)}."
            )
        names.add(node.id)
    elif isinstance(node, ast.Constant):
        if not isinstance(node.value, (int, float, str, bool)) or node.value is None:
            raise refuse(f"the constant {node.value!r}")
    elif isinstance(node, (ast.List, ast.Tuple)):
        for e in node.elts:
            _check(e, known, names, file, knob, text)
    elif isinstance(node, ast.Call):
        raise refuse("a function call")
    elif isinstance(node, ast.Attribute):
        raise refuse("attribute access")
    elif isinstance(node, ast.Subscript):
        raise refuse("subscripting")
    else:
        raise refuse(f"the construct {type(node).__name__}")


def _eval(node: ast.AST, env: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            result: Any = True
            for v in node.values:
                result = _eval(v, env)
                if not result:
                    return result
            return result
        result = False
        for v in node.values:
            result = _eval(v, env)
            if result:
                return result
        return result
    if isinstance(node, ast.UnaryOp):
        operand = _eval(node.operand, env)
        if isinstance(node.op, ast.Not):
            return not operand
        return -operand if isinstance(node.op, ast.USub) else +operand
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, env), _eval(node.right, env)
        if isinstance(node.op, ast.Pow) and isinstance(right, (int, float)):
            if abs(right) > _MAX_POW_EXPONENT:
                raise ValueError(f"exponent {right} exceeds {_MAX_POW_EXPONENT}")
            if isinstance(left, int) and abs(left).bit_length() * abs(right) > _MAX_INT_BITS:
                raise ValueError(f"{left} ** {right} would exceed {_MAX_INT_BITS} bits")
        if isinstance(node.op, ast.Mult) and (
            isinstance(left, _SEQUENCES) or isinstance(right, _SEQUENCES)
        ):
            raise ValueError("string or list repetition is not allowed")
        if isinstance(node.op, ast.Mod) and isinstance(left, str):
            raise ValueError("string formatting with % is not allowed")
        return _BINOPS[type(node.op)](left, right)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env)
        for op, comp in zip(node.ops, node.comparators, strict=True):
            right = _eval(comp, env)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Name):
        if node.id in _LITERAL_NAMES:
            return _LITERAL_NAMES[node.id]
        return env[node.id]
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.List):
        return [_eval(e, env) for e in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_eval(e, env) for e in node.elts)
    raise ValueError(f"unexpected node {type(node).__name__}")  # unreachable after _check
