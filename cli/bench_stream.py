"""`stratify bench stream`: ``stratify stream`` with its defaults against a bare eager
PyTorch loop doing the same per-event work, on a tabular stream and on digits
(:mod:`stratify.bench.stream`); with ``--river-suite``, the stream learner beside river's
models on river's streams (:mod:`stratify.bench.river_suite`)."""

from __future__ import annotations

import json
import time

import click
from rich.table import Table

from stratify.bench.river_suite import results_csv, run_suite
from stratify.bench.stream import stream_bench
from stratify.cli.common import JSON_OUTPUT, check_output_file, checked, write_output
from stratify.cli.console import table_console
from stratify.errors import ConfigError
from stratify.validation import check_positive_int, check_seed

#: the most of each size the benchmark accepts (a bench that should take minutes)
LIMITS = {
    "--events": 100_000,
    "--features": 10_000,
    "--classes": 1_000,
    "--clients": 100,
    "--repeat": 10,
    "--river-events": 50_000,
}


def check_size(value: object, flag: str) -> int:
    """A positive integer within the benchmark's limit for ``flag``."""
    number = check_positive_int(value, flag)
    if number > LIMITS[flag]:
        raise ConfigError(f"{flag} takes at most {LIMITS[flag]:,}, got {number:,}")
    return number


@click.command("stream")
@click.option("--events", default=5000, show_default=True, type=int, callback=checked(check_size))
@click.option("--features", default=20, show_default=True, type=int, callback=checked(check_size))
@click.option("--classes", default=5, show_default=True, type=int, callback=checked(check_size))
@click.option("--clients", default=10, show_default=True, type=int, callback=checked(check_size))
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "--repeat",
    default=1,
    show_default=True,
    type=int,
    callback=checked(check_size),
    help="How many timing repetitions: the command, the bare loop and river (with --river-suite, "
    "every learner) run this many times per stream, alternating, each keeping its best events/s.",
)
@click.option(
    "--river-suite",
    is_flag=True,
    help="Instead: the stream learner beside river's LR, Hoeffding Adaptive Tree and Adaptive "
    "Random Forest on every stream river ships as a file, Agrawal 0→2 and SINE flip (a change "
    'at event 3,000) and digits (docs/streaming.md, "Against river").',
)
@click.option(
    "--river-events",
    default=10_000,
    show_default=True,
    type=int,
    callback=checked(check_size),
    help="With --river-suite: at most this many events of each stream.",
)
@click.option(
    "--river-csv",
    type=click.Path(dir_okay=False),
    callback=checked(check_output_file),
    help="With --river-suite: write its rows to this CSV file (docs/results/stream-river.csv).",
)
@JSON_OUTPUT
def stream(
    events: int,
    features: int,
    classes: int,
    clients: int,
    seed: int,
    repeat: int,
    river_suite: bool,
    river_events: int,
    river_csv: str | None,
    json_path: str | None,
) -> None:
    """Events/s of `stratify stream` (defaults) against a bare eager PyTorch loop (parse,
    predict, one SGD step of the same MLP) and, where river is installed, river's OvR
    logistic regression, seconds to the first prediction and peak memory, on a tabular
    stream (EVENTS events, FEATURES features, CLASSES classes, CLIENTS clients) and on
    scikit-learn's digits; and how many of the first 5 and 20 examples of a class that
    appears late are predicted right (5 tabular streams). With --river-suite, instead, the
    stream learner beside river's models on river's streams (docs/streaming.md)."""
    # numpy's generator refuses a negative seed with a bare ValueError ("a bug")
    seed = check_seed(seed)
    if river_suite:
        river_suite_tables(river_events, river_csv, json_path, repeat)
        return
    if river_csv is not None:
        raise ConfigError("--river-csv goes with --river-suite")
    result = stream_bench(events, features, classes, clients, seed, repeat=repeat)
    # two tables, so each fits 80 columns (a log, a pipe)
    best = f", best of {repeat}" if repeat > 1 else ""
    table = Table(title=f"stratify stream against a bare eager PyTorch loop{best}")
    columns = ["stream", "events", "events/s", "bare torch/s", "ratio", "1st pred. s", "RSS MB"]
    for column in [*columns, "accuracy"]:
        table.add_column(column, justify="right")
    river = Table(title="and river's OvR logistic regression on the same lines")
    for column in ("stream", "river events/s", "stratify / river", "river accuracy"):
        river.add_column(column, justify="right")
    for row in result.streams:
        accuracy = row.prequential_accuracy
        table.add_row(
            row.name,
            f"{row.events:,}",
            f"{row.events_per_s:.0f}",
            f"{row.bare_torch_events_per_s:.0f}",
            f"{row.ratio:.2f}×",
            f"{row.first_prediction_s:.2f}",
            f"{row.peak_rss_mb:.0f}",
            "-" if accuracy is None else f"{accuracy:.4f}",
        )
        if row.river_events_per_s is not None:
            river.add_row(
                row.name,
                f"{row.river_events_per_s:.0f}",
                f"{row.river_ratio:.2f}×",
                f"{row.river_prequential_accuracy:.4f}",
            )
    console = table_console()
    console.print(table)
    if river.row_count:
        console.print(river)
    late = result.late_class
    if late is not None:
        lateness = Table(title=f"a class that appears late ({late.seeds} streams)")
        for column in ("learner", "first 5 right", "first 20 right"):
            lateness.add_column(column, justify="right")
        lateness.add_row("stratify stream", f"{late.first_5:.0%}", f"{late.first_20:.0%}")
        if late.river_first_5 is not None and late.river_first_20 is not None:
            lateness.add_row(
                "river OvR LR", f"{late.river_first_5:.0%}", f"{late.river_first_20:.0%}"
            )
        console.print(lateness)
    load = ", ".join(f"{value:.2f}" for value in result.load_average)
    console.print(f"load average while measured: {load}", markup=False, highlight=False)
    if json_path:
        write_output(json_path, json.dumps(result.as_dict(), indent=2) + "\n")


