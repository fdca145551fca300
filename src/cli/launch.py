"""The ``ndplan`` script's entry point: the CLI, with a Ctrl-C during its start-up (the
imports of numba, pydantic and the commands take half a second) answered like one later
on — one line and exit 130, not an import traceback."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from ndplan.cli.app import main as run_cli
    except KeyboardInterrupt:
        sys.stderr.write("ndplan: error: interrupted\n")
        sys.exit(130)
    run_cli()
