"""``infrarsi mcp DIR``: the study's MCP server, reached by the official SDK client, in process
and over stdio (the way a coding agent starts it). An agent should need nothing but what the
server says: the knobs in the tool schemas, descriptions on every parameter, read-only hints,
resources, and refusals in the tools' own terms."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from infrarsi.integrations.mcp_server import RESOURCES, build_server, tool_text
from infrarsi.study.proposals import ProposalQueue

mcp = pytest.importorskip("mcp")
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "stages"


def _session(target: object, body: Callable[[Any], Awaitable[Any]]) -> Any:
    """Run ``body(client)`` in a client session with ``target`` (a server, or stdio parameters)."""

    async def go() -> Any:
        async with mcp.Client(target) as client:
            return await body(client)

    return asyncio.run(go())


async def _call(client: Any, tool: str, args: dict[str, Any], *, ok: bool = True) -> Any:
    """The tool's result, parsed as JSON when ok (its error text otherwise)."""
    res = await client.call_tool(tool, args)
    assert res.is_error is not ok, tool_text(res)
    return json.loads(tool_text(res)) if ok else tool_text(res)


@pytest.fixture
def conditional(tmp_path: Path) -> Path:
    """The surrogate study with ``offload_optimizer`` (``when: zero_stage >= 1``) editable too."""
    from infrarsi.stages.init import init_stage

    d = tmp_path / "conditional"
    init_stage(
        FIXTURES / "surrogate_small.yaml",
        d,
        trials=4,
        bank="off",
        editable_knobs=["micro_batch_size", "zero_stage", "offload_optimizer"],
    )
    return d


def test_the_tools_carry_the_studys_knobs_descriptions_and_hints(conditional: Path) -> None:
    from infrarsi.cli.app import package_version

    async def body(client: Any) -> None:
        assert client.server_info.version == package_version() != ""
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == {
            "state",
            "predict",
            "watch",
            "propose",
            "withdraw",
            "run_trials",
            "report",
        }
        config = tools["propose"].input_schema["properties"]["config"]
        assert config["additionalProperties"] is False
        assert set(config["properties"]) == {"micro_batch_size", "zero_stage", "offload_optimizer"}
        assert config["properties"]["micro_batch_size"]["enum"] == [1, 2, 4, 8, 16, 32]
        assert config["properties"]["zero_stage"]["enum"] == [0, 1, 2, 3]
        off = config["properties"]["offload_optimizer"]
        assert (
            off["type"] == "boolean"
            and "zero_stage >= 1" in off["description"]
            and "ZeRO-Offload" in off["description"]
        )
        assert "'activation_checkpointing': 'full'" in config["description"]  # pinned, named
        assert tools["predict"].input_schema["properties"]["configs"]["items"] == config
        for t in tools.values():
            assert t.description and "``" not in t.description, t.name
            for name, prop in t.input_schema.get("properties", {}).items():
                assert prop.get("description") and "``" not in json.dumps(prop), (t.name, name)
            assert t.annotations.read_only_hint is (t.name in {"state", "predict", "watch"}), t.name

    _session(build_server(conditional), body)


def test_the_contract_space_and_report_are_resources(study: Path) -> None:
    async def body(client: Any) -> dict[str, str]:
        listed = {str(r.uri) for r in (await client.list_resources()).resources}
        assert listed == set(RESOURCES.values())
        return {n: (await client.read_resource(u)).contents[0].text for n, u in RESOURCES.items()}

    texts = _session(build_server(study), body)
    assert texts["contract"] == (study / "contract.yaml").read_text()
    assert "name: surrogate-gpu" in texts["search_space"] and "No report yet" in texts["report"]


def test_an_agent_reads_the_state_and_proposes_through_the_tools(study: Path) -> None:
    async def body(client: Any) -> None:
        await _call(
            client, "propose", {"config": {"micro_batch_size": 2}, "why": "an agent's reason"}
        )
        refused = await _call(
            client,
            "propose",
            {"config": {"activation_checkpointing": "none"}, "why": "not mine to change"},
            ok=False,
        )
        assert "editable.knobs" in refused and "leave activation_checkpointing out" in refused
        assert "an agent's reason" in json.dumps(await _call(client, "state", {}))
        (pred,) = (await _call(client, "predict", {"configs": [{"micro_batch_size": 4}]}))[
            "predictions"
        ]
        assert "p_fit" in pred

    _session(build_server(study), body)
    (p,) = ProposalQueue(study).queued()
    assert p.proposer == "mcp" and p.asked == {"micro_batch_size": 2}


