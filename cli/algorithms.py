"""`stratify algorithms`: every available method, its modes and its options with defaults.

``--markdown`` prints the same as the defaults table of docs/methods.md (between its
``algorithms --markdown`` markers; a test keeps the two equal).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import click
from rich.console import Console
from rich.table import Table

from stratify.algorithms import ALGORITHMS, strategy_class
from stratify.options import flag

#: a help text's note on a default resolved later, e.g. "[default: round(N/|L|)]"
DEFAULT_NOTE = re.compile(r"\[default: (.+?)\]")


def by_mode(values: Mapping[str, object]) -> str:
    """``"10 (batch), 1 (single-sample)"``, or the one value where every mode agrees."""
    if len({repr(value) for value in values.values()}) == 1:
        return str(next(iter(values.values())))
    return ", ".join(f"{value} ({mode})" for mode, value in values.items())


def option_defaults(name: str) -> list[tuple[str, str]]:
    """``(flag, default)`` of each option of algorithm ``name``, as each of its modes
    resolves it, then its ``--lr`` (its own rates per dataset family and mode, else its
    paper's, else the dataset's) and ``--lr-schedule``.

    A default left unset is the help text's ``[default: …]`` note, or ``"unset"``; an
    option of fewer modes than the method's says which (``"5 (single-sample)"``).
    """
    cls = strategy_class(name)
    resolved = {mode: cls.options_class().for_mode(mode) for mode in cls.modes}
    entries = []
    for entry in cls.options_class.option_fields():
        if not set(entry.metadata["modes"]) & set(cls.modes):
            continue  # an inherited option of a mode the method does not run in
        values = {
            mode: getattr(resolved[mode], entry.name)
            for mode in entry.metadata["modes"]
            if mode in resolved
        }
        if all(value is None for value in values.values()):
            note = DEFAULT_NOTE.search(entry.metadata["help"])
            shown = note.group(1) if note else "unset"
        else:
            shown = by_mode(values)
            if len(values) < len(cls.modes) and "(" not in shown:
                shown += f" ({', '.join(values)})"
        entries.append((flag(entry.name), shown))
    strategy = cls()
    # the rates chosen per (dataset family, mode) first, then the paper's, then the dataset's
    own = ", ".join(
        f"{lr} on {family} ({mode})"
        for (family, mode), lr in cls.own_rates().items()
        if mode in cls.modes
    )
    papers = {mode: strategy.paper_lr(mode) for mode in cls.modes}
    if cls.lr_note is not None:
        paper = cls.lr_note
    elif any(rate is not None for rate in papers.values()):
        paper = by_mode(papers)
    else:
        paper = "the dataset's"
    entries.append(("--lr", f"{own}; else {paper}" if own else paper))
    schedules = {mode: strategy.lr_schedule_for(mode) for mode in cls.modes}
    entries.append(("--lr-schedule", by_mode(schedules)))
    return entries


def describe(name: str) -> tuple[str, str, str]:
    """``(description, modes, options)`` of algorithm ``name``, as table cells."""
    try:
        cls = strategy_class(name)
    except ImportError as error:  # a registered module that cannot be imported
        return f"(unavailable: {error})", "", ""
    # one option per line: a flag and its default never wrap apart
    options = "\n".join(f"{option} {default}" for option, default in option_defaults(name))
    return cls.description, ", ".join(cls.modes), options


def markdown_table() -> str:
    """Every algorithm's modes and option defaults as a Markdown table (docs/methods.md's)."""
    lines = ["| name | modes | options (defaults) |", "|---|---|---|"]
    for name in ALGORITHMS:
        cls = strategy_class(name)
        options = "<br>".join(
            f"`{option}` {default}" for option, default in option_defaults(name)
        ).replace("|", "\\|")
        lines.append(f"| `{name}` | {', '.join(cls.modes)} | {options} |")
    return "\n".join(lines) + "\n"


@click.command("algorithms")
@click.option(
    "--markdown",
    is_flag=True,
    help="Print the modes and option defaults as a Markdown table (docs/methods.md's).",
)
def algorithms(markdown: bool) -> None:
    """List the available algorithms (`--algorithm NAME` of `stratify train`)."""
    if markdown:
        click.echo(markdown_table(), nl=False)
        return
    table = Table(title="algorithms (stratify train --algorithm NAME)")
    table.add_column("name", style="bold", no_wrap=True)
    table.add_column("description")
    table.add_column("modes")
    table.add_column("options (defaults)")
    for name in ALGORITHMS:
        table.add_row(name, *describe(name))
    Console().print(table)
