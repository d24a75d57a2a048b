"""``benchmarks/replay.py``: a replay is deterministic, and a changed decision is found and named."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.replay import differences, main


def test_a_replay_repeats_itself_and_compare_finds_a_change(tmp_path: Path) -> None:
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    args = ["--problems", "tabular_dense_debug", "--seeds", "0", "--trials", "4"]
    assert main(["--out", str(first), *args]) == 0
    assert main(["--out", str(second), "--compare", str(first), *args]) == 0
    configs = json.loads(first.read_text())
    assert list(configs) == ["tabular_dense_debug/0"] and len(configs["tabular_dense_debug/0"]) == 4

    changed = json.loads(first.read_text())
    run = changed["tabular_dense_debug/0"]
    run[2] = {**run[2], "zero_stage": -1}
    (tmp_path / "changed.json").write_text(json.dumps(changed))
    assert main(["--out", str(second), "--compare", str(tmp_path / "changed.json"), *args]) == 1
    assert differences(changed, configs) == [
        f"tabular_dense_debug/0: trial 2 differs: {run[2]} != {configs['tabular_dense_debug/0'][2]}"
    ]


def test_differences_names_missing_and_shorter_runs() -> None:
    assert differences({"p/0": [{"a": 1}]}, {}) == ["p/0: only in before"]
    assert differences({"p/0": [{"a": 1}]}, {"p/0": [{"a": 1}, {"a": 2}]}) == [
        "p/0: 1 trials before, 2 after"
    ]
