"""The task contract: frozen, hashed, refuses edits with a field-level message; only calibration."""

from __future__ import annotations

import shutil
from pathlib import Path

import git
import pytest
import yaml

from infrarsi.errors import ContractError, SearchSpaceError
from infrarsi.study.arithmetic_tolerance import ArithmeticTolerance
from infrarsi.study.contract import CONTRACT_FILE, SPACE_COPY, Contract

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def wl_copy(tmp_path: Path) -> Path:
    """A private copy of the dense debug workload and its search space (files we may edit)."""
    (tmp_path / "workloads").mkdir()
    (tmp_path / "search_spaces").mkdir()
    shutil.copy(ROOT / "search_spaces/deepspeed_dense.yaml", tmp_path / "search_spaces")
    shutil.copy(ROOT / "workloads/dense_debug.yaml", tmp_path / "workloads")
    return tmp_path / "workloads/dense_debug.yaml"


def test_create_and_load_roundtrip(tmp_path: Path, wl_copy: Path) -> None:
    study = tmp_path / "study"
    c = Contract.create(
        wl_copy,
        study_dir=study,
        request="Make it 2x faster, keep the loss.",
        trials=14,
        wall_time_s=600,
        memory_capacity_bytes=4 << 30,
    )
    assert (study / CONTRACT_FILE).exists()
    loaded = Contract.load(study)
    assert loaded.contract_hash == c.contract_hash == c.compute_hash()
    assert loaded.request == "Make it 2x faster, keep the loss."
    assert loaded.invariants.tokens_per_step == 2048
    assert loaded.invariants.optimizer_steps == 11
    assert loaded.invariants.warmup_steps == 1
    assert loaded.invariants.loss_atol is None and not loaded.invariants.loss_calibrated
    assert "zero_stage" in loaded.editable.knobs
    assert loaded.editable.globs == ["workloads/**"]
    assert loaded.budgets.trials == 14
    assert loaded.study == "study"
    assert len(loaded.workload_hash) == 64 and len(loaded.search_space_hash) == 64


def test_edited_contract_is_refused_naming_the_field(tmp_path: Path, wl_copy: Path) -> None:
    study = tmp_path / "s"
    Contract.create(wl_copy, study_dir=study)
    p = study / CONTRACT_FILE
    data = yaml.safe_load(p.read_text())
    data["invariants"]["tokens_per_step"] = 1024
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ContractError) as e:
        Contract.load(study)
    msg = str(e.value)
    assert "invariants.tokens_per_step" in msg and "2048" in msg and "1024" in msg


def test_edit_with_recomputed_hash_is_still_refused(tmp_path: Path, wl_copy: Path) -> None:
    study = tmp_path / "s"
    c = Contract.create(wl_copy, study_dir=study)
    forged = c.model_copy(update={"memory_capacity_bytes": 999}).freeze()
    data = forged.content()
    data["contract_hash"] = forged.contract_hash
    (study / CONTRACT_FILE).write_text(yaml.safe_dump(data))
    with pytest.raises(ContractError, match="memory_capacity_bytes"):
        Contract.load(study)


def test_changed_workload_file_is_refused(tmp_path: Path, wl_copy: Path) -> None:
    study = tmp_path / "s"
    Contract.create(wl_copy, study_dir=study)
    wl_copy.write_text(
        wl_copy.read_text().replace("tokens_per_step: 2048", "tokens_per_step: 1024")
    )
    with pytest.raises(ContractError) as e:
        Contract.load(study)
    assert str(wl_copy) in str(e.value) and "NEW_DIR" in str(e.value)
    # A comment-only edit does not change the workload's hash.
    wl_copy.write_text(
        wl_copy.read_text().replace("tokens_per_step: 1024", "tokens_per_step: 2048") + "\n# note\n"
    )
    Contract.load(study)


def test_changed_search_space_is_refused(tmp_path: Path, wl_copy: Path) -> None:
    study = tmp_path / "s"
    Contract.create(wl_copy, study_dir=study)
    sp = tmp_path / "search_spaces/deepspeed_dense.yaml"
    sp.write_text(sp.read_text().replace("values: [1, 2, 4, 8]", "values: [1, 2]"))
    with pytest.raises(ContractError, match="search space"):
        Contract.load(study)


