"""The typer app of the ``infrarsi`` CLI: its root options and the error handling every command shares.

Exit codes: 0 on success, 2 on bad input (any ``infrarsi.errors.UserInputError``: unknown knob,
bad value, missing file, malformed flag), 1 on any other failure (for ``trial``: also a trial
whose status is not ``ok``). Commands register on ``app`` with the ``command`` decorator below:
``infrarsi.cli.trial`` (one trial), ``infrarsi.cli.stages`` (the stages) and ``infrarsi.cli.agent``
(``state``, ``propose``); ``infrarsi.cli`` imports them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from rich.console import Console

from infrarsi.errors import InfrarsiError, UserInputError
from infrarsi.structlog_config import LOG_FORMATS, configure_logging

app = typer.Typer(
    name="infrarsi",
    help="Tune the launch knobs of distributed LLM training jobs, and prove the speed-up.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT = 0, 1, 2
F = TypeVar("F", bound=Callable[..., Any])


def handle_errors(fn: F) -> F:
    """Map infrarsi errors to exit codes: ``UserInputError`` -> 2, anything else -> 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except UserInputError as e:
            err_console.print(f"[bold red]error:[/] {e}", highlight=False, markup=True)
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except InfrarsiError as e:
            err_console.print(f"[bold red]error:[/] {e}", highlight=False)
            raise typer.Exit(EXIT_FAILURE) from None
        except KeyboardInterrupt:
            err_console.print("interrupted")
            raise typer.Exit(EXIT_FAILURE) from None
        except Exception as e:
            err_console.print(f"[bold red]error:[/] {type(e).__name__}: {e}", highlight=False)
            raise typer.Exit(EXIT_FAILURE) from None

    return wrapper  # type: ignore[return-value]


def command(*args: Any, **kwargs: Any) -> Callable[[F], F]:
    """``app.command`` with ``handle_errors``: how every infrarsi command is registered."""

    def deco(fn: F) -> F:
        app.command(*args, **kwargs)(handle_errors(fn))
        return fn

    return deco


@app.callback()
def _root(
    log_format: str = typer.Option("text", "--log-format", help=f"Log lines on stderr: {' | '.join(LOG_FORMATS)} (JSON lines)."),
    log_level: str = typer.Option("info", "--log-level", help="debug | info | warning | error."),
) -> None:
    """infrarsi: censored-memory Bayesian search over DeepSpeed launch knobs, verified."""
    try:
        configure_logging(log_format, log_level)
    except UserInputError as e:
        err_console.print(f"[bold red]error:[/] {e}")
        raise typer.Exit(EXIT_BAD_INPUT) from None
