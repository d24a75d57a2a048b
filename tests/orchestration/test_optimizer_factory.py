"""Experience-bank warm start: the bank's best configs of OTHER studies (any hardware, never the
study's own) are asked first (after the baseline); ``tune``'s last step adds the study to the bank.
Which bank, and whether
any, is the contract's ``switches.bank``, whatever ``INFRARSI_BANK`` says later. Unit tests, no
Ray: the bank is built from synthetic study directories by the real ``Bank.add_study``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from synthetic_study import BASE, BEST, ROOT, make_study, row, write_rows

from infrarsi.bank.feed import add_to_bank
from infrarsi.bank.store import Bank
from infrarsi.orchestration.optimizer_factory import (
    bank_warm_start_configs,
    build_optimizer,
    spread_out,
)
from infrarsi.result import TrialExtra
from infrarsi.search import AskInfo, Optimizer, Outcome
from infrarsi.search.settings import OptimizerSettings
from infrarsi.study.contract import Contract
from infrarsi.study.paths import StudyPaths
from infrarsi.study.switches import StudySwitches
from infrarsi.study.warm_start_record import TimeRankCheckRecord, WarmStartRecord

GIB = 1 << 30
SECOND = {**BASE, "zero_stage": 1, "micro_batch_size": 8, "activation_checkpointing": "selective"}
"""Only study b (hardware box-b) ran it: 0.9 s over a 2.05 s baseline."""
TEMPTING = {**BASE, "zero_stage": 2, "micro_batch_size": 8, "activation_checkpointing": "none"}
"""Only study c ran it, on the new study's own hardware (box-c), fastest of all: the first warm-start config."""
THIRD = {**BASE, "micro_batch_size": 4}


@pytest.fixture()
def bank(tmp_path: Path) -> Bank:
    b = Bank(tmp_path / "bank")
    b.add_study(make_study(tmp_path, "a", hw="box-a"))
    sb = make_study(tmp_path, "b", hw="box-b")
    write_rows(
        sb, [row("run-extra", "run", SECOND, 0.0, step=0.9, mem=0.7, hw="box-b")], name="seg1"
    )
    b.add_study(sb)
    sc = make_study(tmp_path, "c", hw="box-c")
    write_rows(
        sc, [row("run-extra", "run", TEMPTING, 0.0, step=0.3, mem=0.5, hw="box-c")], name="seg1"
    )
    b.add_study(sc)
    return b


def switches(bank: Path | None) -> StudySwitches:
    return StudySwitches(
        analytic_prior=True, loss_guard=True, bank=None if bank is None else str(bank)
    )


def new_study(tmp_path: Path, bank: Path | None, name: str = "new") -> tuple[Contract, list]:
    d = tmp_path / name
    contract = Contract.create(
        ROOT / "workloads/dense_debug.yaml",
        study_dir=d,
        memory_capacity_bytes=GIB,
        switches=switches(bank),
    )
    rows = [
        row(f"doctor-{i}", "doctor", BASE, 100.0 * i, step=3.0, mem=0.3, hw="box-c")
        for i in range(3)
    ]
    return contract, rows


