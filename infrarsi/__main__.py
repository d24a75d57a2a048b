"""`python -m infrarsi` runs the CLI."""

from infrarsi.cli import main

main()
