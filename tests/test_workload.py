"""The workload YAML: a built-in family or the user's entry point, and the token-file data option."""

from __future__ import annotations

from pathlib import Path

import pytest

from infrarsi.errors import WorkloadError
from infrarsi.workload import BUILTIN_ENTRY_POINT, Workload

BASE = {"name": "w", "tokens_per_step": 256, "data": {"seq_len": 32}, "search_space": "s.yaml"}


def test_a_family_is_the_builtin_entry_point_with_its_size_and_overrides() -> None:
    wl = Workload.from_dict({**BASE, "model": {"family": "dense", "size": "debug", "overrides": {"n_layers": 2}}})
    assert wl.model.entry() == (BUILTIN_ENTRY_POINT, {"family": "dense", "size": "debug", "overrides": {"n_layers": 2}})
    assert wl.job_code_dir() is None


def test_an_entry_point_is_imported_from_code_dir_relative_to_the_yaml(tmp_path: Path) -> None:
    raw = {**BASE, "model": {"entry_point": "my_job.train:make_job", "code_dir": "../code", "args": {"layers": 2}}}
    wl = Workload.from_dict(raw, source=str(tmp_path / "wl" / "job.yaml"))
    assert wl.model.entry() == ("my_job.train:make_job", {"layers": 2})
    assert wl.job_code_dir() == (tmp_path / "code").resolve()
    wl2 = Workload.from_dict({**BASE, "model": {"entry_point": "m:f"}}, source=str(tmp_path / "job.yaml"))
    assert wl2.job_code_dir() == tmp_path.resolve()  # default: the YAML's folder


@pytest.mark.parametrize(("model", "match"), [
    ({}, "exactly one of model.family"),
    ({"family": "dense", "entry_point": "m:f"}, "exactly one of model.family"),
    ({"entry_point": "m.f"}, "package.module:function"),
    ({"entry_point": "m:f", "size": "1b"}, "model.args"),
    ({"family": "dense", "code_dir": "x"}, "belong to model.entry_point"),
])
def test_model_source_errors_name_the_field_and_the_fix(model: dict, match: str) -> None:
    with pytest.raises(WorkloadError, match=match) as ei:
        Workload.from_dict({**BASE, "model": model}, source="wl.yaml")
    assert "wl.yaml" in str(ei.value) and "'model'" in str(ei.value)


def test_token_data_needs_a_path_resolved_against_the_yaml(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match=r"needs data\.path"):
        Workload.from_dict({**BASE, "model": {"family": "dense"}, "data": {"kind": "tokens", "seq_len": 32}})
    wl = Workload.from_dict({**BASE, "model": {"family": "dense"}, "data": {"kind": "tokens", "path": "t.bin", "seq_len": 32}},
                            source=str(tmp_path / "w.yaml"))
    assert wl.data_path() == (tmp_path / "t.bin").resolve()


def test_a_cheat_variant_is_only_for_the_builtin_families() -> None:
    with pytest.raises(WorkloadError, match="variant"):
        Workload.from_dict({**BASE, "model": {"entry_point": "m:f"}, "variant": "fake_loss"})
