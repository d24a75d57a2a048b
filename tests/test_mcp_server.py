"""``infrarsi mcp DIR``: the study's MCP server, reached by a real MCP client, in process and
over stdio (the way a coding agent starts it)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from infrarsi.mcp_server import build_server, tool_text
from infrarsi.study.proposals import ProposalQueue

mcp = pytest.importorskip("mcp")



def _client(target: object) -> object:
    return mcp.Client(target)


def test_an_agent_reads_the_state_and_proposes_through_the_tools(study: Path) -> None:
    async def session() -> None:
        async with _client(build_server(study)) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            assert tools >= {"state", "predict", "propose", "report"}
            ok = await client.call_tool("propose", {"config": {"micro_batch_size": 2},
                                                    "why": "an agent's reason"})
            assert not ok.is_error, tool_text(ok)
            refused = await client.call_tool("propose", {"config": {"activation_checkpointing": "none"},
                                                         "why": "not mine to change"})
            assert refused.is_error and "editable.knobs" in tool_text(refused)
            state = await client.call_tool("state", {})
            assert "an agent's reason" in tool_text(state)
            pred = await client.call_tool("predict", {"configs": [{"micro_batch_size": 4}]})
            assert not pred.is_error and "p_fit" in tool_text(pred)

    asyncio.run(session())
    (p,) = ProposalQueue(study).queued()
    assert p.proposer == "mcp" and p.asked == {"micro_batch_size": 2}


def test_the_server_speaks_stdio_as_infrarsi_mcp(study: Path) -> None:
    params = mcp.StdioServerParameters(command=sys.executable, args=["-m", "infrarsi", "mcp", str(study)],
                                       env={"RAY_AUTH_MODE": "disabled", "PATH": "/usr/bin:/bin"})

    async def session() -> dict:
        async with _client(params) as client:
            res = await client.call_tool("state", {})
            assert not res.is_error, tool_text(res)
            return json.loads(tool_text(res))

    state = asyncio.run(session())
    assert state["budget"]["run_trials"] == 4 and state["workload"] == "surrogate_small"


def test_a_study_that_does_not_exist_fails_before_serving(tmp_path: Path) -> None:
    from infrarsi.errors import UserInputError

    with pytest.raises(UserInputError):
        build_server(tmp_path / "nothing_here")
