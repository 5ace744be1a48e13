"""The console the commands print their tables on (rich, without torch: `stratify stream`
and `stratify methods` use it too)."""

from __future__ import annotations

from rich.console import Console

# Where standard output is a file or a pipe, rich assumes 80 columns and cuts a wider
# table's headers ("trans…"); this width never binds, so each table keeps its own.
UNBOUNDED_WIDTH = 10_000


def table_console(stderr: bool = False) -> Console:
    """A console for a command's tables: the terminal's width on a terminal, else as wide
    as each table needs, so a table piped or written to a file stays whole.

    Parameters
    ----------
    stderr : bool, default False
        On standard error (a grid's board of runs, which a log file catches) rather than
        standard output. Not for a progress bar, which would stretch to that width.
    """
    console = Console(stderr=stderr)
    return console if console.is_terminal else Console(stderr=stderr, width=UNBOUNDED_WIDTH)
