"""Pieces shared by the commands: the data folder and dataset options (``-o KEY=VALUE``)."""

from __future__ import annotations

import click

from stratify.errors import DatasetError

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
