"""``read_json_record``: parse a study's JSON file into its typed record, or a ``StudyError``.

``doctor.json`` and ``verify.json`` are read the same way: the file must be JSON, an object, and
valid for its pydantic model; each failure names the file, the field, the rule, the value and the
fix, so a hand-edited or truncated file is a clear message, never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from infrarsi.errors import StudyError

M = TypeVar("M", bound=BaseModel)


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_json_record(path: Path, model: type[M], what: str, fix: str) -> M:
    """Parse ``path`` as ``model``; ``what`` names the record in messages, ``fix`` ends them."""
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise StudyError(f"{path}: cannot read {what} ({e}). {fix}") from None
    except json.JSONDecodeError as e:
        raise StudyError(f"{path}: rule: {what} must be JSON; it is not ({e}). {fix}") from None
    if not isinstance(data, dict):
        raise StudyError(
            f"{path}: rule: {what} must be a JSON object; got "
            f"{type(data).__name__} {short_repr(data)}. {fix}"
        )
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(x) for x in err["loc"]) or "(top level)"
        value = "<absent>" if err["type"] == "missing" else short_repr(err.get("input"))
        more = f" (+{e.error_count() - 1} more)" if e.error_count() > 1 else ""
        raise StudyError(
            f"{path}: field {field!r}: rule: {err['msg']}; value: {value}{more}. {fix}"
        ) from None
