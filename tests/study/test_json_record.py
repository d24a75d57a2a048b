"""read_json_record: each way a study's JSON file can be wrong is a StudyError naming the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from infrarsi.errors import StudyError
from infrarsi.study.json_record import read_json_record, short_repr


class _Rec(BaseModel):
    n: int = Field(gt=0)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{not json", "must be JSON"),
        ("[1, 2]", "must be a JSON object; got list"),
        ('{"n": -1}', "field 'n'"),
        ("{}", "value: <absent>"),
    ],
)
def test_bad_file_names_file_rule_and_fix(tmp_path: Path, text: str, needle: str) -> None:
    p = tmp_path / "rec.json"
    p.write_text(text)
    with pytest.raises(StudyError) as e:
        read_json_record(p, _Rec, "the record", "Fix: rewrite it.")
    assert needle in str(e.value) and str(p) in str(e.value) and "Fix: rewrite it." in str(e.value)


def test_missing_file_and_good_file(tmp_path: Path) -> None:
    with pytest.raises(StudyError, match="cannot read the record"):
        read_json_record(tmp_path / "absent.json", _Rec, "the record", "Fix.")
    (tmp_path / "ok.json").write_text('{"n": 3}')
    assert read_json_record(tmp_path / "ok.json", _Rec, "the record", "Fix.").n == 3


def test_short_repr_cuts_long_values() -> None:
    assert short_repr("x" * 200).endswith("...") and len(short_repr("x" * 200)) == 80
    assert short_repr(5) == "5"
