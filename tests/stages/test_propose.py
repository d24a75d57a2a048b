"""The proposal protocol: proposals checked against the contract, the study's state with the
optimizer's predictions, and a proposal that runs, is verified and is reported with its reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from infrarsi.errors import PatchError, ProposalError, SearchSpaceError, UserInputError
from infrarsi.stages.propose import TOOL_FIELDS, propose, study_state, withdraw
from infrarsi.study.proposals import ProposalQueue

ROOT = Path(__file__).resolve().parents[2]


def test_a_proposal_inside_the_scope_is_queued_with_the_baseline_filled_in(study: Path) -> None:
    p = propose(
        study,
        {"micro_batch_size": 2},
        why="the GPUs are underfed at micro-batch 1",
        proposer="agent-7",
    )
    assert p.proposal_id == "prop-0001" and p.asked == {"micro_batch_size": 2}
    assert (
        p.config["micro_batch_size"] == 2 and p.config["activation_checkpointing"] == "full"
    )  # the baseline's
    assert [q.proposal_id for q in ProposalQueue(study).queued()] == ["prop-0001"]
    state = study_state(study)
    assert state["proposals"]["queued"][0]["why"].startswith("the GPUs")
    assert set(state["scope"]["editable_knobs"]) == {"micro_batch_size", "zero_stage"}
    assert state["budget"]["run_trials_left"] == 4


@pytest.mark.parametrize(
    ("config", "why", "error", "needle"),
    [
        (
            {"activation_checkpointing": "none"},
            "faster",
            ProposalError,
            "editable.knobs",
        ),  # not editable
        ({"no_such_knob": 1}, "faster", SearchSpaceError, "no_such_knob"),
        ({"micro_batch_size": 3}, "faster", SearchSpaceError, "micro_batch_size"),
        ({"micro_batch_size": 2}, "  ", ProposalError, "--why"),
    ],
)
def test_a_proposal_that_breaks_the_contract_is_refused_with_the_rule(
    study: Path, config, why, error, needle
) -> None:
    with pytest.raises(error) as e:
        propose(study, config, why=why)
    assert isinstance(e.value, UserInputError) and needle in str(e.value)
    assert ProposalQueue(study).queued() == []


@pytest.fixture
def conditional(tmp_path: Path) -> Path:
    """The surrogate study with ``offload_optimizer`` editable too: a knob with a ``when``
    condition (``zero_stage >= 1``) an agent can get wrong."""
    from infrarsi.stages.init import init_stage

    d = tmp_path / "conditional"
    init_stage(
        ROOT / "tests" / "fixtures" / "stages" / "surrogate_small.yaml",
        d,
        editable_knobs=["micro_batch_size", "zero_stage", "offload_optimizer"],
        trials=4,
        bank="off",
    )
    return d


def test_a_knob_set_where_its_condition_is_false_is_refused_not_dropped(conditional: Path) -> None:
    with pytest.raises(ProposalError) as e:
        propose(conditional, {"zero_stage": 0, "offload_optimizer": True}, why="offload at ZeRO-0")
    msg = str(e.value)
    assert (
        "'offload_optimizer': inactive" in msg
        and "zero_stage >= 1" in msg
        and "{'zero_stage': 0}" in msg
    )
    assert ProposalQueue(conditional).queued() == []
    # at its default an inactive knob drops nothing: accepted; where the condition holds, taken as asked
    assert (
        propose(conditional, {"zero_stage": 0, "offload_optimizer": False}, why="ZeRO-0").config[
            "zero_stage"
        ]
        == 0
    )
    assert propose(conditional, {"zero_stage": 1, "offload_optimizer": True}, why="offload").config[
        "offload_optimizer"
    ]


def test_a_candidate_already_queued_is_refused_naming_the_proposal(study: Path) -> None:
    propose(study, {"micro_batch_size": 2}, why="first")
    with pytest.raises(ProposalError, match=r"duplicate: .*queued proposal prop-0001 \('first'\)"):
        propose(
            study,
            {"micro_batch_size": 2, "zero_stage": 3},
            why="the same, spelled with the baseline's ZeRO",
        )
    assert [p.proposal_id for p in ProposalQueue(study).queued()] == ["prop-0001"]
    withdraw(study, "prop-0001")  # withdrawn: no longer queued, so it may be proposed again
    assert propose(study, {"micro_batch_size": 2}, why="again").proposal_id == "prop-0002"
    assert ProposalQueue(study).take().proposal_id == "prop-0002"  # a run trial took it; no row yet
    with pytest.raises(
        ProposalError, match=r"proposal in flight \(taken by a run trial\) prop-0002"
    ):
        propose(study, {"micro_batch_size": 2}, why="while it runs")


def test_a_candidate_already_measured_is_refused_naming_the_trial(study: Path) -> None:
    from synthetic_study import row, write_rows

    from infrarsi.orchestration.common import baseline_config
    from infrarsi.study.contract import Contract

    base = baseline_config(Contract.load(study), study)
    write_rows(
        study,
        [
            row("run-0001", "run", {**base, "micro_batch_size": 4}, 1.0, step=2.0),
            row("run-0002", "run", {**base, "micro_batch_size": 8}, 2.0, status="failed"),
            row("doctor-0003", "doctor", {**base, "micro_batch_size": 2}, 0.5, step=2.5),
        ],
    )
    with pytest.raises(
        ProposalError, match=r"duplicate: .*run trial run-0001 \(ok, step_time_s=2.0\)"
    ):
        propose(study, {"micro_batch_size": 4}, why="measured already")
    assert (
        propose(
            study, {"micro_batch_size": 8}, why="its trial failed: it measured nothing"
        ).proposal_id
        == "prop-0001"
    )
    assert (
        propose(
            study, {"micro_batch_size": 2}, why="doctor's calibration is no candidate"
        ).proposal_id
        == "prop-0002"
    )


def test_withdraw_moves_a_queued_proposal_aside_and_refuses_any_other(study: Path) -> None:
    propose(study, {"micro_batch_size": 2}, why="first")
    propose(study, {"micro_batch_size": 4}, why="second")
    assert withdraw(study, "prop-0001").asked == {"micro_batch_size": 2}
    queue = ProposalQueue(study)
    assert [p.proposal_id for p in queue.queued()] == ["prop-0002"]
    assert queue.take().proposal_id == "prop-0002"  # a run trial never sees the withdrawn one
    assert [p["proposal_id"] for p in study_state(study)["proposals"]["withdrawn"]] == ["prop-0001"]
    with pytest.raises(ProposalError, match="'prop-0002' is already taken by a run trial"):
        withdraw(study, "prop-0002")
    with pytest.raises(ProposalError, match="'prop-0009' is not a proposal of this study"):
        withdraw(study, "prop-0009", fields=TOOL_FIELDS)


def test_refusals_name_the_fields_as_the_caller_spells_them(study: Path, tmp_path: Path) -> None:
    with pytest.raises(ProposalError) as e:
        propose(study, {"micro_batch_size": 2}, why=" ", fields=TOOL_FIELDS)
    assert (
        "propose why:" in str(e.value)
        and '"why": "' in str(e.value)
        and "--why" not in str(e.value)
    )
    with pytest.raises(ProposalError) as e:
        propose(study, {"activation_checkpointing": "none"}, why="x", fields=TOOL_FIELDS)
    assert "propose config: knob 'activation_checkpointing': out of scope" in str(e.value)
    assert "--" not in str(e.value)


def test_a_patch_given_as_text_is_checked_and_kept_or_refused_without_a_file_name(
    study: Path, tmp_path: Path
) -> None:
    text = _diff(tmp_path, "workloads/jobs.py").read_text()
    with pytest.raises(PatchError) as e:
        propose(
            study,
            {},
            why="edit the harness",
            patch_text=_diff(tmp_path, "infrarsi/units.py").read_text(),
            fields=TOOL_FIELDS,
        )
    assert "propose patch" in str(e.value) and "proposals/patches" not in str(e.value)
    assert not list((study / "proposals" / "patches").glob("*.diff"))
    p = propose(study, {}, why="a note in the model", patch_text=text, fields=TOOL_FIELDS)
    assert (study / p.patch).read_text() == text and p.patch_paths == ["workloads/jobs.py"]
    with pytest.raises(ProposalError, match=r"duplicate: .*prop-0001 .* and patch"):
        propose(study, {}, why="the same patch again", patch_text=text, fields=TOOL_FIELDS)
    assert [f.name for f in (study / "proposals" / "patches").glob("*.diff")] == ["prop-0001.diff"]


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


def test_a_patch_inside_the_globs_is_checked_and_kept_in_the_study(
    study: Path, tmp_path: Path
) -> None:
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
def test_proposals_from_the_cli_and_mcp_run_are_verified_and_are_in_the_report(
    study: Path, ray_local: str
) -> None:
    from infrarsi.stages.doctor import doctor_stage
    from infrarsi.stages.report import write_report
    from infrarsi.stages.run import run_stage
    from infrarsi.stages.verify import verify_stage
    from infrarsi.study.trial_log import read_trials, rows

    doctor_stage(study, repeats=2)
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "infrarsi",
            "propose",
            str(study),
            "--config",
            '{"micro_batch_size": 4, "zero_stage": 1}',
            "--why",
            "ZeRO-1 at micro-batch 4: fewer gathers, fuller GEMMs",
            "--proposer",
            "test-agent",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cli.returncode == 0, cli.stderr
    _propose_through_mcp(study)
    run_stage(study, trials=3, progress=False)
    run = [r for r in rows(read_trials(study)) if r.stage == "run"]
    mine, agents = [r for r in run if r.extra.proposal]
    assert [mine, agents] == run[:2] and mine.extra.ask_info["phase"] == "proposal"
    assert mine.config["micro_batch_size"] == 4 and mine.config["zero_stage"] == 1
    assert mine.extra.proposal["proposer"] == "test-agent"
    assert agents.extra.proposal["proposer"] == "mcp" and agents.config["micro_batch_size"] == 2
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
    from infrarsi.integrations.mcp_server import build_server, tool_text

    async def session() -> None:
        async with mcp.Client(build_server(study)) as client:
            res = await client.call_tool(
                "propose", {"config": {"micro_batch_size": 2}, "why": "micro-batch 2 through MCP"}
            )
            assert not res.is_error, tool_text(res)

    asyncio.run(session())
