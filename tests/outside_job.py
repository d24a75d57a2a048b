"""Writes a tiny job and its workload YAML into a folder outside the repository.

The plain-torch job of ``tests/fixtures/jobs/tiny_job.py`` is copied there and named by the YAML's
``model.entry_point`` (shared by the job-loader and ``infrarsi trial`` tests).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
TINY_JOB = ROOT / "tests" / "fixtures" / "jobs" / "tiny_job.py"
SEQ_LEN = 16
SEQUENCES = 16


def write_tiny_workload(
    folder: Path, entry_point: str = "tiny_job:make_job", *, warmup: int = 1, measured: int = 2
) -> Path:
    """``folder/my_job/tiny_job.py`` and ``folder/tiny.yaml`` (2 CPU ranks, ZeRO-2, 16 sequences
    of 16 tokens per step, ``model.code_dir: my_job``); returns the YAML's path."""
    code = folder / "my_job"
    code.mkdir(parents=True, exist_ok=True)
    shutil.copy(TINY_JOB, code / "tiny_job.py")
    data = {
        "name": "tiny_outside",
        "model": {"entry_point": entry_point, "code_dir": "my_job", "args": {"dim": 32}},
        "data": {"seq_len": SEQ_LEN},
        "tokens_per_step": SEQ_LEN * SEQUENCES,
        "steps": {"warmup": warmup, "measured": measured},
        "resources": {"workers": 2, "device": "cpu"},
        "baseline": {
            "zero_stage": 2,
            "micro_batch_size": 2,
            "activation_checkpointing": "none",
            "dtype": "fp32",
        },
        "search_space": str(ROOT / "search_spaces" / "deepspeed_dense.yaml"),
    }
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
