"""Plots of runs and grids, with matplotlib (the optional extra ``plot``).

:func:`run_curves` draws a metric per epoch of training run folders, or per event of
stream run folders (``stratify plot``); :func:`grid_plots` draws a grid's figures: test
accuracy per epoch (one line per column, mean over seeds), best accuracy over #C,
transfers per epoch over the chunk size. Every figure is drawn in memory and written
with :func:`~stratify.runfolder.write_output_file`, so a full disk keeps the previous
file whole.
"""

from __future__ import annotations

import io
import math
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stratify.errors import ConfigError, CorruptRunError, OutputError
from stratify.reproduce.grids import Grid
from stratify.reproduce.results import CellResult, by_group, present
from stratify.runfiles import is_count, is_metric, read_json_object, read_lines
from stratify.runfolder import describe_os_error, write_output_file

PLOT_HINT = (
    "plots need matplotlib: pip install -e '.[plot]' in the checkout (or pip install matplotlib)"
)
#: the metrics of a training run's records, listed by ``stratify plot --help``
METRICS = ("test_accuracy", "test_loss", "train_loss", "transfers", "wall_seconds")
#: the file formats a plot is written in, by the --out suffix (none: png)
FORMATS = ("png", "pdf", "svg")
#: what a record is counted by: an epoch (``stratify train``) or an event (``stratify
#: stream``), the plot's x axis
AXES = ("epoch", "events")

#: (xs, ys) per line label
Series = dict[str, tuple[list[float], list[float]]]


class PlotsUnavailable(ConfigError):
    """matplotlib is not installed."""


def pyplot() -> Any:
    """matplotlib's pyplot on a file-only backend; :class:`PlotsUnavailable` without it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotsUnavailable(PLOT_HINT) from None
    return plt


def plot_format(path: Path) -> str:
    """The format ``path`` is written in, from its suffix (none: png); another suffix is
    refused before anything is read or drawn."""
    suffix = path.suffix.lower().lstrip(".")
    if not suffix:
        return "png"
    if suffix not in FORMATS:
        raise ConfigError(
            f"--out {path}: plots are written as {', '.join('.' + f for f in FORMATS)}, "
            f"not .{suffix}"
        )
    return suffix


def line_plot(
    series: Series,
    path: Path,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    log_x: bool = False,
) -> Path:
    """One line per entry of ``series``, saved as a small figure at ``path`` (its format
    from the suffix), replacing the previous file atomically."""
    file_format = plot_format(path)
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    figure, axes = plt.subplots(figsize=(6.0, 3.8), dpi=100)
    try:
        for label, (xs, ys) in series.items():
            axes.plot(xs, ys, marker="o", markersize=3, linewidth=1.4, label=label)
        if log_x:
            axes.set_xscale("log")
        elif all(float(x).is_integer() for xs, _ in series.values() for x in xs):
            axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs, #C, events
        axes.set_title(title, fontsize=10)
        axes.set_xlabel(xlabel)
        axes.set_ylabel(ylabel)
        axes.grid(alpha=0.3)
        if len(series) > 1:
            axes.legend(fontsize=7, ncol=2 if len(series) > 5 else 1)
        figure.tight_layout()
        buffer = io.BytesIO()
        figure.savefig(buffer, format=file_format)
    finally:
        plt.close(figure)
    write_output_file(path, buffer.getvalue())
    return path


def run_label(folder: Path) -> str:
    """``algorithm · partition · seed N`` from a training run's ``config.json``, else the
    folder's name."""
    try:
        config = read_json_object(folder / "config.json")
    except (CorruptRunError, OSError):
        return folder.name
    values = [config.get(key) for key in ("algorithm", "partition", "seed")]
    if not all(isinstance(value, (str, int)) for value in values):
        return folder.name
    return f"{values[0]} · {values[1]} · seed {values[2]}"


def accuracy_like(name: str) -> bool:
    """A field drawn by default for a stream: an accuracy or an F1 score."""
    return "accuracy" in name or "f1" in name