def test_calibration_is_the_only_allowed_change(tmp_path: Path, wl_copy: Path) -> None:
    study = tmp_path / "s"
    c = Contract.create(wl_copy, study_dir=study)
    cal = c.with_calibration(
        loss_atol=2e-4,
        eval_atol=5e-4,
        memory_capacity_bytes=1 << 30,
        reason="doctor: 3 baseline trials",
    ).save(study)
    again = Contract.load(study)
    assert again.contract_hash == cal.contract_hash != c.contract_hash
    assert again.invariants.loss_atol == 2e-4 and again.invariants.loss_calibrated
    assert again.invariants.eval_calibrated
    assert len(again.amendments) == 1
    assert again.amendments[0].changes["invariants.loss_atol"] == [None, 2e-4]
    assert again.amendments[0].by == "doctor"
    # Capacity cannot be changed once set.
    with pytest.raises(ContractError, match="memory_capacity_bytes"):
        again.with_calibration(memory_capacity_bytes=2 << 30)
    # Saving anything else over a frozen contract is refused.
    with pytest.raises(ContractError, match="request"):
        again.model_copy(update={"request": "other"}).save(study)
    with pytest.raises(ContractError, match=">= 0"):
        again.with_calibration(loss_atol=-1.0)
    # A knob of another arithmetic gets its own tolerances, recorded as an amendment.
    assert "arithmetic_tolerances" not in again.content()["invariants"]  # old hashes hold
    f8 = ArithmeticTolerance(loss_atol=1e-2, eval_atol=3e-2)
    own = again.with_calibration(arithmetic_tolerances={"float8_linear": f8}).save(study)
    back = Contract.load(study)
    assert back.invariants.arithmetic_tolerances == {"float8_linear": f8}
    assert back.amendments[-1].changes["invariants.arithmetic_tolerances"] == [
        {},
        {"float8_linear": {"loss_atol": 1e-2, "eval_atol": 3e-2}},
    ]
    assert back.contract_hash == own.contract_hash
    assert back.invariants.loss_tolerance({"float8_linear": True}) == (1e-2, 0.0)
    assert back.invariants.loss_tolerance({"float8_linear": False}) == (2e-4, 0.0)
    assert back.invariants.eval_tolerance({"float8_linear": True})[0] == 3e-2


def test_init_twice_into_one_study_is_refused(tmp_path: Path, wl_copy: Path) -> None:
    Contract.create(wl_copy, study_dir=tmp_path / "s")
    with pytest.raises(ContractError, match="already exists"):
        Contract.create(wl_copy, study_dir=tmp_path / "s")


def test_unknown_editable_knob_lists_valid_ones(wl_copy: Path) -> None:
    with pytest.raises(ContractError, match="zero_stage"):
        Contract.create(wl_copy, editable_knobs=["warp_speed"])


def test_missing_contract_says_run_init(tmp_path: Path) -> None:
    with pytest.raises(ContractError, match="infrarsi init"):
        Contract.load(tmp_path)


def test_edit_without_frozen_copy_names_the_section(tmp_path: Path, wl_copy: Path) -> None:
    study = tmp_path / "s"
    Contract.create(wl_copy, study_dir=study, trials=5)
    (study / ".contract.frozen.json").unlink()
    p = study / CONTRACT_FILE
    data = yaml.safe_load(p.read_text())
    data["budgets"]["trials"] = 500
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ContractError, match=r"changed section\(s\): \['budgets'\]"):
        Contract.load(study)


def test_unknown_field_is_refused(tmp_path: Path, wl_copy: Path) -> None:
    study = tmp_path / "s"
    Contract.create(wl_copy, study_dir=study)
    p = study / CONTRACT_FILE
    data = yaml.safe_load(p.read_text())
    data["sneaky"] = 1
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ContractError, match="sneaky"):
        Contract.load(study)


# ------------------------------------------------------------------------------ switches
OLD = Path(__file__).resolve().parents[1] / "fixtures/study/old_contract"
"""A contract written (and calibrated) by infrarsi at e29713c, before switches were recorded."""


