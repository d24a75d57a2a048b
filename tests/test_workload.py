"""The workload YAML: a built-in family or the user's entry point, and the token-file data option."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from malformed import PROPERTY, mutated

from infrarsi.errors import ConfigError, UserInputError, WorkloadError
from infrarsi.workload import BUILTIN_ENTRY_POINT, Workload, builtin_spaces

ROOT = Path(__file__).resolve().parents[1]
BASE = {"name": "w", "tokens_per_step": 256, "data": {"seq_len": 32}, "search_space": "s.yaml"}


def test_a_family_is_the_builtin_entry_point_with_its_size_and_overrides() -> None:
    wl = Workload.from_dict(
        {**BASE, "model": {"family": "dense", "size": "debug", "overrides": {"n_layers": 2}}}
    )
    assert wl.model.entry() == (
        BUILTIN_ENTRY_POINT,
        {"family": "dense", "size": "debug", "overrides": {"n_layers": 2}},
    )
    assert wl.job_code_dir() is None


def test_an_entry_point_is_imported_from_code_dir_relative_to_the_yaml(tmp_path: Path) -> None:
    raw = {
        **BASE,
        "model": {
            "entry_point": "my_job.train:make_job",
            "code_dir": "../code",
            "args": {"layers": 2},
        },
    }
    wl = Workload.from_dict(raw, source=str(tmp_path / "wl" / "job.yaml"))
    assert wl.model.entry() == ("my_job.train:make_job", {"layers": 2})
    assert wl.job_code_dir() == (tmp_path / "code").resolve()
    wl2 = Workload.from_dict(
        {**BASE, "model": {"entry_point": "m:f"}}, source=str(tmp_path / "job.yaml")
    )
    assert wl2.job_code_dir() == tmp_path.resolve()  # default: the YAML's folder


@pytest.mark.parametrize(
    ("model", "match"),
    [
        ({}, "exactly one of model.family"),
        ({"family": "dense", "entry_point": "m:f"}, "exactly one of model.family"),
        ({"entry_point": "m.f"}, "package.module:function"),
        ({"entry_point": "m:f", "size": "1b"}, "model.args"),
        ({"family": "dense", "code_dir": "x"}, "belong to model.entry_point"),
    ],
)
def test_model_source_errors_name_the_field_and_the_fix(model: dict, match: str) -> None:
    with pytest.raises(WorkloadError, match=match) as ei:
        Workload.from_dict({**BASE, "model": model}, source="wl.yaml")
    assert "wl.yaml" in str(ei.value) and "'model'" in str(ei.value)


def test_token_data_needs_a_path_resolved_against_the_yaml(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match=r"needs data\.path"):
        Workload.from_dict(
            {**BASE, "model": {"family": "dense"}, "data": {"kind": "tokens", "seq_len": 32}}
        )
    wl = Workload.from_dict(
        {
            **BASE,
            "model": {"family": "dense"},
            "data": {"kind": "tokens", "path": "t.bin", "seq_len": 32},
        },
        source=str(tmp_path / "w.yaml"),
    )
    assert wl.data_path() == (tmp_path / "t.bin").resolve()


def test_a_cheat_variant_is_only_for_the_builtin_families_and_names_its_seams() -> None:
    with pytest.raises(WorkloadError, match="variant"):
        Workload.from_dict(
            {**BASE, "model": {"entry_point": "m:f"}, "variant": "tests.cheats:fake_loss"}
        )
    with pytest.raises(
        WorkloadError, match=r"field 'variant'.*'module:attribute'.*got 'fake_loss'"
    ):
        Workload.from_dict(
            {**BASE, "model": {"family": "dense"}, "variant": "fake_loss"}, source="wl.yaml"
        )


# ------------------------------------------------------------------ shipped search spaces
def test_the_shipped_spaces_are_the_repositorys_search_spaces_folder() -> None:
    """One source: ``builtin:NAME`` reads ``search_spaces/NAME.yaml`` (the package's folder links
    to it; a built wheel holds its files, tests/test_package.py builds one)."""
    assert builtin_spaces() == sorted(p.stem for p in (ROOT / "search_spaces").glob("*.yaml"))
    listed = (ROOT / "docs" / "WORKLOADS.md").read_text()
    assert [n for n in builtin_spaces() if f"`{n}`" not in listed] == []  # the docs list every one
    wl = Workload.from_dict(
        {**BASE, "model": {"family": "dense"}, "search_space": "builtin:gpu_moe"}
    )
    assert (
        wl.search_space_path().read_bytes()
        == (ROOT / "search_spaces" / "gpu_moe.yaml").read_bytes()
    )


@pytest.mark.parametrize(
    ("fields", "space"),
    [
        ({"model": {"family": "dense"}}, "deepspeed_dense"),
        ({"model": {"family": "moe", "size": "debug"}}, "deepspeed_moe"),
        ({"model": {"entry_point": "my_job:make_job"}}, "deepspeed_dense"),
        ({"model": {"family": "dense"}, "backend": "surrogate"}, "surrogate_gpu"),
    ],
)
def test_a_workload_without_a_space_gets_its_kinds_default(fields: dict, space: str) -> None:
    raw = {k: v for k, v in BASE.items() if k != "search_space"}
    wl = Workload.from_dict({**raw, **fields})
    assert wl.search_space is None and wl.default_space() == space
    assert (
        wl.search_space_path().read_bytes()
        == (ROOT / "search_spaces" / f"{space}.yaml").read_bytes()
    )


def test_an_unknown_builtin_space_is_refused_listing_the_shipped_ones() -> None:
    with pytest.raises(UserInputError) as e:
        Workload.from_dict(
            {**BASE, "model": {"family": "dense"}, "search_space": "builtin:deepspeed_dens"},
            source="job.yaml",
        )
    msg = str(e.value)
    assert msg.startswith("job.yaml: field 'search_space'") and "got builtin:deepspeed_dens" in msg
    assert all(f"builtin:{n}" in msg for n in builtin_spaces())


# ------------------------------------------------------------------ property-based: bad YAML
DENSE_DEBUG = yaml.safe_load((ROOT / "workloads" / "dense_debug.yaml").read_text())
DENSE_DEBUG["search_space"] = str(
    ROOT / "search_spaces" / "deepspeed_dense.yaml"
)  # the copy lives elsewhere
SECTIONS = {
    "model": ["family", "size", "overrides", "entry_point", "code_dir", "args"],
    "data": ["kind", "seed", "seq_len", "path", "dtype"],
    "steps": ["warmup", "measured"],
    "resources": ["workers", "nodes", "devices_per_worker", "cpus_per_worker", "device"],
    "optimizer": ["lr", "weight_decay", "betas"],
    "baseline": ["zero_stage", "micro_batch_size"],
}
NAMED = ("field ", "a workload must be a mapping", "not valid YAML", "memory_capacity")


@PROPERTY
@given(raw=mutated(DENSE_DEBUG, SECTIONS))
def test_malformed_workload_yaml_is_refused_naming_file_and_field(
    raw: object, tmp_path: Path
) -> None:
    """A workload YAML with any one part broken is refused with a ``UserInputError`` naming the
    file and the field, or loads (the junk happened to be valid)."""
    path = tmp_path / "mutated_workload.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    try:
        wl = Workload.from_yaml(path)
        _ = wl.memory_capacity_bytes
    except UserInputError as e:
        msg = str(e)
        assert str(path) in msg and any(n in msg for n in NAMED), msg


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"\xff\xfe\x00binary", "cannot be read as UTF-8"),
        (b"1: 2\nname: x\n", "field 1: field names must be strings"),
        (b"- a list\n", "must be a mapping"),
    ],
)
def test_unreadable_or_odd_workload_files(tmp_path: Path, content: bytes, match: str) -> None:
    path = tmp_path / "w.yaml"
    path.write_bytes(content)
    with pytest.raises(WorkloadError, match=match) as e:
        Workload.from_yaml(path)
    assert str(path) in str(e.value)
    with pytest.raises(WorkloadError, match="is not a file"):
        Workload.from_yaml(tmp_path)


def test_workers_must_split_evenly_over_the_nodes(tmp_path: Path) -> None:
    raw = yaml.safe_load((ROOT / "workloads" / "dense_debug.yaml").read_text())
    raw["resources"] = {**raw["resources"], "workers": 3, "nodes": 2}
    with pytest.raises(WorkloadError, match="multiple of nodes"):
        Workload.from_dict(raw, source=str(tmp_path / "w.yaml"))


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("name", "", "name"),
        ("name", "my job", "name"),
        ("memory_capacity", True, "memory_capacity"),
    ],
)
def test_a_blank_name_or_a_boolean_capacity_is_refused(
    tmp_path: Path, field: str, value: object, needle: str
) -> None:
    raw = yaml.safe_load((ROOT / "workloads" / "dense_debug.yaml").read_text())
    raw[field] = value
    with pytest.raises(WorkloadError, match=needle):
        Workload.from_dict(raw, source=str(tmp_path / "w.yaml"))


def test_an_infinite_learning_rate_is_refused(tmp_path: Path) -> None:
    raw = yaml.safe_load((ROOT / "workloads" / "dense_debug.yaml").read_text())
    raw["optimizer"] = {"lr": float("inf")}
    with pytest.raises(WorkloadError, match=r"optimizer\.lr"):
        Workload.from_dict(raw, source=str(tmp_path / "w.yaml"))


# A workload may name the user's own script: its validation and what init does with it.

SCRIPT_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = SCRIPT_ROOT / "examples" / "scripts"


def _copy(tmp_path: Path, **changes: object) -> Path:
    for f in ("ds_train.py", "ds.json"):
        shutil.copy(EXAMPLE / f, tmp_path / f)
    d = yaml.safe_load((EXAMPLE / "ds_train.yaml").read_text())
    d["search_space"] = str(SCRIPT_ROOT / "search_spaces" / "deepspeed_dense.yaml")
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
    wl = Workload.from_yaml(SCRIPT_ROOT / "workloads" / "dense_debug.yaml")
    assert "script" not in wl.to_yaml_dict()


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"model": {"family": "dense"}}, "either model .* or script"),
        ({"script": None}, "either model .* or script"),
        ({"script": {"path": "ds_train.py", "launcher": "mpirun"}}, "script.launcher"),
        (
            {"script": {"path": "ds_train.py", "args": ["--local_rank=0"]}},
            "launcher sets the rank's --local_rank",
        ),
        ({"script": {"path": "ds_train.py", "args": [3]}}, "script.args"),
        ({"script": {"path": "train.sh"}}, r"a Python file \(\*\.py\)"),
        ({"script": {"path": "missing.py"}}, "not a file"),
        (
            {"script": {"path": "ds_train.py"}, "backend": "surrogate"},
            "backend: rule: a script workload trains for real",
        ),
    ],
)
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

    c = init_stage(
        EXAMPLE / "ds_train.yaml",
        tmp_path / "study",
        analytic_prior=False,
        loss_guard=False,
        bank="off",
    )
    assert (
        "activation_checkpointing" not in c.editable.knobs
        and "optimizer_impl" not in c.editable.knobs
    )
    assert "zero_stage" in c.editable.knobs and "micro_batch_size" in c.editable.knobs
    with pytest.raises(ConfigError, match=r"--knob .activation_checkpointing.*own model"):
        init_stage(
            EXAMPLE / "ds_train.yaml",
            tmp_path / "study2",
            editable_knobs=["activation_checkpointing"],
            analytic_prior=False,
            loss_guard=False,
            bank="off",
        )


def test_the_workload_init_writes_from_the_examples_launch_line_is_the_examples_job(tmp_path):
    from infrarsi.stages.init_script import (
        parse_launch_line,
        script_workload,
        write_script_workload,
    )

    line = "deepspeed --num_gpus 2 ds_train.py --deepspeed --deepspeed_config ds.json --steps 1000"
    _copy(tmp_path)
    sw = script_workload(parse_launch_line(line), cwd=tmp_path)
    written, hand = (
        Workload.from_yaml(write_script_workload(sw, line)),
        Workload.from_yaml(tmp_path / "wl.yaml"),
    )
    assert written.script == hand.script and written.tokens_per_step == hand.tokens_per_step
    assert written.data == hand.data and written.world_size == hand.world_size
    assert {k: written.baseline[k] for k in hand.baseline} == hand.baseline


def test_space_file_reads_builtin_names_and_paths(tmp_path):
    from infrarsi.workload import builtin_space_path, space_file

    assert space_file("builtin:deepspeed_moe") == builtin_space_path("deepspeed_moe")
    assert space_file(Path("builtin:deepspeed_dense")).is_file()  # as typer hands --space over
    assert space_file("s.yaml", tmp_path) == tmp_path / "s.yaml"
    assert space_file("/abs/s.yaml", tmp_path) == Path("/abs/s.yaml")
    with pytest.raises(WorkloadError, match="builtin:deepspeed_dense"):
        space_file("builtin:nope")
