"""`stratify data`: what each dataset needs on disk, whether it is there, and the download
of those that can be fetched (:mod:`stratify.data.sources`)."""

from __future__ import annotations

import os
from pathlib import Path

import click
from click.core import ParameterSource
from rich.table import Table

from stratify.cli.common import DATA_DIR
from stratify.cli.console import table_console
from stratify.cli.partition_stats import partition_stats
from stratify.data.sources import (
    check_data_folder,
    check_published,
    download,
    missing_entries,
    source,
    sources,
    status,
)
from stratify.errors import ConfigError


@click.group("data")
def data() -> None:
    """What each dataset needs under --data-dir, its download, and the statistics of a
    partition of it."""


data.add_command(partition_stats)


@data.command("list")
@DATA_DIR
def list_command(data_dir: str | None) -> None:
    """Each dataset: the files it needs, where they are looked for, whether they are there."""
    if data_dir:
        check_data_folder(Path(data_dir), "--data-dir")
    root = Path(os.path.realpath(data_dir)) if data_dir else None
    if root is None:
        where = "none given (--data-dir DIR or STRATIFY_DATA_DIR)"
    else:
        given = click.get_current_context().get_parameter_source("data_dir")
        origin = "STRATIFY_DATA_DIR" if given == ParameterSource.ENVIRONMENT else "--data-dir"
        where = f"{root} (from {origin})"
    console = table_console()
    table = Table(title=f"datasets · data folder: {where}")
    for column in ("dataset", "status", "files (under the data folder)", "get them"):
        table.add_column(column, no_wrap=column in ("dataset", "status"))
    for name, item in sources().items():
        state = status(item, root)
        shown = {"present": "[green]present[/green]", "missing": "[red]missing[/red]"}
        files = item.files
        gaps = missing_entries(item, root) if root is not None else []
        if state == "missing" and 0 < len(gaps) < len(item.layouts[0]):  # partly there
            files += f" — lacks {', '.join(gaps)}"
        if item.download is not None:
            how = f"stratify data download {name} --dir DIR"
        elif item.kind == "files":
            how = item.how
        else:
            how = "nothing to get"
        table.add_row(name, shown.get(state, state), files, how)
    console.print(table)


@data.command("download")
@click.argument("name")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False),
    envvar="STRATIFY_DATA_DIR",
    help="The data folder to download into (then pass it as --data-dir) [env STRATIFY_DATA_DIR].",
)
def download_command(name: str, directory: str | None) -> None:
    """Download dataset NAME's files into --dir, checked against their checksums."""
    item = source(name)  # an unknown name is refused before --dir is looked at
    if directory is None:
        raise ConfigError("give --dir DIR, the folder to download into")
    folder = Path(directory)
    check_data_folder(folder, "--dir")
    if item.download is not None and status(item, folder) == "present":
        check_published(name, item, folder)
        checked = " (checked against the published checksums)" if item.checksums else ""
        click.echo(f"{name}: already present in {folder} ({item.files}){checked}")
        return
    placed = download(name, folder)
    for path in placed:
        click.echo(f"placed {path}")
    click.echo(f"{name}: ready; train with --dataset {name} --data-dir {folder}")
