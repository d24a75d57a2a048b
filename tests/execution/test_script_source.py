"""A script's kind and its arguments' defaults are read from its syntax tree, never by running it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from infrarsi.errors import ConfigError
from infrarsi.execution.script_source import option_name, read_script

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "scripts"

HF_SCRIPT = """
from dataclasses import dataclass, field
from transformers import HfArgumentParser, Trainer, TrainingArguments

@dataclass
class DataArgs:
    max_seq_length: int = field(default=32, metadata={"help": "tokens per sequence"})
    seed_rows: int = 7

raise SystemExit("never run")
"""


def test_the_kind_and_the_argument_defaults_are_read(tmp_path):
    shutil.copy(EXAMPLE / "ds_train.py", tmp_path / "ds_train.py")
    src = read_script(tmp_path / "ds_train.py")
    assert (
        src.kind == "deepspeed" and src.defaults["seq_len"] == 64 and src.defaults["steps"] == 200
    )
    (tmp_path / "hf.py").write_text(HF_SCRIPT)
    hf = read_script(tmp_path / "hf.py")
    assert hf.kind == "hf_trainer" and hf.defaults == {"max_seq_length": 32, "seed_rows": 7}
    (tmp_path / "ddp.py").write_text(
        "import torch\nimport argparse\np = argparse.ArgumentParser()\n"
        "p.add_argument('--block-size', type=int, default=256)\n"
    )
    plain = read_script(tmp_path / "ddp.py")
    assert plain.kind == "torch" and plain.defaults == {"block_size": 256}


def test_a_script_that_does_not_parse_is_refused(tmp_path):
    (tmp_path / "bad.py").write_text("def broken(:\n")
    with pytest.raises(ConfigError, match="a Python file that parses"):
        read_script(tmp_path / "bad.py")
    assert option_name("--max-steps") == "max_steps" and option_name("-u") == "u"
