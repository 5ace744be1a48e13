"""`stratify bench privacy-utility`: every update attack against each job at no defence and
at differential privacy ε ∈ {8, 3, 1}, and SecAgg+'s cost a round, measured by
:mod:`stratify.bench.privacy_utility` and written as the CSV files docs/privacy.md's
tables are generated from."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import click

from stratify.bench.privacy_utility import (
    EPSILONS,
    SECAGG_COLUMNS,
    UTILITY_COLUMNS,
    as_csv,
    bench_privacy_utility,
    secagg_rows,
)
from stratify.cli.common import DATA_DIR, checked, write_output
from stratify.errors import ConfigError
from stratify.validation import check_seed

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
    "--seed",
    type=int,
    default=0,
    show_default=True,
    callback=checked(check_seed),
    help="Every run's seed.",
)
@click.option(
    "--secagg-repeat",
    type=click.IntRange(0, 10),
    default=2,
    show_default=True,
    help="Flower simulations with and without SecAgg+ each (0, or no flwr: none).",
)
def privacy_utility(
    out: str, data_dir: str | None, epsilons_text: str, seed: int, secagg_repeat: int
) -> None:
    """Train each job recorded as its server sees it, at no defence and at each ε, and run
    every update attack on what the server saw (without --data-dir: the digits jobs only)."""
    epsilons = parse_epsilons(epsilons_text)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)

    def on_row(row: dict[str, str]) -> None:
        click.echo(" · ".join(f"{key} {row[key]}" for key in UTILITY_COLUMNS), err=True)

    rows = bench_privacy_utility(data_dir, epsilons=epsilons, seed=seed, on_row=on_row)
    write_output(str(folder / UTILITY_FILE), as_csv(rows, UTILITY_COLUMNS), "--out")
    click.echo(f"wrote {folder / UTILITY_FILE} ({len(rows)} runs)")
    if secagg_repeat and importlib.util.find_spec("flwr") is not None:
        cost = secagg_rows(secagg_repeat)
        write_output(str(folder / SECAGG_FILE), as_csv(cost, SECAGG_COLUMNS), "--out")
        click.echo(f"wrote {folder / SECAGG_FILE} ({len(cost)} runs)")
