"""The manual's generated tables, written between their markers from the command line's
own definitions, so the docs cannot drift from ``--help`` (docs/architecture.md,
"Command line").

``python -m stratify.cli.docs_tables`` rewrites every block; ``--check`` only reports the
stale ones and exits with 1 (``make docs`` runs it). A block is the text between
``<!-- begin: NAME -->`` and ``<!-- end: NAME -->`` on the page that holds it.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

import click

from stratify.cli.methods import markdown_table
from stratify.cli.train import method_options, train

#: the repository's docs folder
DOCS = Path(__file__).resolve().parents[1] / "docs"

#: a help text's note on a default resolved later, e.g. "[default: round(N/|L|)]"
DEFAULT_NOTE = re.compile(r"\s*\[default: (.+?)\]")


def cell(text: str) -> str:
    """``text`` as one Markdown table cell: one line, ``|`` escaped, and ``<``/``>``
    outside code spans as entities (``runs/<time>`` is not an HTML tag)."""
    pieces = " ".join(text.split()).replace("|", "\\|").split("`")
    for index in range(0, len(pieces), 2):  # the even pieces are outside code spans
        pieces[index] = pieces[index].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(pieces)


def option_names(parameter: click.Option) -> str:
    """``--secure/--no-secure``, or the flags joined: ``--method``, ``--algorithm``."""
    if parameter.secondary_opts:
        return f"`{parameter.opts[0]}/{parameter.secondary_opts[0]}`"
    return ", ".join(f"`{name}`" for name in parameter.opts)


def shown_default(parameter: click.Option, help_text: str) -> str:
    """What the table says of ``parameter``'s default: its value, the help's ``[default:
    …]`` note, its environment variable, or ``–``."""
    note = DEFAULT_NOTE.search(help_text)
    # a plain value; click marks "no default" with a sentinel of its own
    if isinstance(parameter.default, (str, int, float)) and not parameter.is_flag:
        return f"`{parameter.default}`"
    if parameter.secondary_opts:  # a --x/--no-x pair: the side that is on by default
        return f"`{parameter.opts[0] if parameter.default else parameter.secondary_opts[0]}`"
    if note:
        return note.group(1)
    if parameter.envvar:
        return f"`${parameter.envvar}`"
    return "–"


def train_options_table() -> str:
    """``stratify train``'s common options (every option but the methods' own) as a
    Markdown table: option, default, meaning, all from the command's definitions."""
    own = set(method_options())
    lines = ["| option | default | meaning |", "|---|---|---|"]
    for parameter in train.params:
        if not isinstance(parameter, click.Option) or parameter.name in own:
            continue
        help_text = parameter.help or ""
        meaning = DEFAULT_NOTE.sub("", help_text).strip()
        lines.append(
            f"| {option_names(parameter)} | {cell(shown_default(parameter, help_text))} "
            f"| {cell(meaning)} |"
        )
    return "\n".join(lines) + "\n"


def method_options_table() -> str:
    """Every method option of ``stratify train`` with the methods that take it and its
    help (of its first method); the defaults per method are ``stratify methods NAME``."""
    lines = ["| option | methods | meaning |", "|---|---|---|"]
    for name, takers in method_options().items():
        meaning = DEFAULT_NOTE.sub("", takers[0][1].metadata["help"]).strip()
        methods = ", ".join(f"`{method}`" for method, _ in takers)
        lines.append(f"| `--{name.replace('_', '-')}` | {methods} | {cell(meaning)} |")
    return "\n".join(lines) + "\n"


#: block name -> (page under docs/, what writes the block)
TABLES: dict[str, tuple[str, Callable[[], str]]] = {
    "stratify train options": ("usage.md", train_options_table),
    "stratify train method options": ("usage.md", method_options_table),
    "stratify methods --markdown": ("methods.md", markdown_table),
}


def markers(name: str) -> tuple[str, str]:
    return f"<!-- begin: {name} -->\n", f"<!-- end: {name} -->"


def committed(name: str, docs: Path = DOCS) -> str:
    """The block ``name`` as the page holds it now."""
    page, _ = TABLES[name]
    text = (docs / page).read_text(encoding="utf-8")
    begin, end = markers(name)
    if text.count(begin) != 1 or text.count(end) != 1:
        raise click.ClickException(f"docs/{page} must hold one pair of markers {begin.strip()}")
    return text[text.index(begin) + len(begin) : text.index(end)]


def write_tables(docs: Path = DOCS, check: bool = False) -> list[str]:
    """Rewrite every generated block under ``docs`` (with ``check``, only compare);
    returns the names of the blocks that were stale.

    Parameters
    ----------
    docs : Path
        The docs folder.
    check : bool
        Report the stale blocks without writing them.
    """
    stale = []
    for name, (page, make) in TABLES.items():
        old, new = committed(name, docs), make()
        if old == new:
            continue
        stale.append(name)
        if not check:
            path = docs / page
            text = path.read_text(encoding="utf-8")
            begin, end = markers(name)
            start = text.index(begin) + len(begin)
            path.write_text(text[:start] + new + text[text.index(end) :], encoding="utf-8")
    return stale


@click.command()
@click.option("--check", is_flag=True, help="Only report stale tables (exit code 1).")
def main(check: bool) -> None:
    """Write the manual's generated tables between their markers."""
    stale = write_tables(check=check)
    for name in stale:
        click.echo(f"{'stale' if check else 'rewrote'}: {TABLES[name][0]}: {name}", err=True)
    if check and stale:
        click.echo("run: python -m stratify.cli.docs_tables", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
