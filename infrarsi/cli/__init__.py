"""The ``infrarsi`` command line: ``main`` runs the typer app with every command registered."""

from __future__ import annotations

from infrarsi.cli import agent, bank, options, stages, trial
from infrarsi.cli.app import app

__all__ = ["agent", "app", "bank", "main", "stages", "trial"]


def main() -> None:
    """Console-script entry point (``infrarsi``); a bare ``--wait`` means wait as long as it takes
    (``infrarsi.cli.options.expand_bare_wait``)."""
    import sys

    app(args=options.expand_bare_wait(sys.argv[1:]))
