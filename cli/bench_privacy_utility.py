"""`stratify bench privacy-utility`: every update attack against each job at no defence and
at differential privacy ε ∈ {8, 3, 1}, and SecAgg+'s cost a round, measured by
:mod:`stratify.bench.privacy_utility` and written as the CSV files docs/privacy.md's
tables are generated from."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import click

from stratify.bench.privacy_utility import (
    EPSILONS,
    UTILITY_COLUMNS,
    as_csv,
    bench_privacy_utility,
    secagg_rows,
)
from stratify.cli.common import DATA_DIR, checked, write_output
from stratify.data.datasets import load_dataset
from stratify.errors import ConfigError, OutputError
from stratify.reproduce.tables import SECAGG_COST_COLUMNS
from stratify.validation import check_seeds

#: the files written into ``--out``
UTILITY_FILE = "privacy-utility.csv"
SECAGG_FILE = "secagg-cost.csv"


def parse_epsilons(text: str) -> list[float]:
    """``"8,3,1"`` -> ``[8.0, 3.0, 1.0]``; anything not a list of finite ε > 0 is one
    :class:`ConfigError` line."""
    try:
        values = [float(item) for item in text.split(",") if item.strip()]
    except ValueError:
        values = []
    if not values or any(not 0 < value < float("inf") for value in values):
        raise ConfigError(f"--epsilons {text!r}: give a comma-separated list of ε > 0")
    return values


@click.command("privacy-utility")
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False),
    help=f"Folder to write {UTILITY_FILE} and {SECAGG_FILE} into (created).",
)
@DATA_DIR
@click.option(
    "--epsilons",
    "epsilons_text",
    default=",".join(f"{value:g}" for value in EPSILONS),
    show_default=True,
    help="The ε levels (δ = 1e-5, C = 1) measured besides no defence.",
)
@click.option(
    "--seeds",
    default="0,1,2",
    show_default=True,
    metavar="LIST",
    callback=checked(check_seeds),
    help="The recorded runs' seeds; the first also chooses each level's learning rate "
    "(e.g. 0,1,2 or 0..4).",
)
@click.option(
    "--secagg-repeat",
    type=click.IntRange(0, 10),
    default=2,
    show_default=True,
    help="Flower simulations with and without SecAgg+ each (0, or no flwr: none).",
)
def privacy_utility(
    out: str,
    data_dir: str | None,
    epsilons_text: str,
    seeds: tuple[int, ...],
    secagg_repeat: int,
) -> None:
    """Train each job recorded as its server sees it, at no defence and at each ε, and run
    every update attack on what the server saw (without --data-dir: the digits jobs only)."""
    epsilons = parse_epsilons(epsilons_text)
    if data_dir is not None:
        # read mnist-10k's files now: a missing or bad folder is refused before any run
        load_dataset("mnist-10k", data_dir=data_dir)
    folder = Path(out)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OutputError(f"cannot make --out {out}: {error.strerror or error}") from None
    if not os.access(folder, os.W_OK):
        raise OutputError(f"cannot write into --out {out}")

    def on_row(row: dict[str, str]) -> None:
        click.echo(" · ".join(f"{key} {row[key]}" for key in UTILITY_COLUMNS), err=True)

    rows = bench_privacy_utility(data_dir, epsilons=epsilons, seeds=seeds, on_row=on_row)
    write_output(str(folder / UTILITY_FILE), as_csv(rows, UTILITY_COLUMNS), "--out")
    click.echo(f"wrote {folder / UTILITY_FILE} ({len(rows)} runs)")
    if secagg_repeat and importlib.util.find_spec("flwr") is not None:
        cost = secagg_rows(secagg_repeat)
        write_output(str(folder / SECAGG_FILE), as_csv(cost, SECAGG_COST_COLUMNS), "--out")
        click.echo(f"wrote {folder / SECAGG_FILE} ({len(cost)} runs)")
