"""The fused-loss benchmark runs its variants in fresh processes and reports the same loss for
each (a small vocabulary here; the figures come from the default 128k one)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import fused_loss


def test_every_variant_reports_the_same_loss(tmp_path: Path) -> None:
    args = ["--tokens", "64", "--vocab", "512", "--dim", "32", "--chunks", "0,16"]
    assert fused_loss.main([*args, "--results", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "fused_loss.json").read_text())["rows"]
    assert [r["fused_loss_tokens"] for r in rows] == [0, 16]
    assert abs(rows[0]["loss"] - rows[1]["loss"]) < 1e-5
    assert "| 16 |" in (tmp_path / "fused_loss.md").read_text()