def test_switches_are_recorded_and_frozen(
    tmp_path: Path, wl_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INFRARSI_PRIOR", "off")
    monkeypatch.setenv("INFRARSI_LOSS_GUARD", "on")
    monkeypatch.setenv("INFRARSI_BANK", str(tmp_path / "bank"))
    study = tmp_path / "s"
    Contract.create(wl_copy, study_dir=study)
    data = yaml.safe_load((study / CONTRACT_FILE).read_text())
    assert data["switches"] == {
        "analytic_prior": False,
        "loss_guard": True,
        "bank": str(tmp_path / "bank"),
    }
    for name in (
        "INFRARSI_PRIOR",
        "INFRARSI_LOSS_GUARD",
        "INFRARSI_BANK",
    ):  # later: the contract's record
        monkeypatch.setenv(name, "sometimes" if name != "INFRARSI_BANK" else "off")
    sw = Contract.load(study).switches_in_force()
    assert (sw.analytic_prior, sw.loss_guard, sw.bank) == (False, True, str(tmp_path / "bank"))
    data["switches"]["bank"] = None
    (study / CONTRACT_FILE).write_text(yaml.safe_dump(data))
    with pytest.raises(ContractError, match=r"switches\.bank"):
        Contract.load(study)


def test_contract_from_before_switches_still_verifies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    study = tmp_path / "old"
    shutil.copytree(OLD, study)
    before = (study / CONTRACT_FILE).read_text()
    c = Contract.load(study)
    assert c.switches is None and "switches" not in c.content()
    assert c.memory_capacity_bytes == 160 << 20 and c.memory_capacity.source == "--memory-capacity"
    assert c.invariants.loss_atol == 2e-4 and len(c.amendments) == 1
    # Such a study behaves as it always did: its switches come from the environment.
    monkeypatch.setenv("INFRARSI_PRIOR", "off")
    monkeypatch.setenv("INFRARSI_BANK", "off")
    monkeypatch.delenv("INFRARSI_LOSS_GUARD", raising=False)
    sw = c.switches_in_force()
    assert (sw.analytic_prior, sw.loss_guard, sw.bank) == (False, True, None)
    # A calibration re-freezes it without adding the section.
    c.with_calibration(eval_atol=1e-3, reason="doctor").save(study)
    assert "switches" not in (study / CONTRACT_FILE).read_text() != before
    assert Contract.load(study).switches is None


# ------------------------------------------------------------------------------ search space, git
def test_search_space_is_read_from_the_study_copy_and_checked_once(
    tmp_path: Path, wl_copy: Path
) -> None:
    study = tmp_path / "s"
    c = Contract.create(wl_copy, study_dir=study)
    assert "zero_stage" in c.search_space(study).names  # no copy yet: the original file
    copy = study / SPACE_COPY
    shutil.copy(c.search_space_path, copy)
    space = c.search_space(study)
    assert space.file == str(copy)
    copy.write_text(copy.read_text().replace("values: [1, 2, 4, 8]", "values: [1, 2]"))
    with pytest.raises(ContractError) as e:
        c.search_space(study)
    assert str(copy) in str(e.value) and "search_space_hash" in str(e.value)


def test_unparsable_search_space_is_a_search_space_error(tmp_path: Path, wl_copy: Path) -> None:
    sp = tmp_path / "search_spaces/deepspeed_dense.yaml"
    sp.write_text("name: broken\nknobs: not-a-list\n")
    with pytest.raises(SearchSpaceError, match="knobs"):
        Contract.create(wl_copy, study_dir=tmp_path / "s")


def test_git_head_and_dirty_flag_of_the_workload_repository(tmp_path: Path, wl_copy: Path) -> None:
    assert Contract.create(wl_copy).workload_git_sha is None  # not in git yet
    repo = git.Repo.init(tmp_path)
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "t").set_value("user", "email", "t@example.com")
    assert Contract.create(wl_copy).workload_git_sha is None  # in git, before the first commit
    repo.index.add([str(wl_copy.relative_to(tmp_path)), "search_spaces/deepspeed_dense.yaml"])
    head = repo.index.commit("workload").hexsha
    (tmp_path / "untracked.txt").write_text("ignored by the dirty flag")
    clean = Contract.create(wl_copy)
    assert (clean.workload_git_sha, clean.workload_git_dirty) == (head, False)
    wl_copy.write_text(wl_copy.read_text() + "# an uncommitted edit\n")
    dirty = Contract.create(wl_copy)
    assert (dirty.workload_git_sha, dirty.workload_git_dirty) == (head, True)


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        (CONTRACT_FILE, b"\xff\xfe\x00", "cannot be read as UTF-8"),
        (CONTRACT_FILE, b"1: 2\nstudy: s\n", "field 1: field names must be strings"),
        (".contract.frozen.json", b"\xff{", "frozen copy of the contract cannot be read"),
        (".contract.frozen.json", b"[1, 2]", "must be a JSON object"),
    ],
)
def test_a_damaged_contract_file_is_a_contract_error(
    tmp_path: Path, wl_copy: Path, name: str, content: bytes, match: str
) -> None:
    """A contract file edited into something unreadable is refused naming the file (exit code 2),
    never a decoding traceback."""
    study = tmp_path / "s"
    Contract.create(wl_copy, study_dir=study)
    (study / name).write_bytes(content)
    with pytest.raises(ContractError, match=match) as e:
        Contract.load(study)
    assert str(study / name) in str(e.value)


# ------------------------------------------------------------------------------ long-check budget
def test_the_long_check_budget_is_recorded_and_an_old_contract_gets_the_default(
    tmp_path: Path, wl_copy: Path
) -> None:
    import shutil

    from infrarsi.study.contract import DEFAULT_LONG_CHECK_BUDGET_S

    study = tmp_path / "s"
    Contract.create(wl_copy, study_dir=study, long_check_s=42.0)
    data = yaml.safe_load((study / CONTRACT_FILE).read_text())
    assert data["budgets"]["long_check_s"] == 42.0
    assert Contract.load(study).budgets.long_check_budget_s == 42.0
    data["budgets"]["long_check_s"] = 4200.0  # frozen like every other field
    (study / CONTRACT_FILE).write_text(yaml.safe_dump(data))
    with pytest.raises(ContractError, match=r"budgets\.long_check_s"):
        Contract.load(study)
    old = tmp_path / "old"
    shutil.copytree(OLD, old)
    assert "long_check_s" not in (old / CONTRACT_FILE).read_text()
    c = Contract.load(old, check_files=False)  # written before the field: loads, keeps its hash
    assert (
        c.budgets.long_check_s is None
        and c.budgets.long_check_budget_s == DEFAULT_LONG_CHECK_BUDGET_S
    )
    assert c.compute_hash() == c.contract_hash
