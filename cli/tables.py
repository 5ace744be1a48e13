"""`stratify tables`: the docs' result tables, regenerated from the committed results files
(:mod:`stratify.reproduce.tables`)."""

from __future__ import annotations

import sys

import click

from stratify.cli.main import DISTINCT_BUG, USER_ERROR, set_bug_exit_code
from stratify.reproduce.tables import TABLES, stale_tables, write_tables

#: ``--check``'s answer that a table differs from its results file
STALE = 1


@click.command(
    "tables",
    epilog=f"Exit codes: 0 done (with --check: every table is current); {STALE} with --check: "
    f"a table differs from its results file; {USER_ERROR} an input cannot be used (a results "
    "file or a document missing, not a regular file, not UTF-8, not a results file, a "
    f"document that cannot be written), every document left as it was; {DISTINCT_BUG} a "
    "bug in stratify.",
)
@click.argument("names", nargs=-1)
@click.option(
    "--root",
    default=".",
    show_default=True,
    type=click.Path(exists=True, file_okay=False),
    help="The repository's root (holding docs/).",
)
@click.option("--check", is_flag=True, help=f"Write nothing; exit {STALE} if a table differs.")
def tables(names: tuple[str, ...], root: str, check: bool) -> None:
    """Regenerate the result tables of the docs (NAMES, default: all of them) from their
    committed results files, between their markers. Every results file and document is
    read and checked before any document is written, and each is replaced whole."""
    set_bug_exit_code(DISTINCT_BUG)  # 1 is --check's answer "stale"
    chosen = list(names) or None
    if check:
        stale = stale_tables(root, chosen)
        for name in stale:
            click.echo(f"{name}: differs from {TABLES[name].results}", err=True)
        sys.exit(STALE if stale else 0)
    changed = write_tables(root, chosen)
    for name in names or TABLES:
        click.echo(f"{name}: {'rewritten' if name in changed else 'unchanged'}")
