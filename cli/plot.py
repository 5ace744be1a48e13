"""`stratify plot RUN_DIR...`: a metric per epoch (or per event, for streams) of any run
folders, one line each."""

from __future__ import annotations

from pathlib import Path

import click

from stratify.reproduce.plots import FORMATS, METRICS, run_curves


@click.command("plot")
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option(
    "--out",
    default="accuracy.png",
    show_default=True,
    type=click.Path(dir_okay=False),
    help=f"The figure to write: {', '.join('.' + name for name in FORMATS)} (no suffix: png).",
)
@click.option(
    "--metric",
    metavar="FIELD",
    help="The field of metrics.jsonl to draw, e.g. "
    f"{', '.join(METRICS)} [default: test_accuracy for training runs, every accuracy "
    "with a value for stream runs].",
)
def plot(runs: tuple[str, ...], out: str, metric: str | None) -> None:
    """Draw METRIC per epoch of each RUN_DIR's metrics.jsonl, or per event for the run
    folders of `stratify stream` (needs the plot extra: pip install -e '.[plot]')."""
    path = run_curves(runs, Path(out), metric)
    click.echo(f"written: {path}", err=True)
