"""``infrarsi mcp DIR``: a Model Context Protocol server over one study, for coding agents.

An agent needs nothing but the tool list: the tools are built for the study when the server
starts, so ``propose`` and ``predict`` carry the study's knobs, allowed values and documentation
in their input schema (``infrarsi.integrations.mcp_server.schema``). Tools:

- ``state``, ``predict``, ``watch`` (read-only): the study, the optimizer's predictions, the
  trials in flight and the background run;
- ``propose``, ``withdraw``: the proposal protocol (``infrarsi.stages.propose``), checked exactly
  as ``infrarsi propose`` checks it (scope, values, inactive knobs, duplicates);
- ``run_trials``: a bounded number of run trials, started in the background
  (``infrarsi.integrations.mcp_server.jobs``); ``report``: writes and returns the report.

Resources: ``infrarsi://study/contract``, ``infrarsi://study/search-space`` and
``infrarsi://study/report``. A refusal comes back as a tool error whose text names the argument,
the rule and the fix in the tool's own terms. Built on the ``mcp`` Python SDK (the ``agents``
extra); it speaks stdio, so an MCP client starts it as ``infrarsi mcp DIR``.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from infrarsi.errors import ConfigError, InfrarsiError
from infrarsi.study.paths import StudyPaths

RESOURCES = {
    "contract": "infrarsi://study/contract",
    "search_space": "infrarsi://study/search-space",
    "report": "infrarsi://study/report",
}
"""The resources the server publishes, by name."""


def _sdk() -> tuple[Any, Any, Any, type[Exception]]:
    """The SDK's server and tool classes, ``ToolAnnotations``, and the error a tool raises to
    send its message to the client."""
    try:
        from mcp.server.mcpserver import MCPServer
        from mcp.server.mcpserver.exceptions import ToolError
        from mcp.server.mcpserver.tools import Tool
        from mcp.types import ToolAnnotations
    except ImportError:
        raise ConfigError(
            "infrarsi mcp: the `mcp` package (2.x) is not installed. Fix: pip install "
            "'infrarsi[agents]' (or pip install 'mcp>=2')."
        ) from None
    return MCPServer, Tool, ToolAnnotations, ToolError


def _told(fn: Any, tool_error: type[Exception]) -> Any:
    """``fn`` whose refusals (any ``InfrarsiError``: a rule the call breaks, a stage the study
    still needs) reach the client as a tool error carrying the message (the SDK would send only
    "Error executing tool")."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except InfrarsiError as e:
            raise tool_error(str(e)) from None

    return wrapper


def build_server(study_dir: str | Path) -> Any:
    """The MCP server of the study at ``study_dir`` (its contract must load)."""
    from infrarsi.cli.app import package_version
    from infrarsi.integrations.mcp_server.schema import config_schema, plain_text
    from infrarsi.integrations.mcp_server.tools import HINTS, StudyTools
    from infrarsi.orchestration.common import baseline_config, load_space
    from infrarsi.study.contract import Contract

    root = Path(study_dir).resolve()
    contract = Contract.load(
        root
    )  # a missing or broken study fails here, before any client connects
    space = load_space(contract, root)
    editable = [n for n in space.names if n in contract.editable.knobs]
    config = config_schema(space, editable, baseline_config(contract, root))
    server_class, tool_class, annotations, tool_error = _sdk()
    study = StudyTools(root)
    tools = []
    for name, h in HINTS.items():
        fn = getattr(study, name)
        hint = annotations(
            read_only_hint=h.read_only,
            destructive_hint=h.destructive,
            idempotent_hint=h.idempotent,
            open_world_hint=False,
        )
        tool = tool_class.from_function(
            _told(fn, tool_error),
            name=name,
            annotations=hint,
            description=plain_text(fn.__doc__ or ""),
        )
        props = dict(tool.parameters.get("properties", {}))
        if "config" in props:
            props["config"] = config
        elif "configs" in props:
            props["configs"] = {
                "type": "array",
                "minItems": 1,
                "items": config,
                "description": props["configs"].get("description", ""),
            }
        tools.append(
            tool.model_copy(update={"parameters": {**tool.parameters, "properties": props}})
        )
    server = server_class(
        name="infrarsi",
        version=package_version(),
        tools=tools,
        instructions=(
            f"infrarsi study {root} (workload {contract.workload_model().name!r}). Read state first: the "
            "trials so far, the best, the budget left and the editable scope. predict gives the optimizer's "
            "step time, P(fit) and P(ok) for configs you consider. propose queues a config (its schema lists "
            "the knobs you may set and their values) with your reason, and optionally a unified diff inside "
            "the editable globs; withdraw takes a queued one back. run_trials starts trials in the background "
            "(queued proposals first) and watch follows them. report writes and returns the report. "
            f"Resources: {', '.join(RESOURCES.values())}."
        ),
    )
    _add_resources(server, root, space)
    return server


def _add_resources(server: Any, root: Path, space: Any) -> None:
    """Publish the contract, the search space and the report (each read when the client reads it)."""

    def report_md() -> str:
        md = StudyPaths(root).report_md
        return (
            md.read_text()
            if md.exists()
            else "# No report yet\n\nCall the report tool to write it.\n"
        )

    table = [
        (
            "contract",
            "application/yaml",
            lambda: StudyPaths(root).contract.read_text(),
            "The study's task contract: workload, baseline, editable scope, budgets, invariants.",
        ),
        (
            "search_space",
            "application/yaml",
            lambda: str(space.source),
            "The search space the contract holds: knobs, values, conditions, constraints.",
        ),
        (
            "report",
            "text/markdown",
            report_md,
            "The study's report (report.md) as last written; the report tool rewrites it.",
        ),
    ]
    for name, mime, read, description in table:
        server.resource(
            RESOURCES[name], name=name.replace("_", "-"), mime_type=mime, description=description
        )(read)


def serve(study_dir: str | Path) -> None:
    """Run the study's MCP server on stdio until the client disconnects."""
    build_server(study_dir).run()


def tool_text(result: Any) -> str:
    """The text of an MCP tool result (its content blocks joined), for clients and tests."""
    parts = [getattr(c, "text", "") for c in getattr(result, "content", [])]
    return "\n".join(p for p in parts if p) or json.dumps(
        getattr(result, "structured_content", None) or {}
    )
