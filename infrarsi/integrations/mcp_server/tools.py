"""The MCP tools' bodies over one study: what each tool does, its parameters and their docs.

Each public method of ``StudyTools`` is one tool: its name is the tool's name, its docstring the
tool's description (served as plain text), its ``Annotated`` parameters the tool's parameters
with their descriptions. ``HINTS`` says which tools only read. The server
(``infrarsi.integrations.mcp_server``) registers them and replaces the ``config`` parameters' schema with one
built from the study's search space (``infrarsi.integrations.mcp_server.schema``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from infrarsi.integrations.mcp_server.jobs import RunJobs, in_flight
from infrarsi.study.paths import StudyPaths


@dataclass(frozen=True)
class ToolHints:
    """The MCP ``ToolAnnotations`` hints of one tool."""

    read_only: bool
    """The tool changes nothing (``readOnlyHint``)."""
    destructive: bool = False
    """The tool may undo what was done before (``destructiveHint``: withdraw)."""
    idempotent: bool = False
    """Calling it twice does what calling it once does (``idempotentHint``)."""


HINTS: dict[str, ToolHints] = {
    "state": ToolHints(read_only=True, idempotent=True),
    "predict": ToolHints(read_only=True, idempotent=True),
    "watch": ToolHints(read_only=True, idempotent=True),
    "propose": ToolHints(read_only=False),
    "withdraw": ToolHints(read_only=False, destructive=True),
    "run_trials": ToolHints(read_only=False),
    "report": ToolHints(read_only=False, idempotent=True),
}
"""Tool name -> its hints, in the order the tools are listed."""


class StudyTools:
    """The tools of one study directory (and the background runs they started)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        """The study directory (resolved)."""
        self.jobs = RunJobs(root)
        """The runs ``run_trials`` started."""

    def state(self) -> dict[str, Any]:
        """The study now: trials by stage and status, the run trials, the best so far and its
        speed-up, the verified result once verify ran, the budget left, the editable knobs with
        their allowed values and the editable globs, and the queued, taken and withdrawn proposals."""
        from infrarsi.stages.propose import study_state

        return study_state(self.root)

    def predict(
        self,
        configs: Annotated[
            list[dict[str, Any]],
            Field(
                description="The configs to predict (knob -> value each; knobs left out keep the baseline's)."
            ),
        ],
    ) -> dict[str, Any]:
        """The optimizer's predictions, one per config in order, fitted on the trials so far:
        step_time_mean_s, step_time_sd_log, memory_mean_bytes, p_fit (fits the memory capacity),
        p_ok (runs clean). Values are null until the study has trials to fit."""
        from infrarsi.stages.propose import study_state

        return {"predictions": study_state(self.root, predict=configs)["predictions"]}

    def propose(
        self,
        config: dict[str, Any],
        why: Annotated[
            str, Field(description="Why it should be faster; kept in the log and the report.")
        ],
        patch: Annotated[
            str | None,
            Field(
                description="Optional: a unified diff (git diff format) of the workload's code, inside "
                "the editable globs that state lists."
            ),
        ] = None,
    ) -> dict[str, Any]:
        """Queue a config (and optionally a code patch) for the study's next run trial. Refused,
        with the rule and the fix: an unknown knob or value, a knob the contract pins, a knob set
        where its condition is false (it would be dropped), a patch outside the editable globs or
        not applying, and a candidate already queued or already measured. Returns the queued
        proposal (its proposal_id, the full config it will run)."""
        from infrarsi.stages.propose import TOOL_FIELDS, propose

        return propose(
            self.root, config, why=why, patch_text=patch, proposer="mcp", fields=TOOL_FIELDS
        ).to_dict()

    def withdraw(
        self,
        proposal_id: Annotated[
            str,
            Field(
                description="The queued proposal to withdraw, e.g. prop-0001 (state lists the queued ones).",
                pattern=r"^prop-\d+$",
            ),
        ],
    ) -> dict[str, Any]:
        """Withdraw a queued proposal so that no run trial takes it (one already taken cannot be
        withdrawn). Returns the withdrawn proposal."""
        from infrarsi.stages.propose import TOOL_FIELDS, withdraw

        return withdraw(self.root, proposal_id, fields=TOOL_FIELDS).to_dict()

    def run_trials(
        self,
        trials: Annotated[
            int,
            Field(
                description="Run trials to add (1 to the run trials left of the budget, see state).",
                ge=1,
            ),
        ],
    ) -> dict[str, Any]:
        """Start run trials in the background and return at once: queued proposals first, then the
        optimizer's picks. When the study has no baseline calibration yet, the doctor stage runs
        first. The run holds the study for its whole length; call watch to follow it."""
        budget = self.state()["budget"]
        job = self.jobs.start(trials, used=budget["run_trials_used"], budget=budget["run_trials"])
        return {**job.to_dict(), "next": "call watch to follow it"}

    def watch(self) -> dict[str, Any]:
        """What is happening now: the background run (its step, state, error), who holds the study,
        the trials in flight (seconds running, seconds since their last heartbeat), the run trials
        done, the best so far, the budget left and the last run trials."""
        s = self.state()
        job = self.jobs.current()
        return {
            "job": None if job is None else job.to_dict(),
            "held_by": s["held_by"],
            "in_flight": in_flight(self.root),
            "run_trials_done": s["budget"]["run_trials_used"],
            "run_trials_left": s["budget"]["run_trials_left"],
            "best": s["best"],
            "last_trials": s["trials"]["run"][-5:],
        }

    def report(self) -> str:
        """Write the study's report (report.md, report.html) and return the Markdown."""
        from infrarsi.errors import StudyLockedError
        from infrarsi.stages.report import write_report
        from infrarsi.study.lock import holder_of

        holder = holder_of(self.root)
        if holder is not None:
            raise StudyLockedError(
                f"report: rule: the report is written while nothing else writes the study; it is held by "
                f"{holder.describe()}. Fix: call watch, and report once it is free."
            )
        write_report(self.root)
        return StudyPaths(self.root).report_md.read_text()
