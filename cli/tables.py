"""`stratify tables`: the docs' result tables, regenerated from the committed results files
(:mod:`stratify.reproduce.tables`)."""

from __future__ import annotations

import sys

import click

from stratify.reproduce.tables import TABLES, stale_tables, write_tables


@click.command("tables")
@click.argument("names", nargs=-1)
@click.option(
    "--root",
    default=".",
    show_default=True,
    type=click.Path(exists=True, file_okay=False),
    help="The repository's root (holding docs/).",
)
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if a table differs.")
def tables(names: tuple[str, ...], root: str, check: bool) -> None:
    """Regenerate the result tables of the docs (NAMES, default: all of them) from their
    committed results files, between their markers."""
    chosen = list(names) or None
    if check:
        stale = stale_tables(root, chosen)
        for name in stale:
            click.echo(f"{name}: differs from {TABLES[name].results}", err=True)
        sys.exit(1 if stale else 0)
    changed = write_tables(root, chosen)
    for name in names or TABLES:
        click.echo(f"{name}: {'rewritten' if name in changed else 'unchanged'}")
