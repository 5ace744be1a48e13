"""`stratify algorithms`: every available method, its modes and its options with defaults."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from stratify.algorithms import ALGORITHMS, strategy_class
from stratify.options import flag


def describe(name: str) -> tuple[str, str, str]:
    """``(description, modes, options)`` of algorithm ``name``, as table cells."""
    try:
        cls = strategy_class(name)
    except ImportError as error:  # a registered module that cannot be imported
        return f"(unavailable: {error})", "", ""
    options = []
    for entry in cls.options_class.option_fields():
        text = flag(entry.name) if entry.default is None else f"{flag(entry.name)} {entry.default}"
        modes = entry.metadata["modes"]
        options.append(text if len(modes) == 2 else f"{text} ({modes[0]})")
    strategy = cls()
    schedules = {mode: strategy.lr_schedule_for(mode) for mode in cls.modes}
    if len(set(schedules.values())) == 1:
        schedule = f"--lr-schedule {next(iter(schedules.values()))}"
    else:
        schedule = "--lr-schedule " + ", ".join(f"{s} ({m})" for m, s in schedules.items())
    return cls.description, ", ".join(cls.modes), ", ".join([*options, schedule])


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