def run_series(run: Path, metric: str | None) -> tuple[str, dict[str, tuple[list, list]]]:
    """``(axis, {field: (xs, ys)})`` of run folder ``run``: the records' x axis (``epoch``
    or ``events``) and the fields drawn — ``metric``, or by default the test accuracy of
    a training run and every accuracy-like field with a value of a stream. A value that
    is ``null`` is a gap in its line; anything else that is not a number a run could have
    measured refuses the folder in one line."""
    path = run / "metrics.jsonl"
    try:
        records = read_lines(path)
    except FileNotFoundError:
        records = []
    except OSError as error:
        raise CorruptRunError(f"{path} cannot be read ({describe_os_error(error)})") from None
    if not records:
        raise ConfigError(f"{run} has no metrics.jsonl with an epoch or an event in it")
    axis = next((name for name in AXES if name in records[0]), None)
    if axis is None:
        raise CorruptRunError(f"{path} line 1 has neither epoch nor events")
    xs = []
    for number, record in enumerate(records, start=1):
        x = record.get(axis)
        if not is_count(x):
            raise CorruptRunError(f"{path} line {number}: {axis} is {x!r:.40}, not a count")
        xs.append(x)
    if metric is not None:
        fields = [metric]
    elif axis == "epoch":
        fields = ["test_accuracy"]
    else:
        fields = [
            name
            for name in records[0]
            if accuracy_like(name) and any(is_metric(record.get(name)) for record in records)
        ]
        if not fields:
            raise ConfigError(
                f"{run} records no accuracy with a value (a stream without --test has only "
                "its prequential and window accuracies); choose a field with --metric"
            )
    series = {}
    for name in fields:
        if not any(name in record for record in records):
            numeric = sorted(key for key, value in records[0].items() if is_metric(value))
            raise ConfigError(
                f"{run}/metrics.jsonl has no {name}; its numeric fields: {', '.join(numeric)}"
            )
        ys = []
        for number, record in enumerate(records, start=1):
            value = record.get(name)
            if value is None:
                ys.append(math.nan)  # a gap: the run had no value there
            elif is_metric(value):
                ys.append(float(value))
            else:
                raise CorruptRunError(
                    f"{path} line {number}: {name} is {value!r:.40}, not a number a run writes"
                )
        if all(math.isnan(y) for y in ys):
            raise ConfigError(f"{run}/metrics.jsonl has no value of {name} (null throughout)")
        series[name] = (xs, ys)
    return axis, series


def run_curves(folders: Sequence[str | Path], path: Path, metric: str | None = None) -> Path:
    """The records of each run folder as lines (``stratify plot``): ``metric`` (default:
    the test accuracy of training runs, the accuracy-like fields of streams) per epoch,
    or per event for stream run folders.

    Raises
    ------
    ConfigError
        An unsupported ``--out`` suffix, a folder without records, a metric a folder
        lacks, training and stream runs mixed (their x axes differ).
    CorruptRunError
        A folder whose records cannot be read (not UTF-8, not JSON objects, values that
        are not numbers a run writes).
    """
    plot_format(path)  # refused before anything is read
    if not path.parent.is_dir():
        raise OutputError(f"cannot write --out {path}: no folder {path.parent}")
    runs = [Path(folder) for folder in folders]
    labels = [run_label(run) for run in runs]
    if len(set(labels)) < len(labels):  # runs of one setting: name them by their folders
        common = Path(os.path.commonpath([run.resolve() for run in runs]))
        labels = [str(run.resolve().relative_to(common)) or run.name for run in runs]
    axes = set()
    series: Series = {}
    for label, run in zip(labels, runs):
        axis, fields = run_series(run, metric)
        axes.add(axis)
        for name, values in fields.items():
            series[label if len(fields) == 1 else f"{label} · {name}"] = values
    if len(axes) > 1:
        raise ConfigError(
            "training runs (per epoch) and stream runs (per event) cannot share an x axis; "
            "plot them separately"
        )
    pyplot()  # refuse before anything is drawn
    (axis,) = axes
    ylabel = metric or ("test_accuracy" if axis == "epoch" else "accuracy")
    return line_plot(series, path, title=ylabel.replace("_", " "), xlabel=axis, ylabel=ylabel)


