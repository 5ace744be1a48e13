"""Pieces shared by the commands: the data folder and dataset options (``-o KEY=VALUE``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from stratify.errors import ConfigError, DatasetError, OutputError
from stratify.runfolder import write_file
from stratify.vectorize import DEFAULT_GROUP_SIZE

#: ``--data-dir``, read from ``STRATIFY_DATA_DIR`` when not given; no default folder.
DATA_DIR = click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    default=None,
    envvar="STRATIFY_DATA_DIR",
    help="Folder holding the dataset files (env STRATIFY_DATA_DIR).",
)

#: ``-o KEY=VALUE``: a dataset loader's option; repeatable.
DATASET_OPTION = click.option(
    "-o",
    "--dataset-option",
    "dataset_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Dataset option, repeatable (e.g. -o correlation=0.9 for colored-mnist).",
)


#: ``--vectorize [K]``: runs that can share a step go in groups of K, stepped together
VECTORIZE_OPTION = click.option(
    "--vectorize",
    is_flag=False,
    flag_value=str(DEFAULT_GROUP_SIZE),
    default=None,
    metavar="[K]",
    help="Step runs that share a model and a single-sample step together, K to a group, "
    f"their weights stacked under one vmapped compiled step [K: {DEFAULT_GROUP_SIZE}]; "
    "the others run alone.",
)


def parse_options(pairs: tuple[str, ...]) -> dict[str, str]:
    """``("correlation=0.5", ...)`` -> ``{"correlation": "0.5", ...}`` (dataset options).

    Values stay text: the dataset's loader converts each with the type it declares, so
    ``-o angles=abc`` is refused naming the option and what is valid.
    """
    options = {}
    for pair in pairs:
        key, separator, value = pair.partition("=")
        if not separator or not key.strip():
            raise DatasetError(
                f"dataset option {pair!r} is not KEY=VALUE; use e.g. -o correlation=0.5"
            )
        key = key.strip().replace("-", "_")
        if key in ("data_dir", "device", "seed"):
            # load_dataset takes these itself; as options they would be a duplicate keyword
            raise DatasetError(
                f"-o {key}=... is not a dataset option; the seed and the data folder are "
                "set with --seed and --data-dir"
            )
        options[key] = value.strip()
    return options


def checked(
    check: Callable[[Any, str], Any],
) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A click callback that runs the library's ``check(value, flag)`` on an option's value,
    so a bad value is refused with the same line as in ``stratify train``.

    Parameters
    ----------
    check : callable
        One of the :mod:`stratify.validation` checks.
    """

    def callback(context: click.Context, parameter: click.Parameter, value: Any) -> Any:
        return value if value is None else check(value, parameter.opts[0])

    return callback


def check_output_file(value: object, flag: str) -> str:
    """A file the command will write at its end, checked now so a long benchmark does not
    end in an error: its folder must exist and the name must not be a folder's. A device,
    a FIFO or ``/dev/stdout`` is written through (:func:`~stratify.runfolder.write_file`),
    a symlink at its target."""
    path = Path(str(value))
    if path.is_dir():
        raise OutputError(f"{flag} {value} is a folder; give a file name")
    if path.exists() and not path.is_file():
        return str(value)  # a device or a FIFO: written through, not replaced
    folder = Path(os.path.realpath(path)).parent
    if not folder.is_dir():
        raise OutputError(f"cannot write {flag} {value}: no folder {folder}")
    if not os.access(folder, os.W_OK):
        raise OutputError(f"cannot write {flag} {value}: the folder {folder} is read-only")
    return str(value)


def write_output(path: str, data: str | bytes, flag: str = "--json") -> None:
    """Write ``data`` to the user's file ``path`` (:func:`~stratify.runfolder.write_file`:
    a regular file replaced atomically, a symlink written at its target, a device, a FIFO
    or ``/dev/stdout`` written through); a path that cannot be written (a missing folder,
    a read-only one, a folder of that name, a FIFO nobody reads, a full disk) is one
    :class:`OutputError` line, and a file already there is kept.

    Parameters
    ----------
    path : str
        The file named by the user.
    data : str or bytes
        Its new content.
    flag : str
        The option that named it, for the message.
    """
    try:
        write_file(Path(path), data.encode() if isinstance(data, str) else data, flag)
    except OSError as error:
        kept = " (its previous version is kept)" if os.path.isfile(path) else ""
        reason = error.strerror or error
        raise OutputError(f"cannot write {flag} {path}: {reason}{kept}") from None


#: ``--json FILE`` of the benches: the figures also as JSON, checked before the work
JSON_OUTPUT = click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False),
    callback=checked(check_output_file),
    help="Also write the figures to this JSON file.",
)


def parse_int_list(text: str, flag: str) -> list[int]:
    """``"2,10,100"`` -> ``[2, 10, 100]``, each value once; anything else is a one-line
    :class:`~stratify.errors.ConfigError`.

    Parameters
    ----------
    text : str
        Comma-separated integers, each at least 1.
    flag : str
        The option's name, for the error message.
    """
    parts = [part.strip() for part in text.split(",") if part.strip()]
    try:
        values = [int(part) for part in parts]
    except ValueError:
        raise ConfigError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise ConfigError(f"{flag} takes integers of at least 1, got {text!r}")
    return list(dict.fromkeys(values))  # repeated values would only repeat a row
