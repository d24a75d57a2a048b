"""The proposal protocol on the command line: ``infrarsi state``, ``propose``, ``withdraw`` and ``mcp``.

For coding agents and people: ``state`` and ``propose`` call ``infrarsi.stages.propose``, and
``mcp`` serves the same tools as an MCP server (``infrarsi.integrations.mcp_server``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from infrarsi.cli.app import command, console
from infrarsi.errors import ProposalError

STUDY_HELP = "The study directory."


def parse_json(text: str, flag: str, *, want: type = dict) -> Any:
    """``text`` as JSON of type ``want``, or a ``ProposalError`` naming ``flag`` (exit 2)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ProposalError(
            f"{flag}: rule: valid JSON; {e.msg} at character {e.pos} of {text!r}. "
            f"Fix: e.g. {flag} '{{\"micro_batch_size\": 4}}'."
        ) from None
    if not isinstance(value, want):
        raise ProposalError(
            f"{flag}: rule: a JSON {'object' if want is dict else want.__name__}; got "
            f"{type(value).__name__} {text!r}. Fix: e.g. {flag} '{{\"micro_batch_size\": 4}}'."
        )
    return value


@command("state")
def state_cmd(
    study: Path = typer.Argument(..., help=STUDY_HELP),
    predict: list[str] = typer.Option(
        [],
        "--predict",
        help="A config (JSON object; knobs left out keep the baseline) to predict; repeatable.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the whole state as JSON."),
) -> None:
    """What a proposer needs: trials, best so far, budget left, editable scope, proposals, predictions."""
    from infrarsi.stages.propose import study_state

    configs = [parse_json(p, "--predict") for p in predict]
    s = study_state(study, predict=configs)
    if as_json:
        print(json.dumps(s, indent=2))
        return
    b = s["budget"]
    console.print(
        f"study {s['study']} ({s['workload']}): {b['run_trials_used']}/{b['run_trials']} run trials, "
        f"stages done: {', '.join(s['stages_done']) or 'init'}"
    )
    if s["held_by"]:
        h = s["held_by"]
        console.print(
            f"held by `{h['stage']}` on host {h['host']}, pid {h['pid']} (one writer per study)"
        )
    base = s["baseline"]["step_time_s"]
    console.print(
        f"baseline step time: {base:.4g} s" if base else "baseline: not measured (run doctor)"
    )
    if s["best"]:
        console.print(
            f"best so far: {s['best']['trial_id']} {s['best']['step_time_s']:.4g} s "
            f"({s['best']['speedup_vs_baseline'] or 0:.2f}x) {json.dumps(s['best']['config'])}"
        )
    console.print(
        f"editable knobs: {', '.join(s['scope']['editable_knobs'])}; globs: {s['scope']['editable_globs']}"
    )
    console.print(
        f"proposals: {len(s['proposals']['queued'])} queued, {len(s['proposals']['taken'])} taken"
    )
    for p in s["predictions"]:
        console.print(
            f"predict {json.dumps(p['config'])}: "
            + ", ".join(
                (
                    _num(
                        p.get("step_time_mean_s"),
                        "{:.4g} s",
                        "step time not predicted yet (no ok trial)",
                    ),
                    _num(p.get("p_fit"), "P(fit) {:.2f}", "P(fit) -"),
                    _num(p.get("p_ok"), "P(ok) {:.2f}", "P(ok) -"),
                )
            ),
            highlight=False,
        )


def _num(value: float | None, fmt: str, missing: str) -> str:
    """``fmt`` of ``value``, or ``missing`` when the model has no prediction (a new study: null)."""
    return missing if value is None else fmt.format(value)


@command("propose")
def propose_cmd(
    study: Path = typer.Argument(..., help=STUDY_HELP),
    config: str = typer.Option(
        "{}", "--config", help="Knob values as a JSON object; knobs left out keep the baseline's."
    ),
    why: str = typer.Option(
        ..., "--why", help="Why it should be faster (kept in the log and the report)."
    ),
    patch: Path | None = typer.Option(
        None,
        "--patch",
        help="A unified diff to apply to the workload's code (inside the editable globs).",
    ),
    proposer: str = typer.Option(
        "cli", "--proposer", help="Who proposes (an agent's name), kept with the proposal."
    ),
) -> None:
    """Queue a config (and a patch) for the study's next run trial, checked against the contract."""
    from infrarsi.stages.propose import propose

    p = propose(study, parse_json(config, "--config"), why=why, patch=patch, proposer=proposer)
    console.print(
        f"queued {p.proposal_id}: {json.dumps(p.asked)}"
        + (f" with {p.patch}" if p.patch else "")
        + f"; the next run trial takes it (`infrarsi run {study} --resume` if none is running)."
    )


@command("withdraw")
def withdraw_cmd(
    study: Path = typer.Argument(..., help=STUDY_HELP),
    proposal_id: str = typer.Argument(
        ..., help="The queued proposal to withdraw (prop-0001...; `infrarsi state` lists them)."
    ),
) -> None:
    """Withdraw a queued proposal: no run trial takes it (it is kept in proposals/withdrawn/)."""
    from infrarsi.stages.propose import withdraw

    p = withdraw(study, proposal_id)
    console.print(f"withdrew {p.proposal_id}: {json.dumps(p.asked)}")


@command("mcp")
def mcp_cmd(study: Path = typer.Argument(..., help=STUDY_HELP)) -> None:
    """Serve the study to coding agents over MCP (stdio): tools state, predict, propose, withdraw,
    run_trials, watch, report."""
    from infrarsi.integrations.mcp_server import serve

    serve(study)
