"""`stratify bench privacy`: the secure registry's cost over classes x clients (paper Table
IV), measured by :func:`stratify.bench.privacy.bench_privacy` and printed as tables."""

from __future__ import annotations

import json

import click
from rich import box
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from stratify.bench.privacy import PHASES, PrivacyResult, bench_privacy, parse_protocols
from stratify.cli.common import (
    JSON_OUTPUT,
    checked,
    parse_int_list,
    write_output,
)
from stratify.cli.console import table_console
from stratify.validation import check_repeats, check_seed


def format_seconds(seconds: float) -> str:
    """Durations as the paper writes them: ``8ms``, ``0.8s``, ``102s``."""
    if seconds < 0.01:
        return f"{seconds * 1e3:.1f}ms"
    if seconds < 1:
        return f"{seconds * 1e3:.0f}ms"
    if seconds < 100:
        return f"{seconds:.1f}s"
    return f"{seconds:.0f}s"


def format_speedup(speedup: float | None) -> str:
    if speedup is None:  # the naive row the others are compared with
        return "–"
    return f"{speedup:.1f}x" if speedup < 10 else f"{speedup:.0f}x"


def format_ratio(ratio: float | None) -> str:
    return "–" if ratio is None else f"{ratio:.2f}x"


# the ratio columns: each needs two protocols of a cell (stratify.bench.privacy.add_ratios)
RATIO_COLUMNS = (
    ("speed-up", "speedup", format_speedup),
    ("vs unblinded", "blind_cost", format_ratio),
)


def results_table(rows: list[dict]) -> Table:
    """One row per cell and protocol; a ratio column only where some row has its ratio
    (``speed-up`` needs the naive protocol timed beside the packed one, ``vs unblinded``
    the unblinded beside the blinded), so no column is empty."""
    table = Table(
        title="Secure registry: seconds per phase (client + server work)", box=box.SIMPLE_HEAD
    )
    ratios = [column for column in RATIO_COLUMNS if any(column[1] in row for row in rows)]
    columns = ("classes", "clients", "protocol", "unique", "mapping", "aggregation", "total")
    for column in (*columns, "verified", *(name for name, _, _ in ratios)):
        table.add_column(column, justify="left" if column == "protocol" else "right", no_wrap=True)
    for row in rows:
        table.add_row(
            str(row["classes"]),
            str(row["clients"]),
            row["protocol"],
            *(f"{row[key]:.3f}" for key in (*PHASES, "total_s")),
            "yes" if row["verified"] else "[red]NO[/red]",
            *(show(row.get(key)) for _, key, show in ratios),
        )
    return table


def table_iv(rows: list[dict], protocol: str) -> Table:
    """The paper's Table IV layout: classes down, clients across, unique + mapping + aggregation."""
    cells = {(r["classes"], r["clients"]): r for r in rows if r["protocol"] == protocol}
    clients = sorted({key[1] for key in cells})
    table = Table(
        title=f"{protocol} (Table IV layout)",
        box=box.SIMPLE_HEAD,
        caption="unique + mapping + aggregation",
    )
    table.add_column("total class")
    for count in clients:
        table.add_column(f"{count} clients", justify="right")
    for classes in sorted({key[0] for key in cells}):
        table.add_row(
            f"{classes} classes",
            *(
                " + ".join(format_seconds(cells[classes, count][phase]) for phase in PHASES)
                if (classes, count) in cells
                else ""
                for count in clients
            ),
        )
    return table


@click.command("privacy")
@click.option(
    "--classes",
    "classes_text",
    default="2,10,100",
    show_default=True,
    help="Comma-separated numbers of classes.",
)
@click.option(
    "--clients",
    "clients_text",
    default="5,10,20",
    show_default=True,
    help="Comma-separated numbers of clients.",
)
@click.option(
    "--protocol",
    "protocol_text",
    default="all",
    show_default=True,
    help="Comma-separated protocols to time: naive, packed, naive-blind, packed-blind; "
    "both (naive and packed) or all.",
)
@click.option(
    "--repeat",
    type=int,
    default=1,
    show_default=True,
    callback=checked(check_repeats),
    help="Registrations per cell and protocol (timing repetitions); phase times are their medians.",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    callback=checked(check_seed),
    help="Seed of the clients' label subsets and of the placeholders, in [0, 2**63).",
)
@JSON_OUTPUT
def privacy(
    classes_text: str,
    clients_text: str,
    protocol_text: str,
    repeat: int,
    seed: int,
    json_path: str | None,
) -> None:
    """Time the secure registry's protocols over classes x clients, verified against plain."""
    class_counts = parse_int_list(classes_text, "--classes")
    client_counts = parse_int_list(clients_text, "--clients")
    protocols = parse_protocols(protocol_text)
    console = table_console()
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
    )
    cells = len(class_counts) * len(client_counts) * len(protocols)
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("bench privacy", total=cells)
        done = iter(range(cells))  # cells finished when the next one starts

        def on_cell(classes: int, clients: int, protocol: str) -> None:
            progress.update(
                task,
                completed=next(done),
                description=f"{classes} classes x {clients} clients · {protocol}",
            )

        result: PrivacyResult = bench_privacy(
            class_counts, client_counts, protocols, repeat=repeat, seed=seed, on_cell=on_cell
        )
    if json_path:
        write_output(json_path, json.dumps(result.to_json(), indent=2) + "\n")
    console.print(results_table(result.rows))
    for name in protocols:
        console.print(table_iv(result.rows, name))
    result.check()
