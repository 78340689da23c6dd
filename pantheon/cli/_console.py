"""The console the CLI prints its reports on, as wide as the terminal it runs in.

rich sizes a console that is not writing to a terminal at 80 columns, so ``pantheon run
... | cat`` or ``| less`` in a 200-column terminal squeezed tables and cut their cells with
"…". Here the width is ``$COLUMNS`` if set, else the size of whichever of stdout, stderr or
stdin is a terminal, else (nothing is a terminal: a file, CI) wide enough that no table
is cut.
"""

from __future__ import annotations

import os
import sys

from rich.console import Console

__all__ = ["PIPE_WIDTH", "report_console", "terminal_width"]

#: Columns when no terminal is attached at all: wide enough for any report table, which
#: rich then draws at its natural width rather than this one.
PIPE_WIDTH = 400


def terminal_width() -> int | None:
    """``$COLUMNS``, else the width of the first of stdout, stderr, stdin that is a
    terminal; None when there is none."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    for stream in (sys.stdout, sys.stderr, sys.stdin):
        try:
            return os.get_terminal_size(stream.fileno()).columns
        except (AttributeError, ValueError, OSError):
            continue
    return None


def report_console(*, highlight: bool = True) -> Console:
    """A stdout console at the real terminal's width (see the module docstring); lines that
    are longer wrap in the terminal, not in rich (``soft_wrap``)."""
    return Console(width=terminal_width() or PIPE_WIDTH, soft_wrap=True, highlight=highlight)
