"""A workload may name the user's own script: its validation (exit-2 errors naming the file, the
field, the rule, the value and the fix), and what init does with it (no Ray, nothing run)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from infrarsi.errors import ConfigError, WorkloadError
from infrarsi.workload import Workload

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "scripts"


def _copy(tmp_path: Path, **changes: object) -> Path:
    for f in ("ds_train.py", "ds.json"):
        shutil.copy(EXAMPLE / f, tmp_path / f)
    d = yaml.safe_load((EXAMPLE / "ds_train.yaml").read_text())
    d["search_space"] = str(ROOT / "search_spaces" / "deepspeed_dense.yaml")
    for k, v in changes.items():
        d[k] = v
    p = tmp_path / "wl.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def test_the_example_loads_with_its_script_inside_the_repository():
    wl = Workload.from_yaml(EXAMPLE / "ds_train.yaml")
    assert wl.model is None and wl.script is not None and wl.script.launcher == "deepspeed"
    assert wl.job_code_dir() == ROOT  # the git repository holding the YAML
    assert wl.script_layout() == ("examples/scripts/ds_train.py", "examples/scripts")
    assert "script" in wl.to_yaml_dict() and "model" not in wl.to_yaml_dict()


def test_hash_of_a_model_workload_is_unchanged_by_the_new_field():
    wl = Workload.from_yaml(ROOT / "workloads" / "dense_debug.yaml")
    assert "script" not in wl.to_yaml_dict()


@pytest.mark.parametrize(("change", "match"), [
    ({"model": {"family": "dense"}}, "either model .* or script"),
    ({"script": None}, "either model .* or script"),
    ({"script": {"path": "ds_train.py", "launcher": "mpirun"}}, "script.launcher"),
    ({"script": {"path": "ds_train.py", "args": ["--local_rank=0"]}}, "launcher sets the rank's --local_rank"),
    ({"script": {"path": "ds_train.py", "args": [3]}}, "script.args"),
    ({"script": {"path": "train.sh"}}, r"a Python file \(\*\.py\)"),
    ({"script": {"path": "missing.py"}}, "not a file"),
    ({"script": {"path": "ds_train.py"}, "backend": "surrogate"}, "backend: rule: a script workload trains for real"),
])
def test_bad_script_fields_name_the_field_and_the_fix(tmp_path, change, match):
    with pytest.raises(WorkloadError, match=match) as e:
        Workload.from_yaml(_copy(tmp_path, **change))
    assert "wl.yaml" in str(e.value)


def test_a_script_outside_the_repository_is_refused(tmp_path):
    inner = tmp_path / "repo"
    inner.mkdir()
    (inner / ".git").mkdir()
    p = _copy(tmp_path)
    d = yaml.safe_load(p.read_text())
    d["script"]["path"] = "../ds_train.py"
    (inner / "wl.yaml").write_text(yaml.safe_dump(d))
    with pytest.raises(WorkloadError, match="inside the job's git repository"):
        Workload.from_yaml(inner / "wl.yaml")


def test_preflight_checks_syntax_and_the_batch_of_the_ds_config(tmp_path):
    from infrarsi.execution.script_preflight import script_preflight

    p = _copy(tmp_path)
    script_preflight(Workload.from_yaml(p))
    (tmp_path / "ds.json").write_text('{"train_batch_size": 32}')
    with pytest.raises(WorkloadError, match=r"train_batch_size=32 .* = 16"):
        script_preflight(Workload.from_yaml(p))
    (tmp_path / "ds.json").write_text("{not json")
    with pytest.raises(WorkloadError, match="cannot be read as JSON"):
        script_preflight(Workload.from_yaml(p))
    (tmp_path / "ds_train.py").write_text("def broken(:\n")
    with pytest.raises(WorkloadError, match="compiles"):
        script_preflight(Workload.from_yaml(p))


def test_init_pins_the_knobs_a_script_cannot_reach(tmp_path):
    from infrarsi.stages.init import init_stage

    c = init_stage(EXAMPLE / "ds_train.yaml", tmp_path / "study", analytic_prior=False, loss_guard=False, bank="off")
    assert "activation_checkpointing" not in c.editable.knobs and "optimizer_impl" not in c.editable.knobs
    assert "zero_stage" in c.editable.knobs and "micro_batch_size" in c.editable.knobs
    with pytest.raises(ConfigError, match=r"--knob .activation_checkpointing.*own model"):
        init_stage(EXAMPLE / "ds_train.yaml", tmp_path / "study2", editable_knobs=["activation_checkpointing"],
                   analytic_prior=False, loss_guard=False, bank="off")