def test_refusals_speak_of_the_tool_call_not_cli_flags_or_files(
    study: Path, tmp_path: Path
) -> None:
    outside = (
        "diff --git a/infrarsi/units.py b/infrarsi/units.py\n--- a/infrarsi/units.py\n"
        "+++ b/infrarsi/units.py\n@@ -1 +1,2 @@\n x\n+y\n"
    )

    async def body(client: Any) -> list[str]:
        return [
            await _call(client, "propose", args, ok=False)
            for args in (
                {"config": {"micro_batch_size": 2}, "why": "  "},
                {"config": {"micro_batch_size": 3}, "why": "odd"},
                {"config": {}, "why": "edit the harness", "patch": outside},
            )
        ]

    why, value, patch = _session(build_server(study), body)
    assert "propose why: rule" in why and '"why": "' in why
    assert "micro_batch_size" in value and "one of [1, 2, 4, 8, 16, 32]" in value
    assert "propose patch" in patch and "outside the contract's editable scope" in patch
    for text in (why, value, patch):
        assert "--" not in text.replace("--- a/", "") and "/tmp" not in text, text


def test_an_inactive_knob_and_a_duplicate_are_reported_and_a_proposal_withdrawn(
    conditional: Path,
) -> None:
    async def body(client: Any) -> None:
        inactive = await _call(
            client,
            "propose",
            {"config": {"zero_stage": 0, "offload_optimizer": True}, "why": "offload at ZeRO-0"},
            ok=False,
        )
        assert "'offload_optimizer': inactive" in inactive and "zero_stage >= 1" in inactive
        first = await _call(
            client, "propose", {"config": {"micro_batch_size": 4}, "why": "fuller GEMMs"}
        )
        dup = await _call(
            client, "propose", {"config": {"micro_batch_size": 4}, "why": "again"}, ok=False
        )
        assert (
            f"duplicate: rule: a candidate is queued once; queued proposal {first['proposal_id']}"
            in dup
        )
        gone = await _call(client, "withdraw", {"proposal_id": first["proposal_id"]})
        assert gone["proposal_id"] == first["proposal_id"]
        again = await _call(client, "withdraw", {"proposal_id": first["proposal_id"]}, ok=False)
        assert "already withdrawn" in again
        state = await _call(client, "state", {})
        assert state["proposals"]["queued"] == [] and len(state["proposals"]["withdrawn"]) == 1

    _session(build_server(conditional), body)
    assert ProposalQueue(conditional).queued() == []


def test_run_trials_is_bounded_by_the_budget_and_watch_shows_nothing_running(study: Path) -> None:
    async def body(client: Any) -> None:
        over = await _call(client, "run_trials", {"trials": 9}, ok=False)
        assert "1 to 4" in over and '"trials": 4' in over
        seen = await _call(client, "watch", {})
        assert seen["job"] is None and seen["in_flight"] == [] and seen["run_trials_left"] == 4

    _session(build_server(study), body)


def test_the_server_speaks_stdio_as_infrarsi_mcp(study: Path) -> None:
    params = mcp.StdioServerParameters(
        command=sys.executable,
        args=["-m", "infrarsi", "mcp", str(study)],
        env={"RAY_AUTH_MODE": "disabled", "PATH": "/usr/bin:/bin"},
    )

    async def body(client: Any) -> dict:
        return await _call(client, "state", {})

    state = _session(params, body)
    assert state["budget"]["run_trials"] == 4 and state["workload"] == "surrogate_small"


def test_a_study_that_does_not_exist_fails_before_serving(tmp_path: Path) -> None:
    from infrarsi.errors import UserInputError

    with pytest.raises(UserInputError):
        build_server(tmp_path / "nothing_here")


@pytest.mark.integration
def test_an_agent_runs_its_proposal_and_watches_it_finish(study: Path) -> None:
    """The one test that runs trials through the tools: the surrogate study (simulated, seconds
    per trial), doctor first since it has none, then one run trial that takes the proposal."""

    async def body(client: Any) -> dict:
        await _call(
            client, "propose", {"config": {"micro_batch_size": 2}, "why": "through run_trials"}
        )
        job = await _call(client, "run_trials", {"trials": 1})
        assert job["steps"] == ["doctor", "run"] and job["state"] == "running"
        busy = await _call(client, "run_trials", {"trials": 1}, ok=False)
        assert "one run at a time" in busy
        seen = await _call(client, "watch", {})
        while seen["job"]["state"] == "running":
            await asyncio.sleep(1.0)
            seen = await _call(client, "watch", {})
        return seen

    seen = _session(build_server(study), body)
    assert seen["job"]["state"] == "done", seen["job"]["error"]
    assert seen["run_trials_done"] == 1 and seen["in_flight"] == [] and seen["held_by"] is None
    (trial,) = seen["last_trials"]
    assert trial["proposal_id"] == "prop-0001" and trial["config"]["micro_batch_size"] == 2
    assert seen["job"]["ended_at"] <= time.time()
