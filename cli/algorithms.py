"""`stratify algorithms`: every available method with a one-line description and its options."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from stratify.algorithms import ALGORITHMS, option_flag, strategy_class, strategy_options


def option_text(option: str, default: object) -> str:
    """How ``stratify train`` spells a strategy option and its default."""
    if option == "fused":  # Stratify's constructor flag is the CLI's --batch-path
        return f"--batch-path {'fused' if default else 'explicit'}"
    return option_flag(option) if default is None else f"{option_flag(option)} {default}"


def describe(name: str) -> tuple[str, str, str]:
    """``(description, modes, options)`` of algorithm ``name``, as table cells."""
    try:
        cls = strategy_class(name)
    except ImportError as error:  # a registered module that cannot be imported
        return f"(unavailable: {error})", "", ""
    options = ", ".join(
        option_text(option, default) for option, default in strategy_options(name).items()
    )
    return cls.description, ", ".join(cls.modes), options


@click.command("algorithms")
def algorithms() -> None:
    """List the available algorithms (`--algorithm NAME` of `stratify train`)."""
    table = Table(title="algorithms (stratify train --algorithm NAME)")
    table.add_column("name", style="bold", no_wrap=True)
    table.add_column("description")
    table.add_column("modes")
    table.add_column("options [default]")
    for name in ALGORITHMS:
        table.add_row(name, *describe(name))
    Console().print(table)
