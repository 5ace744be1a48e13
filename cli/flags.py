"""Click flags made from the library's option fields, without torch.

A command whose flags are the :func:`~stratify.options.option` fields of a dataclass
(``train``'s :class:`~stratify.config.TrainConfig`, ``stream``'s
:class:`~stratify.stream.config.StreamConfig`) makes each with :func:`config_option`;
nothing here imports the engine, so ``stratify stream`` builds its command line without
loading torch (docs/architecture.md, "Options").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import click

from stratify.options import flag
from stratify.validation import check_choice

METAVARS = {int: "INTEGER", float: "NUMBER", str: "TEXT"}

#: flags of a TrainConfig field other than its own name: the method is ``--method``
#: (one word for the concept, docs/architecture.md "Command line"), ``--algorithm`` its
#: earlier name, kept as an alias
FLAG_NAMES = {"algorithm": ("--method", "--algorithm")}


class Choice(click.Choice):
    """click's choice of a library setting (listed in ``--help``, completed by the shell),
    refusing any other value before the command runs with the library's own line
    (``unknown --model 'nope'; choose one of cnn, mlp, …``), as a Python caller sees it."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        flag = param.opts[0] if param is not None else "value"
        return check_choice(value, flag, tuple(self.choices))


def metavar(entry: dataclasses.Field) -> str:
    """How ``--help`` shows the value of option field ``entry``: its choices, or its type.

    Parameters
    ----------
    entry : dataclasses.Field
        A field made with :func:`~stratify.options.option`.
    """
    choices = entry.metadata["choices"]
    if choices:
        return "[" + "|".join(choices) + "]"
    return METAVARS.get(entry.metadata["type"], "TEXT")


def config_option(entry: dataclasses.Field) -> Callable:
    """The click option of a command's option field, with its help and default; a field
    with choices is a click choice, refused before the command runs.

    Parameters
    ----------
    entry : dataclasses.Field
        A field made with :func:`~stratify.options.option`.
    """
    name = flag(entry.name)
    meta = entry.metadata
    if meta["type"] is bool:
        return click.option(
            f"{name}/--no-{name[2:]}", default=entry.default, show_default=True, help=meta["help"]
        )
    return click.option(
        *FLAG_NAMES.get(entry.name, (name,)),
        entry.name,
        type=Choice(meta["choices"]) if meta["choices"] else None,
        default=entry.default,
        show_default=entry.default is not None,
        metavar=metavar(entry),
        envvar=meta["envvar"],
        help=meta["help"],
    )
