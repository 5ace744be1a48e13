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
    # defaults as each mode resolves them (e.g. FedAvg's local epochs: 10 batch, 1 single)
    resolved = {mode: cls.options_class().for_mode(mode) for mode in cls.modes}
    options = []
    for entry in cls.options_class.option_fields():
        if not set(entry.metadata["modes"]) & set(cls.modes):
            continue  # an inherited option of a mode the method does not run in
        values = {
            mode: getattr(resolved[mode], entry.name)
            for mode in entry.metadata["modes"]
            if mode in resolved
        }
        if len({repr(value) for value in values.values()}) > 1:
            shown = ", ".join(f"{value} ({mode})" for mode, value in values.items())
            options.append(f"{flag(entry.name)} {shown}")
            continue
        value = next(iter(values.values()))
        text = flag(entry.name) if value is None else f"{flag(entry.name)} {value}"
        options.append(text if len(values) == len(cls.modes) else f"{text} ({', '.join(values)})")
    strategy = cls()
    schedules = {mode: strategy.lr_schedule_for(mode) for mode in cls.modes}
    if len(set(schedules.values())) == 1:
        schedule = f"--lr-schedule {next(iter(schedules.values()))}"
    else:
        schedule = "--lr-schedule " + ", ".join(f"{s} ({m})" for m, s in schedules.items())
    rates = {mode: strategy.lr_for(mode) for mode in cls.modes}
    if any(rate is not None for rate in rates.values()):
        if len(set(rates.values())) == 1:
            options.append(f"--lr {next(iter(rates.values()))}")
        else:
            options.append("--lr " + ", ".join(f"{r} ({m})" for m, r in rates.items()))
    # one option per line: a flag and its default never wrap apart
    return cls.description, ", ".join(cls.modes), "\n".join([*options, schedule])


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
