"""The candidate record: knobs and patches with their digests are one identity."""

from __future__ import annotations

from pathlib import Path

from infrarsi.result import TrialExtra, TrialResult
from infrarsi.study.candidate import Candidate, PatchRef, file_sha256, patch_source

CFG = {"zero_stage": 0, "micro_batch_size": 8}


def test_the_same_knobs_with_another_patch_or_none_are_other_candidates() -> None:
    plain = Candidate(CFG)
    cheat = Candidate(
        CFG, (PatchRef("proposals/patches/prop-0001.diff", "a" * 64, "proposal", "prop-0001"),)
    )
    honest = Candidate(
        CFG, (PatchRef("proposals/patches/prop-0002.diff", "b" * 64, "proposal", "prop-0002"),)
    )
    assert len({plain.key, cheat.key, honest.key}) == 3
    # The same patch bytes proposed twice, under another id, are the same candidate.
    again = Candidate(
        dict(reversed(list(CFG.items()))),
        (PatchRef("proposals/patches/prop-0003.diff", "a" * 64, "proposal", "prop-0003"),),
    )
    assert again.key == cheat.key
    # The order of a patch set is part of it.
    ab = Candidate(CFG, (PatchRef("x.diff", "1" * 64), PatchRef("y.diff", "2" * 64)))
    ba = Candidate(CFG, (PatchRef("y.diff", "2" * 64), PatchRef("x.diff", "1" * 64)))
    assert ab.key != ba.key


def test_a_row_names_its_candidate_and_the_record_round_trips(tmp_path: Path) -> None:
    f = tmp_path / "p.diff"
    f.write_text("diff --git a/x b/x\n")
    assert (
        file_sha256(f) == file_sha256(f)
        and len(file_sha256(f)) == 64
        and file_sha256(tmp_path / "no") == ""
    )
    row = TrialResult(
        trial_id="run-0003",
        stage="run",
        config=dict(CFG),
        status="ok",
        patches=["proposals/patches/prop-0001.diff"],
        patch_sha256=[file_sha256(f)],
        extra=TrialExtra(proposal={"proposal_id": "prop-0001"}),
    )
    c = Candidate.from_row(row)
    assert c.proposal_patch == "proposals/patches/prop-0001.diff" and c.proposal_id == "prop-0001"
    assert c.patches[0].sha256 == file_sha256(f) and c.patches[0].source == "proposal"
    assert Candidate.from_dict(c.to_dict()) == c and Candidate.from_dict(c.to_dict()).key == c.key
    assert not c.is_untouched(CFG) and Candidate(CFG).is_untouched(dict(CFG))
    assert patch_source("workloads/patches/rope_complex.diff") == "knob"
    # A knob's patch is run through the config, not as a proposal's patch file.
    knob = Candidate.from_row(
        TrialResult(
            trial_id="run-1",
            stage="run",
            config=CFG,
            patches=["workloads/patches/rope_complex.diff"],
            patch_sha256=["c" * 64],
        )
    )
    assert knob.proposal_patch is None and "rope_complex.diff" in knob.describe()
