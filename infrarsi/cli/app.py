"""The typer app of the ``infrarsi`` CLI: its root options and the error handling every command shares.

Exit codes (``EXIT_CODES``, also in ``infrarsi --help``): 0 on success, 2 on bad input (any
``infrarsi.errors.UserInputError``: unknown knob, bad value, missing file, malformed flag, a
directory that is not a study), 1 on any other failure (for ``trial``: also a trial whose status
is not ``ok``), 130 when interrupted (Ctrl-C). Commands register on ``app`` with the ``command``
decorator below: ``infrarsi.cli.trial`` (one trial), ``infrarsi.cli.stages`` (the stages) and
``infrarsi.cli.agent`` (``state``, ``propose``, ``mcp``); ``infrarsi.cli`` imports them. A command
whose positional argument is named ``study`` takes an existing study: ``command`` refuses a
directory without ``contract.yaml`` (exit 2) before the command runs.

Quiet by default: the terminal shows progress bars (``infrarsi.cli.progress``), warnings, errors
and each command's result; every event also goes to the study's ``DIR/logs/infrarsi.jsonl``
(``handle_errors`` attaches it for any command given a study), and ``-v``/``--verbose`` brings
every event back to the terminal. ``--json`` (``json_option``) makes a command print one JSON
object on stdout instead of tables. The environment variables the CLI reads are listed in the
root help and in each option's help (``ENV_VARS``, ``env_help``).

Output is never wrapped at a guessed width: both consoles soft-wrap (a long line, such as a JSON
fix in an error, stays one line), and when the stream is not a terminal (a pipe, a file) tables
are laid out as wide as they need.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console, ConsoleDimensions
from rich.text import Text
from typer.models import ArgumentInfo

from infrarsi.errors import InfrarsiError, UserInputError
from infrarsi.structlog_config import LOG_FORMATS, configure_logging
from infrarsi.study.paths import StudyPaths

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_FAILURE: "any other failure (for trial: a trial whose status is not ok)",
    EXIT_BAD_INPUT: "bad input: a flag, a file, a value, a directory that is not a study (the message names the fix)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C); a study keeps every trial logged: infrarsi run DIR --resume",
}
ENV_VARS = {
    "INFRARSI_BANK": "the experience bank when --bank is not given (a directory, an fsspec URI, or off)",
    "INFRARSI_PRIOR": "the analytic prior's default (on | off) when --analytic-prior is not given",
    "INFRARSI_LOSS_GUARD": "the loss guard's default (on | off) when --loss-guard is not given",
    "INFRARSI_CHROMIUM": "the Chromium binary report --pdf prints with",
    "RAY_ADDRESS": "the Ray cluster when --address is not given (default: start a local Ray)",
}
"""Environment variables the CLI reads, and what for (shown in ``infrarsi --help``)."""
PIPE_WIDTH = 10_000
"""Columns a console assumes when its stream is not a terminal and ``COLUMNS`` is unset: wide
enough that nothing is folded."""

app = typer.Typer(
    name="infrarsi",
    help=(
        "Tune the launch knobs of distributed LLM training jobs, and prove the speed-up.\n\n"
        "Quiet by default: progress bars and results on the terminal, the full structured log in "
        "DIR/logs/infrarsi.jsonl; -v shows every event. --json on a command prints one JSON object.\n\n"
        "Exit codes: " + "; ".join(f"{k} {v}" for k, v in EXIT_CODES.items()) + ".\n\n"
        "Environment: " + "; ".join(f"{k}: {v}" for k, v in ENV_VARS.items()) + "."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
F = TypeVar("F", bound=Callable[..., Any])


class _Console(Console):
    """A rich ``Console`` that soft-wraps, and lays out at ``PIPE_WIDTH`` columns when its stream
    is not a terminal and ``COLUMNS`` is unset (rich would assume 80 and fold tables)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(soft_wrap=True, **kwargs)

    @property  # type: ignore[override]
    def size(self) -> ConsoleDimensions:
        dims = super().size
        if self._width is None and not self.is_terminal and "COLUMNS" not in os.environ:
            return ConsoleDimensions(PIPE_WIDTH, dims.height)
        return dims

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size


console = _Console()
err_console = _Console(stderr=True)


