"""The proposal protocol: proposals checked against the contract, the study's state with the
optimizer's predictions, and a proposal that runs, is verified and is reported with its reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from infrarsi.errors import PatchError, ProposalError, SearchSpaceError, UserInputError
from infrarsi.stages.propose import propose, study_state
from infrarsi.study.proposals import ProposalQueue

ROOT = Path(__file__).resolve().parents[2]


def test_a_proposal_inside_the_scope_is_queued_with_the_baseline_filled_in(study: Path) -> None:
    p = propose(study, {"micro_batch_size": 2}, why="the GPUs are underfed at micro-batch 1", proposer="agent-7")
    assert p.proposal_id == "prop-0001" and p.asked == {"micro_batch_size": 2}
    assert p.config["micro_batch_size"] == 2 and p.config["activation_checkpointing"] == "full"  # the baseline's
    assert [q.proposal_id for q in ProposalQueue(study).queued()] == ["prop-0001"]
    state = study_state(study)
    assert state["proposals"]["queued"][0]["why"].startswith("the GPUs")
    assert set(state["scope"]["editable_knobs"]) == {"micro_batch_size", "zero_stage"}
    assert state["budget"]["run_trials_left"] == 4


@pytest.mark.parametrize(("config", "why", "error", "needle"), [
    ({"activation_checkpointing": "none"}, "faster", ProposalError, "editable.knobs"),  # not editable
    ({"no_such_knob": 1}, "faster", SearchSpaceError, "no_such_knob"),
    ({"micro_batch_size": 3}, "faster", SearchSpaceError, "micro_batch_size"),
    ({"micro_batch_size": 2}, "  ", ProposalError, "--why"),
])
def test_a_proposal_that_breaks_the_contract_is_refused_with_the_rule(study: Path, config, why, error, needle) -> None:
    with pytest.raises(error) as e:
        propose(study, config, why=why)
    assert isinstance(e.value, UserInputError) and needle in str(e.value)
    assert ProposalQueue(study).queued() == []


def _diff(tmp_path: Path, path: str) -> Path:
    old = (ROOT / path).read_text().splitlines(keepends=True)
    new = [*old, "# proposed\n"]
    import difflib

    text = "".join(difflib.unified_diff(old, new, f"a/{path}", f"b/{path}"))
    out = tmp_path / "p.diff"
    out.write_text(f"diff --git a/{path} b/{path}\n" + text)
    return out


def test_a_patch_outside_the_editable_globs_is_refused(study: Path, tmp_path: Path) -> None:
    with pytest.raises(PatchError, match="outside the contract's editable scope"):
        propose(study, {}, why="edit the harness", patch=_diff(tmp_path, "infrarsi/units.py"))


def test_a_patch_inside_the_globs_is_checked_and_kept_in_the_study(study: Path, tmp_path: Path) -> None:
    p = propose(study, {}, why="a note in the model", patch=_diff(tmp_path, "workloads/jobs.py"))
    assert p.patch == "proposals/patches/prop-0001.diff" and p.patch_paths == ["workloads/jobs.py"]
    assert (study / p.patch).read_text().endswith("+# proposed\n")


def test_the_state_predicts_configs_with_the_optimizers_models(study: Path) -> None:
    state = study_state(study, predict=[{"micro_batch_size": 4}, {}])
    a, b = state["predictions"]
    assert a["config"]["micro_batch_size"] == 4 and b["config"]["micro_batch_size"] == 1
    for p in (a, b):
        assert set(p) >= {"step_time_mean_s", "p_fit", "p_ok", "memory_mean_bytes"}
        assert p["p_fit"] is None or 0.0 <= p["p_fit"] <= 1.0


@pytest.mark.integration
def test_proposals_from_the_cli_and_mcp_run_are_verified_and_are_in_the_report(study: Path, ray_local: str) -> None:
    from infrarsi.stages.doctor import doctor_stage
    from infrarsi.stages.report import write_report
    from infrarsi.stages.run import run_stage
    from infrarsi.stages.verify import verify_stage
    from infrarsi.study.trial_log import read_trials, rows

    doctor_stage(study, repeats=2)
    cli = subprocess.run([sys.executable, "-m", "infrarsi", "propose", str(study), "--config", '{"micro_batch_size": 4, "zero_stage": 1}',
                          "--why", "ZeRO-1 at micro-batch 4: fewer gathers, fuller GEMMs", "--proposer", "test-agent"],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    _propose_through_mcp(study)
    run_stage(study, trials=3, progress=False)
    run = [r for r in rows(read_trials(study)) if r.stage == "run"]
    mine, agents = [r for r in run if r.extra.get("proposal")]
    assert [mine, agents] == run[:2] and mine.extra["ask_info"]["phase"] == "proposal"
    assert mine.config["micro_batch_size"] == 4 and mine.config["zero_stage"] == 1
    assert mine.extra["proposal"]["proposer"] == "test-agent"
    assert agents.extra["proposal"]["proposer"] == "mcp" and agents.config["micro_batch_size"] == 2
    verify_stage(study, top_k=3, pairs=2, rounds=1)
    verified = json.loads((study / "verify.json").read_text())
    assert any(c["config"] == mine.config for c in verified["candidates"]) or mine.status != "ok"
    write_report(study)
    md = (study / "report.md").read_text()
    assert "Proposals from agents and people" in md and "fewer gathers, fuller GEMMs" in md
    assert "micro-batch 2 through MCP" in md


def _propose_through_mcp(study: Path) -> None:
    import asyncio

    mcp = pytest.importorskip("mcp")
    from infrarsi.mcp_server import build_server, tool_text

    async def session() -> None:
        async with mcp.Client(build_server(study)) as client:
            res = await client.call_tool("propose", {"config": {"micro_batch_size": 2},
                                                     "why": "micro-batch 2 through MCP"})
            assert not res.is_error, tool_text(res)

    asyncio.run(session())
