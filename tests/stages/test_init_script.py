"""``init --script``: a launch line parsed without a shell, its script and DeepSpeed config read
into a workload whose baseline is what the user ships; bad lines are refused naming the fix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from infrarsi.errors import ConfigError, UserInputError, WorkloadError
from infrarsi.stages.init_script import (
    arg_value,
    init_workload_argument,
    parse_launch_line,
    script_workload,
    write_script_workload,
)
from infrarsi.workload import Workload

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "scripts"
DS_LINE = "deepspeed --num_gpus 2 ds_train.py --deepspeed --deepspeed_config ds.json --steps 1000"

# The shape of a Trainer script (read, never run here).
HF_SCRIPT = """
from dataclasses import dataclass, field
from transformers import HfArgumentParser, Trainer, TrainingArguments

@dataclass
class DataArgs:
    max_seq_length: int = field(default=32, metadata={"help": "tokens per sequence"})

def main():
    data, args = HfArgumentParser((DataArgs, TrainingArguments)).parse_args_into_dataclasses()
    Trainer(model=None, args=args).train()
"""

HF_DS = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "bf16": {"enabled": "auto"},
    "zero_optimization": {"stage": 2, "overlap_comm": True},
}


def _ds_example(tmp_path: Path) -> Path:
    for f in ("ds_train.py", "ds.json"):
        shutil.copy(EXAMPLE / f, tmp_path / f)
    return tmp_path


def _hf_example(tmp_path: Path, ds: dict | None = None) -> Path:
    (tmp_path / "hf.py").write_text(HF_SCRIPT)
    (tmp_path / "ds.json").write_text(json.dumps(ds or HF_DS))
    return tmp_path


@pytest.mark.parametrize(
    ("line", "launcher", "workers", "nodes"),
    [
        ("deepspeed --num_gpus 2 train.py --deepspeed ds.json", "deepspeed", 2, 1),
        ("deepspeed --num_gpus=4 --num_nodes 2 --master_port 29501 train.py", "deepspeed", 8, 2),
        ("deepspeed --include localhost:0,1,2 train.py", "deepspeed", 3, 1),
        ("deepspeed train.py", "deepspeed", 1, 1),
        ("torchrun --nproc_per_node 2 train.py --lr 1", "torchrun", 2, 1),
        ("torchrun --standalone --nproc-per-node=4 --nnodes 1 train.py", "torchrun", 4, 1),
        ("python -m torch.distributed.run --nproc_per_node 2 train.py", "torchrun", 2, 1),
        ("python3 -u train.py --x 'a b'", "python", 1, 1),
    ],
)
def test_launch_lines_give_the_launcher_the_world_and_the_scripts_own_arguments(
    line, launcher, workers, nodes
):
    parsed = parse_launch_line(line)
    assert (parsed.launcher, parsed.workers, parsed.nodes, parsed.script) == (
        launcher,
        workers,
        nodes,
        "train.py",
    )
    assert parsed.args == line.split("train.py", 1)[1].split() or parsed.args == ["--x", "a b"]


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("accelerate launch train.py", "launcher 'accelerate'"),
        ("mpirun -np 2 python train.py", "launcher 'mpirun'"),
        ("CUDA_VISIBLE_DEVICES=0 deepspeed train.py", "environment setting"),
        ("deepspeed --bogus 3 train.py", r"deepspeed option '--bogus'"),
        ("deepspeed --hostfile hosts train.py", "places the ranks"),
        ("torchrun --nnodes 1:4 train.py", "elastic range"),
        ("torchrun -m pkg.train", "not a module"),
        ("deepspeed --num_gpus 2", "names the training script"),
        ("deepspeed train.sh", r"a Python file \(\*\.py\)"),
        ("deepspeed 'train.py", "balanced quotes"),
        ("", "empty line"),
    ],
)
def test_a_line_infrarsi_cannot_run_is_refused_naming_the_fix(line, match):
    with pytest.raises(ConfigError, match=match) as e:
        parse_launch_line(line)
    assert "--script" in str(e.value)


def test_arguments_are_read_as_the_script_reads_them():
    args = [
        "--deepspeed",
        "ds.json",
        "--bf16",
        "--max-steps=20",
        "--gradient_checkpointing",
        "true",
    ]
    assert arg_value(args, ("deepspeed",)) == "ds.json"
    assert arg_value(args, ("bf16",)) == "true"
    assert arg_value(args, ("max_steps",)) == "20"
    assert arg_value(args, ("gradient_checkpointing",)) == "true"
    assert arg_value(args, ("fp16",)) is None


def test_the_example_line_gives_the_examples_workload(tmp_path):
    _ds_example(tmp_path)
    sw = script_workload(parse_launch_line(DS_LINE), cwd=tmp_path)
    wl = sw.workload
    assert wl["script"] == {
        "path": "ds_train.py",
        "args": DS_LINE.split("ds_train.py ")[1].split(),
        "launcher": "deepspeed",
    }
    assert wl["tokens_per_step"] == 16 * 64 and wl["data"] == {"seq_len": 64}
    assert wl["resources"] == {"workers": 2, "nodes": 1, "device": "cpu"}
    assert wl["baseline"] == {"zero_stage": 0, "micro_batch_size": 1, "dtype": "fp32"}
    assert sw.path == tmp_path.resolve() / "ds_train.infrarsi.yaml" and sw.kind == "deepspeed"
    assert any("from the script's default" in n for n in sw.notes)
    write_script_workload(sw, DS_LINE)
    loaded = Workload.from_yaml(sw.path)  # loads, the script inside its folder
    assert loaded.script_layout() == ("ds_train.py", ".") and loaded.global_batch_size == 16
    write_script_workload(sw, DS_LINE)  # the same again: fine
    sw.workload["tokens_per_step"] = 2048
    with pytest.raises(ConfigError, match="exists with other content"):
        write_script_workload(sw, DS_LINE)


def test_a_trainer_script_takes_its_batch_and_precision_from_its_flags(tmp_path):
    _hf_example(tmp_path)
    line = (
        "deepspeed --num_gpus 2 hf.py --deepspeed ds.json --per_device_train_batch_size 4 "
        "--gradient_accumulation_steps 2 --bf16 --gradient_checkpointing"
    )
    sw = script_workload(parse_launch_line(line), cwd=tmp_path)
    assert sw.kind == "hf_trainer"
    assert sw.workload["tokens_per_step"] == 4 * 2 * 2 * 32
    base = sw.workload["baseline"]
    assert base["micro_batch_size"] == 4 and base["dtype"] == "bf16" and base["zero_stage"] == 2
    assert base["overlap_comm"] is True and base["activation_checkpointing"] == "full"
    # no flags: the Trainer's defaults, said so
    sw = script_workload(
        parse_launch_line("deepspeed --num_gpus 2 hf.py --deepspeed ds.json"), cwd=tmp_path
    )
    assert (
        sw.workload["baseline"]["micro_batch_size"] == 8
        and sw.workload["baseline"]["dtype"] == "fp32"
    )
    assert any("the Trainer's default 8" in n for n in sw.notes)


def test_values_the_space_cannot_hold_are_noted_not_kept(tmp_path):
    _ds_example(tmp_path)
    cfg = json.loads((tmp_path / "ds.json").read_text())
    cfg.update(
        train_batch_size=32, train_micro_batch_size_per_gpu=16, gradient_accumulation_steps=1
    )
    cfg["zero_optimization"] = {"stage": 1, "reduce_bucket_size": 123}
    (tmp_path / "ds.json").write_text(json.dumps(cfg))
    sw = script_workload(parse_launch_line(DS_LINE), cwd=tmp_path)
    assert sw.workload["baseline"] == {"zero_stage": 1, "dtype": "fp32"}
    notes = "\n".join(sw.notes)
    assert "micro_batch_size=16: not a value of the knob ([1, 2, 4, 8])" in notes
    assert "reduce_bucket_size=123" in notes


@pytest.mark.parametrize(
    ("change", "match", "error"),
    [
        ({"script": "missing.py"}, "not a file", ConfigError),
        ({"ds": "nope.json"}, "cannot be read as JSON", WorkloadError),
        ({"no_ds": True}, "name its DeepSpeed config", ConfigError),
        ({"cfg": {"train_batch_size": 16, "fp16": {"enabled": True}}}, "fp16", WorkloadError),
        (
            {"cfg": {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 3}},
            r"16 != 3 x 1 x 2",
            WorkloadError,
        ),
        ({"steps": "4"}, "at least a trial's 10 optimizer steps", ConfigError),
    ],
)
def test_a_missing_script_or_config_or_an_odd_batch_is_refused(tmp_path, change, match, error):
    _ds_example(tmp_path)
    if "cfg" in change:
        (tmp_path / "ds.json").write_text(json.dumps(change["cfg"]))
    line = DS_LINE.replace("ds_train.py", change.get("script", "ds_train.py")).replace(
        "ds.json", change.get("ds", "ds.json")
    )
    line = line.replace("--steps 1000", f"--steps {change.get('steps', 1000)}")
    if change.get("no_ds"):
        line = "deepspeed --num_gpus 2 ds_train.py"
    with pytest.raises(error, match=match) as e:
        script_workload(parse_launch_line(line), cwd=tmp_path)
    assert isinstance(e.value, UserInputError) and "--script" in str(e.value)


def test_a_plain_torch_script_is_refused_saying_what_is_tuned(tmp_path):
    (tmp_path / "ddp.py").write_text("import torch\nimport torch.distributed as dist\n")
    with pytest.raises(ConfigError, match=r"plain torch \(DDP/FSDP\) scripts are not tuned yet"):
        script_workload(
            parse_launch_line("torchrun --nproc_per_node 2 ddp.py --lr 1"), cwd=tmp_path
        )


def test_no_sequence_length_anywhere_asks_for_seq_len(tmp_path):
    _ds_example(tmp_path)
    (tmp_path / "ds_train.py").write_text(
        (tmp_path / "ds_train.py").read_text().replace('"--seq_len"', '"--width"')
    )
    with pytest.raises(ConfigError, match="--seq-len N"):
        script_workload(parse_launch_line(DS_LINE), cwd=tmp_path)
    assert script_workload(parse_launch_line(DS_LINE), cwd=tmp_path, seq_len=64).workload[
        "data"
    ] == {"seq_len": 64}


def test_init_takes_a_workload_or_a_line_never_both():
    with pytest.raises(ConfigError, match="exactly one"):
        init_workload_argument(None, None, space=None, seq_len=None)
    with pytest.raises(ConfigError, match="exactly one"):
        init_workload_argument(Path("w.yaml"), "deepspeed train.py", space=None, seq_len=None)
    assert init_workload_argument(Path("w.yaml"), None, space=None, seq_len=None) == Path("w.yaml")