def test_first_asks_after_baseline_are_the_banks_best_of_other_studies(
    tmp_path: Path, bank: Bank, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INFRARSI_BANK", "off")  # the contract's bank counts, not the environment
    contract, rows = new_study(tmp_path, bank.root)
    # the bank's three best as they are (the default spreads them: test_spread_out_...)
    one = OptimizerSettings(warm_start_pool=1)
    opt = build_optimizer(contract, rows, study_dir=tmp_path / "new", settings=one)
    space = opt.space
    # Best relative step time first: study c's TEMPTING (0.3/2.05, on this study's own hardware
    # box-c: another study of the same cluster counts), BEST (0.66/2.05, studies a and b), SECOND
    # (0.9/2.05, b); THIRD (1.1/2.05) and the oom config are left out.
    assert [space.key(c) for c, _ in opt.initial_queue] == [
        space.key(space.validate(c)) for c in (TEMPTING, BEST, SECOND)
    ]
    asked, origins = [], []
    for _ in range(3):
        cfg = opt.ask()
        info = opt.last_ask_info
        assert isinstance(info, AskInfo) and info.phase == "warm_start"
        asked.append(cfg)
        origins.append(info.warm_start_origin)
        opt.tell(cfg, Outcome(status="ok", step_time=1.0, peak_memory=0.5 * GIB))
    # The default rule alternates: this study's best under the bank's transfer (mapped, in the
    # turn of the last queued config), the bank's best as measured, mapped again.
    assert [o.rule for o in origins] == ["mapped", "copy", "mapped"]
    assert space.key(asked[1]) == space.key(space.validate(TEMPTING))
    assert origins[1].source_study == "c" and origins[1].trial_id == "run-extra"
    assert (origins[0].source_study, origins[0].trial_id) == ("b", None)  # SECOND's turn
    assert len({space.key(c) for c in asked}) == 3
    # the bank's trials also reach the models: each ask records the transfer's weights, in [0, 1]
    assert opt.transfer is not None
    # the audit records how the transfer's formulas ranked the bank's own trials
    record = WarmStartRecord.read(StudyPaths(tmp_path / "new").bank_warm_start)
    check = opt.transfer.rank_check
    assert record.transfer is not None and check is not None and check.trusted
    assert record.transfer.time_rank_check == TimeRankCheckRecord(**check.to_dict())
    info = opt.info(asked[2])
    assert info is not None and (
        info.config,
        info.phase,
        info.ask_index,
        info.warm_start_origin,
    ) == (asked[2], "warm_start", 2, origins[2])
    assert info.transfer_weights is not None and all(0.0 <= w <= 1.0 for w in info.transfer_weights)
    nxt = opt.ask()
    assert opt.last_ask_info.phase != "warm_start"
    # (with settings.transfer_n_init set, a shortened design may bring the incumbent's replicate this early)
    assert (
        space.key(nxt) not in {space.key(c) for c in asked}
        or opt.last_ask_info.phase == "replicate"
    )


def test_spread_out_keeps_the_best_then_the_farthest_from_those_kept() -> None:
    """The bank's best first, then each time the config sharing the fewest knob values with the
    nearest one kept (ties: the better): near-duplicates of the best wait their turn."""
    cfgs = [(1, 1, 1), (1, 1, 2), (2, 2, 1), (2, 2, 2)]  # best first
    rows = [{"config": dict(zip("abc", c, strict=True)), "rank": i} for i, c in enumerate(cfgs)]
    assert [r["rank"] for r in spread_out(rows, 3, "abc")] == [0, 3, 1]
    assert [r["rank"] for r in spread_out(rows, 9, "abc")] == [0, 3, 1, 2]
    assert spread_out([], 3, "abc") == []


def test_the_default_queue_holds_the_banks_best_and_spreads_the_rest(
    tmp_path: Path, bank: Bank
) -> None:
    contract, rows = new_study(tmp_path, bank.root)
    space = build_optimizer(contract, rows, study_dir=tmp_path / "new").space
    spread = build_optimizer(contract, rows, study_dir=tmp_path / "new").initial_queue
    one = build_optimizer(
        contract, rows, study_dir=tmp_path / "new", settings=OptimizerSettings(warm_start_pool=1)
    ).initial_queue
    assert space.key(spread[0][0]) == space.key(one[0][0])  # the best is kept
    names = [k.name for k in space.knobs]

    def nearest(queue: list[tuple[dict, object]]) -> int:
        return min(
            sum(a.get(n) != b.get(n) for n in names)
            for i, (a, _) in enumerate(queue)
            for b, _ in queue[i + 1 :]
        )

    assert nearest(spread) >= nearest(one)


def test_baseline_comes_first_and_a_config_measured_here_is_not_asked_again(
    tmp_path: Path, bank: Bank
) -> None:
    contract, _ = new_study(tmp_path, bank.root)
    opt = build_optimizer(contract, [], study_dir=tmp_path / "new")
    space = opt.space
    queued = {space.key(c) for c, _ in opt.initial_queue}
    first = opt.ask()
    assert opt.last_ask_info.phase == "baseline"
    assert space.key(first) == space.key(space.validate(BASE))
    opt.tell(first, Outcome(status="ok", step_time=3.0, peak_memory=0.3 * GIB))
    opt.tell(
        BEST, Outcome(status="ok", step_time=1.0, peak_memory=0.5 * GIB)
    )  # already measured here
    batch = opt.ask(3)
    # No trial logged yet, so this machine is unknown and every bank study counts (box-c too):
    # mapped, one of the bank's configs copied (the one farthest from the mapped one), mapped;
    # BEST, measured here, is not asked again.
    assert [i.phase for i in opt.last_ask_info] == ["warm_start"] * 3
    assert [i.warm_start_origin.rule for i in opt.last_ask_info] == ["mapped", "copy", "mapped"]
    assert space.key(batch[1]) in queued
    assert space.key(space.validate(BEST)) not in {space.key(c) for c in batch}
    assert len({space.key(c) for c in batch}) == 3


def test_bank_off_or_empty_gives_the_plain_optimizer(
    tmp_path: Path, bank: Bank, monkeypatch: pytest.MonkeyPatch
) -> None:
    contract, rows = new_study(tmp_path, None)
    monkeypatch.setenv("INFRARSI_BANK", str(bank.root))  # the contract's "off" wins
    opt = build_optimizer(contract, rows, study_dir=tmp_path / "new", bank_root=bank.root)
    assert isinstance(opt, Optimizer) and opt.initial_queue == []
    monkeypatch.delenv("INFRARSI_BANK")
    nowhere, _ = new_study(tmp_path, tmp_path / "no-bank", name="nowhere")
    assert bank_warm_start_configs(nowhere, opt.space, rows) == []
    # The same hardware's other study counts: box-a's study a seeds a new study on box-a.
    only_a = Bank(tmp_path / "bank-a")
    only_a.add_study(tmp_path / "a")
    same_hw, _ = new_study(tmp_path, only_a.root, name="same-hw")
    rows_a = [row("doctor-0", "doctor", BASE, 0.0, step=3.0, mem=0.3, hw="box-a")]
    used = bank_warm_start_configs(same_hw, opt.space, rows_a)
    assert (
        used
        and {p["source_study"] for p in used} == {"a"}
        and all(p["same_hardware"] for p in used)
    )


def test_add_to_bank_after_tune_goes_to_the_contracts_bank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    off = make_study(tmp_path, "off", hw="box-a", switches=switches(None))
    monkeypatch.setenv("INFRARSI_BANK", str(tmp_path / "env-bank"))
    assert add_to_bank(off) == {"disabled": True}
    on = make_study(tmp_path, "done", hw="box-a", switches=switches(tmp_path / "bank"))
    monkeypatch.setenv("INFRARSI_BANK", "off")
    out = add_to_bank(on)
    assert out["rows"] == 15 and Bank(tmp_path / "bank").table().num_rows == 15
    assert not (tmp_path / "env-bank").exists()
    empty = tmp_path / "empty"
    Contract.create(
        ROOT / "workloads/dense_debug.yaml", study_dir=empty, switches=switches(tmp_path / "bank")
    )
    assert "no logged trials" in add_to_bank(empty)["error"]  # reported, never raised


def test_a_study_with_one_editable_knob_proposes_only_that_knob(tmp_path: Path) -> None:
    d = tmp_path / "scoped"
    contract = Contract.create(
        ROOT / "workloads/dense_debug.yaml",
        study_dir=d,
        memory_capacity_bytes=GIB,
        switches=switches(None),
        editable_knobs=["zero_stage"],
    )
    contract.save(d)
    rows = [row(f"doctor-{i}", "doctor", BASE, 100.0 * i, step=3.0, mem=0.3) for i in range(3)]
    rows += [
        row("run-0", "run", {**BASE, "zero_stage": 2}, 400.0, step=2.5, mem=0.4),
        row("run-1", "run", {**BASE, "micro_batch_size": 4}, 500.0, step=1.0, mem=0.5),
    ]  # out of scope
    opt = build_optimizer(contract, rows, study_dir=d)
    base = opt.space.validate(BASE)
    for _ in range(6):
        cfg = opt.ask()
        assert {k for k in cfg if cfg[k] != base[k]} <= {"zero_stage"}, cfg
        opt.tell(
            cfg,
            Outcome(status="ok", step_time=1.0 + cfg["zero_stage"] * 0.1, peak_memory=0.3 * GIB),
        )


def test_without_editable_knobs_the_search_space_is_the_whole_space(tmp_path: Path) -> None:
    contract, _ = new_study(tmp_path, None)
    opt = build_optimizer(contract, [], study_dir=tmp_path / "new")
    full = contract.search_space(tmp_path / "new")
    assert contract.editable.knobs == full.names
    assert opt.space.source == full.source


def _doctor_bank_rows(bank: Bank, study: str, edit: dict[str, dict | None]) -> None:
    """Rewrite ``study``'s bank file with some configs edited as another space would have logged them."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    f = next(f for f in bank.files() if pq.read_table(f).column("study")[0].as_py() == study)
    recs = pq.read_table(f).to_pylist()
    for r in recs:
        if r["trial_id"] in edit:
            r["config"] = json.dumps(edit[r["trial_id"]], sort_keys=True)
    pq.write_table(pa.Table.from_pylist(recs, schema=pq.read_schema(f)), f)


def test_warm_start_revalidates_configs_invalid_in_the_new_space(tmp_path: Path) -> None:
    """A bank config from another space: unknown knobs dropped, missing ones filled from the
    baseline (repaired); a value the new space does not allow: dropped. The report's audit lists
    the entries used, how each was repaired, whether it was tried and how it did."""
    import json

    from infrarsi.report.bank_section import bank_blocks
    from infrarsi.report.data import load_study
    from infrarsi.report.document import Table

    bank = Bank(tmp_path / "bank")
    bank.add_study(make_study(tmp_path, "a", hw="box-a"))
    other_space_best = {k: v for k, v in BEST.items() if k != "threads_per_worker"} | {
        "sequence_parallel": True
    }
    _doctor_bank_rows(
        bank,
        "a",
        {
            "run-2": other_space_best,  # repairable
            "run-0": {
                **BASE,
                "zero_stage": 2,
                "micro_batch_size": 3,
            },  # 3 is not a value of this space
        },
    )
    contract, rows = new_study(tmp_path, bank.root)
    d = tmp_path / "new"
    opt = build_optimizer(contract, rows, study_dir=d)
    space = opt.space
    assert [space.key(c) for c, _ in opt.initial_queue[:2]] == [
        space.key(space.validate(c)) for c in (BEST, THIRD)
    ]
    record = json.loads((d / "bank_warm_start.json").read_text())
    assert record["used"][0]["repairs"] == [
        "dropped unknown knob sequence_parallel=True",
        "filled threads_per_worker=1 from the baseline",
    ]
    assert record["used"][1]["repairs"] == [] and len(record["used"]) == 3
    assert [x["trial_id"] for x in record["dropped"]] == ["run-0"]
    assert "micro_batch_size" in record["dropped"][0]["reason"]
    mapped = opt.ask()  # the default rule: a mapped warm start first (the last entry's turn)
    mapped_info = opt.last_ask_info
    assert mapped_info.warm_start_origin.rule == "mapped"
    opt.tell(mapped, Outcome(status="ok", step_time=2.0, peak_memory=0.5 * GIB))
    cfg = opt.ask()
    info = opt.last_ask_info
    assert info.phase == "warm_start" and info.warm_start_origin.repairs == tuple(
        record["used"][0]["repairs"]
    )
    assert (
        json.loads(json.dumps(info.to_dict()))["warm_start_origin"]["repairs"]
        == record["used"][0]["repairs"]
    )
    # The study runs the mapped config (2 s, in the last entry's turn) and the repaired one (1.2 s
    # against its 3 s baseline); THIRD never runs.
    write_rows(
        d,
        [
            *rows,
            row(
                "run-0",
                "run",
                mapped,
                380.0,
                step=2.0,
                mem=0.5,
                hw="box-c",
                extra=TrialExtra(ask_info=mapped_info.to_dict()),
            ),
            row(
                "run-1",
                "run",
                cfg,
                400.0,
                step=1.2,
                mem=0.5,
                hw="box-c",
                extra=TrialExtra(ask_info=info.to_dict()),
            ),
        ],
    )
    (d / "doctor.json").write_text(
        (tmp_path / "a" / "doctor.json").read_text().replace("2.05", "3.0")
    )
    blocks = bank_blocks(load_study(d))
    used = next(b for b in blocks if isinstance(b, Table) and "re-validation" in b.headers)
    assert [r[0] for r in used.rows] == ["a", "a", "a"]
    assert (
        "dropped unknown knob sequence_parallel" in used.rows[0][4]
        and "tried: run-1 (ok); 2.50x" in used.rows[0][5]
    )
    assert used.rows[1][4] == "valid as measured" and used.rows[1][5].startswith("not tried")
    assert used.rows[2][5].startswith("not tried (its turn asked a mapped warm start")
    dropped = next(b for b in blocks if isinstance(b, Table) and "why invalid here" in b.headers)
    assert dropped.rows[0][0] == "a, run-0" and "micro_batch_size" in dropped.rows[0][2]
    # An entry expected not to fit here runs as its memory-saving repair: the audit says so, once.
    third = record["used"][1]["config"]
    assert third["micro_batch_size"] == 4
    saver = {**third, "micro_batch_size": 2}
    rep_info = {
        "config": saver,
        "phase": "warm_start",
        "ask_index": 2,
        "repair_of": record["used"][1]["config"],
        "repair_moves": ["micro_batch_size: 4 -> 2"],
        "paired": "warm_start",
        "warm_start_origin": {"source_study": "a"},
    }
    write_rows(
        d,
        [
            *rows,
            row(
                "run-0",
                "run",
                cfg,
                400.0,
                step=1.2,
                mem=0.5,
                hw="box-c",
                extra=TrialExtra(ask_info=info.to_dict()),
            ),
            row(
                "run-1",
                "run",
                saver,
                500.0,
                step=2.0,
                mem=0.4,
                hw="box-c",
                extra=TrialExtra(ask_info=rep_info),
            ),
        ],
    )
    used2 = next(
        b
        for b in bank_blocks(load_study(d))
        if isinstance(b, Table) and "re-validation" in b.headers
    )
    assert len(used2.rows) == 3
    assert used2.rows[1][5] == (
        "expected not to fit here; tried as its repair (micro_batch_size: 4 -> 2): "
        "run-1 (ok); 1.50x vs baseline"
    )
    # the same bank inside the models: study a's ok and oom trials (13; run-0 dropped), and run-0's weights
    assert record["transfer"]["sources"] == [
        {
            "study": "a",
            "key": record["transfer"]["sources"][0]["key"],
            "similarity": 1.0,
            "rows": 12,
            "dropped": 1,
            "own_prior": True,
        }
    ]
    sources = next(b for b in blocks if isinstance(b, Table) and "trials used" in b.headers)
    assert sources.rows == [["a", "1", "12", "1", "yes"]]
    weights = next(b for b in blocks if isinstance(b, Table) and "residual weight" in b.headers)
    assert info.transfer_weights is not None and mapped_info.transfer_weights is not None
    assert weights.rows == [
        [tid, f"{tw[0]:.2f}", f"{tw[1]:.2f}"]
        for tid, tw in (("run-0", mapped_info.transfer_weights), ("run-1", info.transfer_weights))
    ]


def test_a_bank_that_cannot_be_written_never_fails_the_stage(tmp_path: Path) -> None:
    (tmp_path / "not-a-dir").write_text("a file where the bank's folder should be")
    s = make_study(tmp_path, "s", hw="box-a", switches=switches(tmp_path / "not-a-dir"))
    out = add_to_bank(s, stage="doctor")
    assert "error" in out and out["root"] == str(tmp_path / "not-a-dir")
    uri = make_study(
        tmp_path,
        "u",
        hw="box-a",
        switches=StudySwitches(
            analytic_prior=True, loss_guard=True, bank=(tmp_path / "uri-bank").as_uri()
        ),
    )
    assert add_to_bank(uri, stage="verify")["rows"] == 15
    assert Bank((tmp_path / "uri-bank").as_uri()).stats()["studies"] == 1


def test_a_tune_trial_lost_before_it_ran_is_not_told_failed_and_one_that_ran_gets_its_row(
    tmp_path: Path,
) -> None:
    """Tune ends a trial in error when its actor died beyond the retries: the searcher tells the
    row the executor logged for that Tune trial, or nothing when it never ran (its config goes
    back to the pool instead of being marked failed)."""
    from infrarsi.orchestration.optimizer_factory import logged_row, make_searcher

    contract, rows = new_study(tmp_path, None)
    d = tmp_path / "new"
    opt = build_optimizer(contract, rows, study_dir=d)
    searcher = make_searcher(opt, info_key="__info__", study_dir=d)
    ran = {k: v for k, v in searcher.suggest("tune-ran").items() if k != "__info__"}
    lost = {k: v for k, v in searcher.suggest("tune-lost").items() if k != "__info__"}
    write_rows(
        d,
        [
            row(
                "run-0000",
                "run",
                ran,
                600.0,
                step=1.5,
                mem=0.4,
                extra=TrialExtra(tune_trial_id="tune-ran"),
            )
        ],
        name="seg9",
    )
    assert logged_row(d, "tune-ran") is not None and logged_row(d, "tune-lost") is None
    searcher.on_trial_complete("tune-ran", result=None, error=True)
    searcher.on_trial_complete("tune-lost", result=None, error=True)
    told = {opt.space.key(o.config): o.outcome.status for o in opt.observations}
    assert told[opt.space.key(ran)] == "ok"  # the executor's row, not "failed"
    assert opt.space.key(lost) not in told and opt.space.key(lost) not in opt.pending
    assert not opt.drop_pending(lost)  # no longer pending


def test_a_resumed_study_asks_its_warm_starts_once_over_its_runs(
    tmp_path: Path, bank: Bank, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``build_optimizer`` again on the log of a study whose first ``run`` asked warm starts: the
    queue holds only the bank configs not measured here, and no more than the warm-start turns
    left (a mapped turn counts, though no bank entry names its config)."""
    monkeypatch.setenv("INFRARSI_BANK", "off")
    contract, rows = new_study(tmp_path, bank.root)
    opt = build_optimizer(contract, rows, study_dir=tmp_path / "new")
    queued = [c for c, _ in opt.initial_queue]
    logged = list(rows)
    for i in range(3):
        cfg = opt.ask()
        info = opt.last_ask_info
        opt.tell(cfg, Outcome(status="ok", step_time=1.0, peak_memory=0.5 * GIB))
        logged.append(
            row(
                f"run-{i}",
                "run",
                cfg,
                500.0 + i,
                step=1.0,
                mem=0.5,
                hw="box-c",
                extra=TrialExtra(ask_info=info.to_dict()),
            )
        )
        again = build_optimizer(contract, logged, study_dir=tmp_path / "new")
        left = [c for c, _ in again.initial_queue]
        seen = {again.space.key(again.space.validate(r.config)) for r in logged}
        assert len(left) == 2 - i and not {again.space.key(c) for c in left} & seen
        assert all(any(again.space.key(c) == again.space.key(q) for q in queued) for c in left)
    assert again.ask() is not None and again.last_ask_info.phase != "warm_start"