def river_suite_tables(
    limit: int, csv_path: str | None, json_path: str | None, repeat: int = 1
) -> None:
    """Run the river suite (:func:`~stratify.bench.river_suite.run_suite`), print its
    table and write its files."""
    import importlib.util

    if importlib.util.find_spec("river") is None:
        raise ConfigError("--river-suite needs river: pip install -e '.[river]' in the checkout")
    start = time.perf_counter()
    rows, load = run_suite(limit, repeat=repeat)
    wall = time.perf_counter() - start
    best = f", best of {repeat}" if repeat > 1 else ""
    table = Table(
        title=f"the stream learner against river's models (at most {limit:,} events{best})"
    )
    columns = ["stream", "learner", "accuracy %", "after drift %", "events/s", "stratify ×"]
    for column in [*columns, "1st pred. s", "RSS MB", "model %"]:
        table.add_column(column, justify="right")
    for row in rows:
        line = row.csv_row()
        table.add_row(
            row.stream,
            row.learner,
            line["accuracy"],
            line["after_drift_accuracy"] or "-",
            line["events_per_s"],
            line["stratify_ratio"],
            line["first_prediction_s"],
            line["peak_rss_mb"],
            line["model_share"] or "-",
        )
    console = table_console()
    console.print(table)
    figures = ", ".join(f"{value:.2f}" for value in load)
    console.print(
        f"load average after the run: {figures}; wall time {wall:.0f} s",
        markup=False,
        highlight=False,
    )
    if csv_path:
        write_output(csv_path, results_csv(rows), flag="--river-csv")
    if json_path:
        result = {"rows": [row.csv_row() for row in rows], "load_average": load, "wall_s": wall}
        write_output(json_path, json.dumps(result, indent=2) + "\n")
