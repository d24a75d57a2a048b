"""Every stage feeds the experience bank as it ends (here: doctor, on the surrogate backend, no
Ray); ingest after each stage replaces the study's rows; a bank that is off is left alone."""

from __future__ import annotations

from pathlib import Path

from infrarsi.bank.store import Bank

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "stages" / "surrogate_small.yaml"


def test_doctor_feeds_the_contracts_bank(tmp_path: Path) -> None:
    from infrarsi.bank.feed import add_to_bank
    from infrarsi.stages.doctor import doctor_stage
    from infrarsi.stages.init import init_stage

    study = tmp_path / "study"
    init_stage(FIXTURE, study, bank=(tmp_path / "bank").as_uri())
    doctor_stage(study, repeats=2)
    bank = Bank((tmp_path / "bank").as_uri())
    rows = bank.query()
    assert rows and {r["stage"] for r in rows} == {"doctor"} and len(bank.files()) == 1
    r = rows[0]
    assert (
        r["hw_simulated"] is True
        and r["wl_n_layers"]
        and r["wl_tokens_per_step"]
        and r["par_world_size"]
    )
    assert add_to_bank(study, stage="run")["rows"] == len(
        rows
    )  # the next stage's ingest replaces it
    assert len(bank.files()) == 1 and bank.table().num_rows == len(rows)


def test_a_study_with_the_bank_off_writes_nothing(tmp_path: Path) -> None:
    from infrarsi.stages.doctor import doctor_stage
    from infrarsi.stages.init import init_stage

    study = tmp_path / "study"
    init_stage(FIXTURE, study, bank="off")
    doctor_stage(study, repeats=2)
    assert not any(p.suffix == ".parquet" for p in tmp_path.rglob("*"))
