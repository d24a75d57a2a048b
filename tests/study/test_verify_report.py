"""verify.json's typed record: what verify writes loads back, older and hand-written records load,
bad ones are named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infrarsi.errors import StudyError
from infrarsi.study.verify_report import VerifiedCandidate, VerifyReport, VerifyRound


def _report() -> VerifyReport:
    cand = VerifiedCandidate(
        config={"zero_stage": 1, "micro_batch_size": 4},
        patches=[
            {
                "path": "patches/fast.patch",
                "sha256": "ab" * 32,
                "source": "knob",
                "proposal_id": None,
            }
        ],
        candidate_key="k1",
        accepted=True,
        speedup=2.5,
        ci_low=2.1,
        ci_high=2.8,
        ci_coverage=0.969,
        ci_method="order-statistic interval",
        n_pairs=6,
        trial_ids=["t1", "t2"],
        rounds=[
            VerifyRound(
                round=0, ratios=[2.4, 2.6, 2.5], statuses=["ok"] * 3, passed=True, median_ratio=2.5
            )
        ],
        diff_vs_baseline={"zero_stage": [3, 1]},
    )
    return VerifyReport(
        best=cand,
        candidates=[cand],
        baseline_config={"zero_stage": 3},
        noise_margin=0.02,
        pairs=3,
        rounds=2,
        confidence=0.95,
        rule="r",
    )


def test_what_verify_writes_loads_back_equal(tmp_path: Path) -> None:
    report = _report()
    path = report.save(tmp_path)
    assert path == tmp_path / "verify.json"
    back = VerifyReport.load_if_present(tmp_path)
    assert back == report
    assert back is not None and back.best is not None
    cand = back.best.candidate
    assert cand.config == {"zero_stage": 1, "micro_batch_size": 4}
    assert [p.sha256 for p in cand.patches] == ["ab" * 32]


def test_an_older_record_without_patches_loads_with_patches_none(tmp_path: Path) -> None:
    (tmp_path / "verify.json").write_text(
        json.dumps(
            {
                "best": {"config": {"a": 1}, "accepted": True, "speedup": 1.5},
                "candidates": [],
                "extra_key_of_a_newer_version": 1,
            }
        )
    )
    back = VerifyReport.load_if_present(tmp_path)
    assert back is not None and back.best is not None
    assert back.best.patches is None and back.best.trial_ids == [] and back.best.accepted


def test_no_verify_yet_is_none_and_a_malformed_record_names_file_field_and_fix(
    tmp_path: Path,
) -> None:
    assert VerifyReport.load_if_present(tmp_path) is None
    (tmp_path / "verify.json").write_text(json.dumps({"best": {"speedup": "fast"}}))
    with pytest.raises(StudyError, match=r"verify\.json: field 'best\.speedup'.*infrarsi verify"):
        VerifyReport.load_if_present(tmp_path)
    (tmp_path / "verify.json").write_text("{not json")
    with pytest.raises(StudyError, match="must be JSON"):
        VerifyReport.load_if_present(tmp_path)


def test_a_bare_patch_path_of_an_older_record_reads_as_a_dict() -> None:
    c = VerifiedCandidate(config={"a": 1}, patches=["p.patch"])
    assert c.patch_dicts() == [{"path": "p.patch"}]
    assert c.candidate.patches[0].path == "p.patch"
