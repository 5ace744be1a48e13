"""`stratify bench local`: a single-sample baseline's round with the clients' local training
compiled against the eager local loop, measured by :func:`stratify.bench.local.bench_local`."""

from __future__ import annotations

import json

import click
from rich.table import Table

from stratify.bench.local import bench_local
from stratify.bench.steps import MATCH_TOLERANCE
from stratify.cli.common import DATA_DIR, JSON_OUTPUT, write_output
from stratify.cli.console import table_console


@click.command("local")
@click.option(
    "--method",
    "--algorithm",
    "algorithm",
    default=None,
    help="A method whose single-sample local jobs can be timed (its card sets "
    "bench.benchmark_local) [default: the first registered one]; --algorithm is an alias.",
)
@click.option("--dataset", default="mnist-10k", show_default=True)
@DATA_DIR
@click.option("--partition", "spec", default="dirichlet:0.5", show_default=True)
@click.option("--clients", default=10, show_default=True, type=int)
@click.option("--rounds", default=3, show_default=True, type=int, help="Timed rounds of each.")
@JSON_OUTPUT
def local(dataset, data_dir, spec, clients, algorithm, rounds, json_path) -> None:
    """Seconds per round of a single-sample baseline (a table1 cell): compiled local
    training against the eager local loop, the same rounds, the weights checked."""
    result = bench_local(
        algorithm, dataset=dataset, data_dir=data_dir, spec=spec, clients=clients, rounds=rounds
    )
    figures = result.to_json()
    table = Table(
        title=f"{result.method} · single-sample · {dataset} · {spec} · {clients} clients · "
        f"median of rounds 2-{rounds + 1}"
    )
    for column in ("local training", "s / round", "rounds (s)", "vs eager"):
        table.add_column(column, justify="left" if column == "local training" else "right")
    for name, values in (
        ("eager loop", result.eager_rounds_s),
        ("compiled step", result.compiled_rounds_s),
    ):
        median = figures["eager_round_s" if name == "eager loop" else "compiled_round_s"]
        table.add_row(
            name,
            f"{median:.2f}",
            ", ".join(f"{value:.2f}" for value in values),
            f"{figures['eager_round_s'] / median:.2f}×",
        )
    console = table_console()
    console.print(table)
    console.print(
        f"weights {'match' if result.weights_match else 'DO NOT MATCH'}: every client's local "
        f"training compiled ends within {result.worst_share:.1e} of the eager loop's movement "
        f"(tolerance {MATCH_TOLERANCE:g}); {result.rechecked_jobs} job(s) agreed only when "
        "re-checked in pieces"
    )
    if json_path:
        write_output(json_path, json.dumps(figures, indent=2) + "\n")
    result.check()