def package_version() -> str:
    """The installed distribution's version (``importlib.metadata``), else ``infrarsi.__version__``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("infrarsi")
    except PackageNotFoundError:
        import infrarsi

        return str(getattr(infrarsi, "__version__", "unknown"))


def env_help(text: str, var: str) -> str:
    """An option's help that names the environment variable it falls back to, as click shows one
    (``[env var: X]``). infrarsi reads the variable itself, not click: a bad value is refused
    naming the variable, its rule and the fix (exit 2)."""
    if var not in ENV_VARS:
        raise KeyError(f"{var} is not in ENV_VARS; add it there first")
    from rich.markup import escape

    return f"{text} {escape(f'[env var: {var}]')}"  # typer renders help as rich markup


def json_option() -> Any:
    """The ``--json`` option every stage command takes: one JSON object on stdout instead of tables."""
    return typer.Option(
        False, "--json", help="Print the result as one JSON object on stdout instead of tables."
    )


def print_json(obj: Any) -> None:
    """``obj`` as one line of JSON on stdout (dataclasses as dicts, paths and dates as text)."""
    import dataclasses
    import json

    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = dataclasses.asdict(obj)
    print(json.dumps(obj, default=str))


def print_error(message: str) -> None:
    """``error: MESSAGE`` on stderr, the message verbatim (never read as rich markup: ``[a, b]``
    in a value or a fix stays as written) and on one line however long."""
    err_console.print(Text("error: ", style="bold red") + Text(message))


def _takes_a_study(fn: Callable[..., Any]) -> bool:
    """Whether ``fn``'s positional argument ``study`` is one existing study (``init`` and ``tune``
    take ``--study``, an option: a directory they may create; ``bank ingest`` takes a list of
    studies or folders of studies)."""
    p = inspect.signature(fn).parameters.get("study")
    return p is not None and isinstance(p.default, ArgumentInfo) and p.annotation in (Path, "Path")


def _interrupted(study: Any) -> str:
    """What Ctrl-C leaves: the study, when there is one, and how to resume it."""
    if study is not None and StudyPaths(Path(study)).contract.is_file():
        return (
            f"interrupted; the study {study} keeps every trial logged so far: resume it with "
            f"`infrarsi run {study} --resume` (then verify and report as usual)."
        )
    return "interrupted."


def handle_errors(fn: F) -> F:
    """Map infrarsi errors to exit codes: ``UserInputError`` -> 2, Ctrl-C -> 130, anything else
    -> 1; refuse a ``study`` argument that is not a study (exit 2) before ``fn`` runs. A command
    given one study directory (``study``) logs every event to ``DIR/logs/infrarsi.jsonl``."""
    needs_study = _takes_a_study(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from infrarsi.structlog_config import study_log

        study = kwargs.get("study")
        try:
            if needs_study:
                from infrarsi.study.paths import require_study

                require_study(kwargs["study"])
            if not isinstance(study, Path):
                return fn(*args, **kwargs)
            with study_log(study):
                try:
                    return fn(*args, **kwargs)
                finally:
                    link_ray_logs(study)
        except (typer.Exit, typer.Abort):
            raise
        except UserInputError as e:
            print_error(str(e))
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except InfrarsiError as e:
            print_error(str(e))
            raise typer.Exit(EXIT_FAILURE) from None
        except KeyboardInterrupt:
            err_console.print(_interrupted(kwargs.get("study")), highlight=False, markup=False)
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except Exception as e:
            print_error(f"{type(e).__name__}: {e}")
            raise typer.Exit(EXIT_FAILURE) from None

    return wrapper  # type: ignore[return-value]


def link_ray_logs(study: Path) -> None:
    """Link ``DIR/logs/ray`` to the local Ray session's log folder, where the ranks' stdout and
    stderr (DeepSpeed's own lines) went instead of the terminal (``log_to_driver=False``); nothing
    when this process started no Ray, or Ray runs elsewhere (its logs stay on its nodes)."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized() or not StudyPaths(study).contract.is_file():
        return
    try:
        node = (
            ray._private.worker._global_node
        )  # the session of a Ray this driver started or joined
        logs = Path(node.get_logs_dir_path())
        link = StudyPaths(study).logs / "ray"
        if logs.is_dir() and not link.exists():
            link.parent.mkdir(mode=0o700, exist_ok=True)
            link.symlink_to(logs, target_is_directory=True)
    except (AttributeError, OSError):  # a Ray without that attribute, a filesystem without links
        pass


def command(*args: Any, **kwargs: Any) -> Callable[[F], F]:
    """``app.command`` with ``handle_errors``: how every infrarsi command is registered."""

    def deco(fn: F) -> F:
        app.command(*args, **kwargs)(handle_errors(fn))
        return fn

    return deco


def _print_version(value: bool) -> None:
    if value:
        console.print(f"infrarsi {package_version()}", highlight=False)
        raise typer.Exit(EXIT_OK)


@app.callback()
def _root(
    version: bool = typer.Option(
        False,
        "--version",
        is_eager=True,
        callback=_print_version,
        help="Print the installed infrarsi version and exit.",
    ),
    log_format: str = typer.Option(
        "text", "--log-format", help=f"Log lines on stderr: {' | '.join(LOG_FORMATS)} (JSON lines)."
    ),
    log_level: str = typer.Option(
        "info",
        "--log-level",
        help="debug | info | warning | error (the study's log and, with -v, the terminal).",
    ),
    verbose: bool = typer.Option(
        False,
        "--verbose",
        "-v",
        help="Show every log event on the terminal too (default: warnings and errors; the study's "
        "DIR/logs/infrarsi.jsonl holds them all).",
    ),
) -> None:
    """infrarsi: censored-memory Bayesian search over DeepSpeed launch knobs, verified."""
    try:
        configure_logging(log_format, log_level, verbose=verbose)
    except UserInputError as e:
        print_error(str(e))
        raise typer.Exit(EXIT_BAD_INPUT) from None
