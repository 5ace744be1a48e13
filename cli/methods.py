"""`stratify methods`: every available method, its modes and its options with defaults;
`stratify methods NAME`: one method's options with their help (as ``stratify train
--method NAME --help`` shows them).

``--markdown`` prints the same as the defaults table of docs/methods.md (between its
``methods --markdown`` markers; a test keeps the two equal).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import click
from rich.markup import escape
from rich.table import Table

from stratify.algorithms import ALGORITHMS, strategy_class
from stratify.card import UNTUNED
from stratify.cli.console import table_console
from stratify.config import TrainConfig
from stratify.options import flag
from stratify.validation import check_choice

#: a help text's note on a default resolved later, e.g. "[default: round(N/|L|)]"
DEFAULT_NOTE = re.compile(r"\[default: (.+?)\]")


def by_mode(values: Mapping[str, object]) -> str:
    """``"10 (batch), 1 (single-sample)"``, or the one value where every mode agrees."""
    if len({repr(value) for value in values.values()}) == 1:
        return str(next(iter(values.values())))
    return ", ".join(f"{value} ({mode})" for mode, value in values.items())


def option_defaults(name: str) -> list[tuple[str, str]]:
    """``(flag, default)`` of each option of method ``name``: :func:`option_rows` without
    the help."""
    return [(option, default) for option, default, _ in option_rows(name)]


def option_rows(name: str) -> list[tuple[str, str, str]]:
    """``(flag, default, help)`` of each option of method ``name``, the default as each of
    its modes resolves it, then its ``--lr`` (its own rates per dataset family and mode,
    else its paper's, else the dataset's) and ``--lr-schedule``.

    A default left unset is the help text's ``[default: …]`` note, or ``"unset"``; an
    option of fewer modes than the method's says which (``"5 (single-sample)"``).

    Parameters
    ----------
    name : str
        A registered method.
    """
    cls = strategy_class(name)
    resolved = {mode: cls.options_class().for_mode(mode) for mode in cls.card.identity.modes}
    entries = []
    for entry in cls.options_class.option_fields():
        if not set(entry.metadata["modes"]) & set(cls.card.identity.modes):
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
            if len(values) < len(cls.card.identity.modes) and "(" not in shown:
                shown += f" ({', '.join(values)})"
        entries.append((flag(entry.name), shown, entry.metadata["help"]))
    strategy = cls()
    # the rates chosen per (dataset family, mode) first, then the paper's, then the dataset's
    rates = cls.card.rates
    own = rates.describe(cls.card.identity.modes)
    config_help = {
        entry.name: " ".join(DEFAULT_NOTE.sub("", entry.metadata["help"]).split()).replace(
            " .", "."
        )
        for entry in TrainConfig.flag_fields()
    }
    papers = {mode: strategy.paper_lr(mode) for mode in cls.card.identity.modes}
    if rates.note is not None:
        paper = rates.note
    elif any(rate is not None for rate in papers.values()):
        paper = by_mode(papers)
    else:
        paper = "the dataset's"
    # an untuned method says so: no `defaults` grid chose its rate
    rate = f"{UNTUNED}: {paper}" if own == UNTUNED else f"{own}; else {paper}"
    entries.append(("--lr", rate, config_help["lr"]))
    schedules = {mode: rates.schedule_for(mode) for mode in cls.card.identity.modes}
    entries.append(("--lr-schedule", by_mode(schedules), config_help["lr_schedule"]))
    return entries


def describe(name: str) -> tuple[str, str, str]:
    """``(description, modes, options)`` of method ``name``, as table cells."""
    try:
        cls = strategy_class(name)
    except ImportError as error:  # a registered module that cannot be imported
        return f"(unavailable: {error})", "", ""
    # one option per line: a flag and its default never wrap apart
    options = "\n".join(f"{option} {default}" for option, default in option_defaults(name))
    return cls.card.identity.description, ", ".join(cls.card.identity.modes), options


def markdown_table() -> str:
    """Every method's modes and option defaults as a Markdown table (docs/methods.md's)."""
    lines = ["| name | modes | options (defaults) |", "|---|---|---|"]
    for name in ALGORITHMS:
        cls = strategy_class(name)
        options = "<br>".join(
            f"`{option}` {default}" for option, default in option_defaults(name)
        ).replace("|", "\\|")
        lines.append(f"| `{name}` | {', '.join(cls.card.identity.modes)} | {options} |")
    return "\n".join(lines) + "\n"


def method_help(name: str) -> Table:
    """Method ``name``'s description, modes and options with their defaults and help."""
    identity = strategy_class(name).card.identity
    table = Table(
        title=f"{name}: {identity.description} (modes: {', '.join(identity.modes)})",
        caption=escape(
            f"stratify train --method {name} [options]; the common options: stratify train --help"
        ),
    )
    table.add_column("option", style="bold", no_wrap=True)
    table.add_column("default")
    table.add_column("meaning")
    for option, default, help_text in option_rows(name):
        table.add_row(option, default, help_text)
    return table


@click.command("methods")
@click.argument("name", required=False)
@click.option(
    "--markdown",
    is_flag=True,
    help="Print the modes and option defaults as a Markdown table (docs/methods.md's).",
)
def methods(name: str | None, markdown: bool) -> None:
    """List the available methods (`--method NAME` of `stratify train`); with NAME, that
    method's own options with their defaults and help."""
    if name is not None:
        table_console().print(method_help(check_choice(name, "method", tuple(ALGORITHMS))))
        return
    if markdown:
        click.echo(markdown_table(), nl=False)
        return
    table = Table(title="methods (stratify train --method NAME; stratify methods NAME)")
    table.add_column("name", style="bold", no_wrap=True)
    table.add_column("description")
    table.add_column("modes")
    table.add_column("options (defaults)")
    for name in ALGORITHMS:
        table.add_row(name, *describe(name))
    table_console().print(table)
