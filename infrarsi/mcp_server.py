"""``infrarsi mcp DIR``: a Model Context Protocol server over one study, for coding agents.

Coding agents drive the study with the tools ``state``, ``predict``, ``propose`` and ``report``.

The tools are the proposal protocol (``infrarsi.stages.propose``) and the report stage, nothing
more: a proposal the server accepts was checked against the contract exactly as ``infrarsi
propose`` checks it, and runs as the study's next run trial. A refused proposal comes back as a
tool error whose text names the rule and the fix. Built on the ``mcp`` Python SDK (the
``agents`` extra: ``pip install 'infrarsi[agents]'``); it speaks stdio, so an MCP client starts it
as ``infrarsi mcp DIR``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from infrarsi.errors import ConfigError


def _sdk() -> tuple[Any, type[Exception]]:
    """The SDK's server class and the error a tool raises to send its message to the client."""
    try:
        from mcp.server.mcpserver import MCPServer
        from mcp.server.mcpserver.exceptions import ToolError
    except ImportError:
        raise ConfigError("infrarsi mcp: the `mcp` package (2.x) is not installed. Fix: pip install "
                          "'infrarsi[agents]' (or pip install 'mcp>=2').") from None
    return MCPServer, ToolError


def _told_by(tool_error: type[Exception]) -> Any:
    """Decorator form of ``_told``."""
    return lambda fn: _told(fn, tool_error)


def _told(fn: Any, tool_error: type[Exception]) -> Any:
    """``fn`` whose refusals (any ``UserInputError``: a rule the proposal breaks) reach the
    client as a tool error carrying the message (the SDK would send only "Error executing tool")."""
    import functools

    from infrarsi.errors import UserInputError

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except UserInputError as e:
            raise tool_error(str(e)) from None

    return wrapper


def build_server(study_dir: str | Path) -> Any:
    """The MCP server of the study at ``study_dir`` (its contract must load)."""
    from infrarsi.stages.propose import propose as queue_proposal
    from infrarsi.stages.propose import study_state
    from infrarsi.study.contract import Contract

    root = Path(study_dir).resolve()
    contract = Contract.load(root)  # a missing or broken study fails here, before any client connects
    server_class, tool_error = _sdk()
    server = server_class(
        name="infrarsi",
        instructions=(
            f"infrarsi study {root} (workload {contract.workload_model().name!r}). Read `state` first: "
            "the trials so far, the best, the budget left and the editable scope. `predict` gives the "
            "optimizer's step time, P(fit) and P(ok) for configs you consider. `propose` queues a config "
            "(knobs left out keep the baseline's) with your reason, and optionally a unified diff inside "
            "the editable globs; the study's next run trial runs it under the contract, and verify "
            "re-measures the best against the baseline. `report` writes and returns the report."),
    )

    @server.tool()
    @_told_by(tool_error)
    def state() -> dict[str, Any]:
        """The study now: trials by stage and status, the run trials, the best so far and its
        speed-up, the verified result once verify ran, the budget left, the editable knobs with
        their allowed values and the editable globs, and the queued and taken proposals."""
        return study_state(root)

    @server.tool()
    @_told_by(tool_error)
    def predict(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The optimizer's predictions for each config (knob -> value; knobs left out keep the
        baseline's): step_time_mean_s, step_time_sd_log, memory_mean_bytes, p_fit, p_ok."""
        return list(study_state(root, predict=configs)["predictions"])

    @server.tool()
    @_told_by(tool_error)
    def propose(config: dict[str, Any], why: str, patch: str | None = None) -> dict[str, Any]:
        """Queue ``config`` (knob -> value) for the study's next run trial, with ``why`` (your
        reason; kept in the log and the report) and optionally ``patch``, a unified diff of the
        workload's code inside the editable globs. A proposal outside the contract is refused with
        the rule it breaks."""
        if patch is None:
            return queue_proposal(root, config, why=why, proposer="mcp").to_dict()
        with tempfile.TemporaryDirectory() as d:
            f = Path(d) / "proposal.diff"
            f.write_text(patch)
            return queue_proposal(root, config, why=why, patch=f, proposer="mcp").to_dict()

    @server.tool()
    @_told_by(tool_error)
    def report() -> str:
        """Write the study's report (report.md, report.html) and return the Markdown."""
        from infrarsi.stages.report import write_report

        write_report(root)
        return (root / "report.md").read_text()

    return server


def serve(study_dir: str | Path) -> None:
    """Run the study's MCP server on stdio until the client disconnects."""
    build_server(study_dir).run()


def tool_text(result: Any) -> str:
    """The text of an MCP tool result (its content blocks joined), for clients and tests."""
    parts = [getattr(c, "text", "") for c in getattr(result, "content", [])]
    return "\n".join(p for p in parts if p) or json.dumps(getattr(result, "structured_content", None) or {})
