"""The typer app of the ``infrarsi`` CLI: its root options and the error handling every command shares.

Exit codes (``EXIT_CODES``, also in ``infrarsi --help``): 0 on success, 2 on bad input (any
``infrarsi.errors.UserInputError``: unknown knob, bad value, missing file, malformed flag, a
directory that is not a study), 1 on any other failure (for ``trial``: also a trial whose status
is not ``ok``), 130 when interrupted (Ctrl-C). Commands register on ``app`` with the ``command``
decorator below: ``infrarsi.cli.trial`` (one trial), ``infrarsi.cli.stages`` (the stages) and
``infrarsi.cli.agent`` (``state``, ``propose``, ``mcp``); ``infrarsi.cli`` imports them. A command
whose positional argument is named ``study`` takes an existing study: ``command`` refuses a
directory without ``contract.yaml`` (exit 2) before the command runs.

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

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_FAILURE: "any other failure (for trial: a trial whose status is not ok)",
    EXIT_BAD_INPUT: "bad input: a flag, a file, a value, a directory that is not a study (the message names the fix)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C); a study keeps every trial logged: infrarsi run DIR --resume",
}
PIPE_WIDTH = 10_000
"""Columns a console assumes when its stream is not a terminal and ``COLUMNS`` is unset: wide
enough that nothing is folded."""

app = typer.Typer(
    name="infrarsi",
    help=("Tune the launch knobs of distributed LLM training jobs, and prove the speed-up.\n\n"
          "Exit codes: " + "; ".join(f"{k} {v}" for k, v in EXIT_CODES.items()) + "."),
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
    if study is not None and (Path(study) / "contract.yaml").is_file():
        return (f"interrupted; the study {study} keeps every trial logged so far: resume it with "
                f"`infrarsi run {study} --resume` (then verify and report as usual).")
    return "interrupted."


def handle_errors(fn: F) -> F:
    """Map infrarsi errors to exit codes: ``UserInputError`` -> 2, Ctrl-C -> 130, anything else
    -> 1; refuse a ``study`` argument that is not a study (exit 2) before ``fn`` runs."""
    needs_study = _takes_a_study(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            if needs_study:
                from infrarsi.study.paths import require_study

                require_study(kwargs["study"])
            return fn(*args, **kwargs)
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
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                 help="Print the installed infrarsi version and exit."),
    log_format: str = typer.Option("text", "--log-format", help=f"Log lines on stderr: {' | '.join(LOG_FORMATS)} (JSON lines)."),
    log_level: str = typer.Option("info", "--log-level", help="debug | info | warning | error."),
) -> None:
    """infrarsi: censored-memory Bayesian search over DeepSpeed launch knobs, verified."""
    try:
        configure_logging(log_format, log_level)
    except UserInputError as e:
        print_error(str(e))
        raise typer.Exit(EXIT_BAD_INPUT) from None