def curves(
    groups: dict[tuple[str, str], list[CellResult]], keys: Sequence[tuple[str, str, str]]
) -> Series:
    """``label -> mean_curve`` for each ``(label, row key, column key)`` that has epochs."""
    series: Series = {}
    for label, row_key, column_key in keys:
        measured = [result for result in groups.get((row_key, column_key), []) if result.records]
        if measured:
            series[label] = mean_curve(measured)
    return series


def mean_curve(results: Sequence[CellResult]) -> tuple[list[float], list[float]]:
    """Test accuracy per epoch, the mean over the runs that reached each epoch."""
    longest = max((len(result.records) for result in results), default=0)
    xs, ys = [], []
    for index in range(longest):
        values = [r.records[index]["test_accuracy"] for r in results if len(r.records) > index]
        xs.append(float(index + 1))
        ys.append(statistics.fmean(values))
    return xs, ys


def grid_plots(grid: Grid, results: Sequence[CellResult], out: Path) -> list[Path]:
    """The grid's figures as PNG files in ``out``; returns their paths."""
    pyplot()
    rows, columns = present(grid, results)
    groups = by_group(results)
    written = []
    if "curves" in grid.plots:
        if len(columns) == 1:
            only = columns[0]
            series = curves(groups, [(row.label, row.key, only.key) for row in rows])
            if series:
                written.append(
                    line_plot(
                        series,
                        out / "accuracy.png",
                        title=f"{grid.name}: {only.label}",
                        xlabel="epoch",
                        ylabel="test accuracy",
                    )
                )
        else:
            for row in rows:
                series = curves(groups, [(c.label, row.key, c.key) for c in columns])
                if series:
                    written.append(
                        line_plot(
                            series,
                            out / f"accuracy-{row.key}.png",
                            title=f"{grid.name}: {row.label}",
                            xlabel="epoch",
                            ylabel="test accuracy",
                        )
                    )
    if "accuracy-vs-c" in grid.plots:
        series = {}
        by_c = [
            (float(str(row.values["partition"]).split(":")[1]), row)
            for row in rows
            if str(row.values.get("partition", "")).startswith("classes:")
        ]
        for column in columns:
            points = [
                (c, statistics.fmean(best))
                for c, row in sorted(by_c, key=lambda pair: pair[0])
                if (
                    best := [
                        r.best[0]
                        for r in groups.get((row.key, column.key), [])
                        if r.best[0] is not None
                    ]
                )
            ]
            if points:
                series[column.label] = ([float(c) for c, _ in points], [a for _, a in points])
        if series:
            written.append(
                line_plot(
                    series,
                    out / "accuracy-vs-C.png",
                    title=f"{grid.name}: accuracy vs #C",
                    xlabel="#C (labels per client)",
                    ylabel="best test accuracy",
                )
            )
    if "transfers-vs-chunk" in grid.plots:
        series = {}
        for column in columns:
            for selection in ("uniform", "weighted"):
                points = [
                    (float(row.options["chunk"]), statistics.fmean(values))
                    for row in rows
                    if row.options.get("selection") == selection and "chunk" in row.options
                    if (
                        values := [
                            v
                            for r in groups.get((row.key, column.key), [])
                            if (v := r.transfers_per_epoch) is not None
                        ]
                    )
                ]
                if points:
                    label = selection if len(columns) == 1 else f"{column.label}, {selection}"
                    series[label] = ([x for x, _ in sorted(points)], [y for _, y in sorted(points)])
        if series:
            written.append(
                line_plot(
                    series,
                    out / "transfers-vs-chunk.png",
                    title=f"{grid.name}: transfers per epoch vs chunk size",
                    xlabel="chunk size CS",
                    ylabel="transfers per epoch",
                    log_x=True,
                )
            )
    return written
