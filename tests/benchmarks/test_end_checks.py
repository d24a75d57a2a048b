"""``benchmarks/end_checks.py`` runs the end-of-trial checks on the debug model and prints what it measured."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_debug_run_prints_time_host_peak_and_the_checks() -> None:
    # a subprocess: the benchmark starts its own gloo process group
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.end_checks",
            "--size",
            "debug",
            "--repeats",
            "1",
            "--port",
            "29541",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    line = next(x for x in out.stdout.splitlines() if "repeat 0" in x)
    assert re.search(
        r"end_checks_s=\d+\.\d+ peak_host_bytes=\+\d+ MiB checksum=\S+ eval_loss=\d", line
    ), line
