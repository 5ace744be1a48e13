"""`stratify bench`: the benchmarks of :mod:`stratify.bench` as commands: each parses its
options, calls the library's function, prints its result as tables and writes it with
``--json`` (docs/architecture.md, "Benchmarks")."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click
import torch
from rich.console import Console
from rich.table import Table

from stratify.backend import DEVICES
from stratify.bench.plan import bench_plan
from stratify.bench.steps import LANE_CHECK_TOLERANCE, MATCH_TOLERANCE, bench_steps
from stratify.bench.training import bench_batch, bench_rounds
from stratify.bench.transfers import bench_transfers
from stratify.cli.bench_local import local
from stratify.cli.bench_privacy import privacy
from stratify.cli.bench_privacy_utility import privacy_utility
from stratify.cli.bench_stream import stream
from stratify.cli.common import (
    DATA_DIR,
    DATASET_OPTION,
    JSON_OUTPUT,
    checked,
    parse_int_list,
    parse_options,
    write_output,
)
from stratify.cli.console import table_console
from stratify.cli.flags import Choice
from stratify.compiled import COMPILE_MODES
from stratify.config import TrainConfig
from stratify.errors import ConfigError
from stratify.nn.models import MODELS, NORMS
from stratify.options import option_default
from stratify.selection import HOPS, SELECTIONS
from stratify.stratify import BATCH_PATHS, Stratify, StratifyOptions
from stratify.validation import check_positive, check_positive_int, check_seeds

#: ``--threads``: the benchmark process's torch threads (batch mode keeps torch's default)
THREADS = click.option(
    "--threads",
    type=int,
    default=None,
    help="torch threads of the process [default: torch's, as batch-mode runs use].",
)


#: the library's defaults the benchmarks share with `stratify train`
TRAIN_DEFAULTS = {
    name: option_default(TrainConfig, name) for name in ("dataset", "clients", "device")
}

#: ``--lr`` of the benchmarks that train: the library's rate when not given
LR = click.option(
    "--lr",
    type=float,
    default=None,
    callback=checked(check_positive),
    help="Base learning rate [default: the library's for the dataset, as stratify train].",
)

#: ``--model`` of the benchmarks that build a model: the library's when not given
MODEL = click.option(
    "--model",
    "model_name",
    type=Choice(tuple(MODELS)),
    default=None,
    help="[default: the library's: cnn for images, mlp for tabular data]",
)


def split_options(dataset: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The options every benchmark that splits a dataset takes: ``--dataset`` (default
    ``dataset``, else the library's), ``--data-dir``, ``--partition`` and ``--clients``."""
    options = (
        click.option("--dataset", default=dataset or TRAIN_DEFAULTS["dataset"], show_default=True),
        DATA_DIR,
        click.option("--partition", "spec", default="dirichlet:0.5", show_default=True),
        click.option("--clients", default=TRAIN_DEFAULTS["clients"], show_default=True, type=int),
    )

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


#: torch threads ``--threads`` may ask for: far above any machine's cores, far below the
#: count whose creation fails (100,000 aborted the process in OpenMP, no line)
MAX_THREADS = 1024


def set_threads(threads: int | None) -> None:
    """Set torch's threads to ``--threads`` (refused unless 1 to :data:`MAX_THREADS`).

    Parameters
    ----------
    threads : int or None
        The option's value; ``None`` keeps torch's default.
    """
    if threads is not None:
        count = check_positive_int(threads, "--threads")
        if count > MAX_THREADS:
            raise ConfigError(f"--threads takes at most {MAX_THREADS:,}, got {count:,}")
        torch.set_num_threads(count)


def seeds_option(default: str, help_text: str) -> Callable[[Callable[..., Any]], Any]:
    """``--seeds LIST``: a list of seeds, as in every command (``0,1,2`` or ``0..4``)."""
    return click.option(
        "--seeds",
        default=default,
        show_default=True,
        metavar="LIST",
        callback=checked(check_seeds),
        help=f"{help_text} (e.g. 0,1,2 or 0..4).",
    )


@click.group("bench")
def bench() -> None:
    """Benchmarks that print figures (and write them with --json): engine steps/s,
    planning cost, batch-mode overhead, seconds per round, transfers, the privacy
    protocol's cost, streaming."""


@bench.command("transfers")
@split_options(dataset="mnist-10k")
@click.option("--chunks", default="1,5,50,150", show_default=True)
@seeds_option("0..4", "Seeds of the epoch schedules averaged")
@click.option("--selection", type=click.Choice(SELECTIONS), default="uniform", show_default=True)
@click.option(
    "--hops",
    type=click.Choice(HOPS),
    default="server",
    show_default=True,
    help="Between two holders the model is relayed by the server (2 transfers) or sent "
    "directly (1); the chain starts and ends at the server.",
)
@JSON_OUTPUT
def transfers(dataset, data_dir, spec, clients, chunks, seeds, selection, hops, json_path) -> None:
    """Model transfers per epoch for chunk sizes CS (planning only, no training)."""
    chunk_sizes = parse_int_list(chunks, "--chunks")
    result = bench_transfers(
        dataset,
        chunk_sizes,
        data_dir=data_dir,
        spec=spec,
        clients=clients,
        seeds=seeds,
        selection=selection,
        hops=hops,
    )
    table = Table(
        title=f"transfers per epoch · {dataset} · {spec} · {clients} clients · {selection} "
        f"selection · hops via {hops} · mean of {len(seeds)}"
    )
    for column in ("CS", "arrivals", "transfers", f"vs CS={chunk_sizes[0]}"):
        table.add_column(column, justify="right")
    for row in result.rows:
        table.add_row(
            str(row["chunk"]),
            f"{row['holders']:.1f}",
            f"{row['transfers']:.1f}",
            f"{-100 * row['reduction']:+.1f}%",
        )
    table_console().print(table)
    if json_path:
        write_output(json_path, json.dumps(result.to_json(), indent=2) + "\n")


@bench.command("steps")
@split_options()
@MODEL
@click.option("--steps", default=4096, show_default=True, type=int, help="Steps of every loop.")
@click.option(
    "--check-every",
    default=512,
    show_default=True,
    type=int,
    help="Steps between two weight checks against the reference loop.",
)
@LR
@click.option(
    "--compile",
    "compile_mode",
    type=click.Choice(COMPILE_MODES),
    default="on",
    show_default=True,
    help="The engine's --compile (auto stays eager: the bench is shorter than its threshold).",
)
@seeds_option("0", "Independent engine runs at once, one per seed; the first is checked")
@click.option(
    "--workers", default=1, show_default=True, type=int, help="Single-thread worker processes."
)
@click.option(
    "--device",
    type=click.Choice(DEVICES),
    default=TRAIN_DEFAULTS["device"],
    show_default=True,
)
@click.option(
    "--vectorize",
    type=int,
    default=None,
    help="Also step this many runs together, their weights stacked under one "
    "vmapped step, timed in turn with one run's compiled step and checked like it.",
)
@JSON_OUTPUT
def steps(
    dataset,
    data_dir,
    spec,
    clients,
    model_name,
    steps,
    check_every,
    lr,
    compile_mode,
    seeds,
    workers,
    device,
    vectorize,
    json_path,
) -> None:
    """Single-sample steps/s of the engine against plain eager PyTorch loops, checked to
    make the same updates; with --seeds/--workers, model-steps/s of many runs at once; with
    --vectorize K, model-steps/s of K runs stepped together."""
    result = bench_steps(
        dataset,
        data_dir=data_dir,
        spec=spec,
        clients=clients,
        model_name=model_name,
        steps=steps,
        check_every=check_every,
        lr=lr,
        compile_mode=compile_mode,
        seeds=seeds,
        workers=workers,
        device=device,
        vectorize=vectorize,
    )
    figures = result.to_json()
    reference, tuned, engine_loop = result.loops
    table = Table(
        title=f"single-sample steps/s · {dataset} · {result.model_name} · lr {result.lr:g} · "
        f"{result.device} · {steps} steps"
    )
    for column in ("loop", "settings", "steps/s", "vs default", "max |Δw|", "Δw / moved"):
        table.add_column(column, justify="left" if column in ("loop", "settings") else "right")
    for loop in result.loops:
        compared = loop is not reference
        table.add_row(
            loop.name,
            f"{loop.settings.threads} thr., oneDNN {'on' if loop.settings.mkldnn else 'off'}",
            f"{loop.steps_per_s(steps):,.0f}",
            f"{loop.steps_per_s(steps) / reference.steps_per_s(steps):.2f}×",
            f"{loop.max_difference:.1e}" if compared else "reference",
            f"{loop.worst_share:.1e}" if compared else "",
        )
    console = table_console()
    console.print(table)
    console.print(f"weights compared with the reference loop's every {check_every} steps")
    for loop in (tuned, engine_loop):
        if loop.rechecked:
            console.print(
                f"{loop.name}: {loop.rechecked} segment(s) agreed only when re-checked in "
                f"pieces of down to {Stratify.steps_per_call} steps (rounding flipped a "
                "near-tie somewhere in the segment; see docs/architecture.md, Performance)"
            )
    compile_seconds = result.compile_seconds
    console.print(
        f"weights {'match' if result.weights_match else 'DO NOT MATCH'} (tolerance: "
        f"{MATCH_TOLERANCE:g} of the reference's movement per check); ratio "
        f"{figures['ratio']:.2f}×, tuned_ratio {figures['tuned_ratio']:.2f}×"
        + (f"; compile {compile_seconds:.1f} s (not in steps/s)" if compile_seconds else "")
    )
    if result.parallel is not None:
        console.print(
            f"{len(seeds)} seed(s) on {result.workers} single-thread worker(s): "
            f"{figures['model_steps_per_s']:,.0f} model-steps/s = "
            f"{figures['model_steps_per_s'] / figures['engine_steps_per_s']:.2f}× one run "
            f"(timed from when every worker was ready; start-up incl. data and compile "
            f"{result.parallel['slowest_start_seconds']:.1f} s)"
        )
    vectorised = result.vectorised
    if vectorised is not None:
        kind = "compiled" if compile_mode != "off" else "eager"
        console.print(
            f"{vectorize} runs stepped together (one vmapped {kind} step): "
            f"{vectorised['model_steps_per_s']:,.0f} model-steps/s = "
            f"{vectorised['ratio']:.2f}× one run's {kind} step "
            f"({vectorised['single_steps_per_s']:,.0f} steps/s, timed in turn with it)"
            + (
                f"; compile {vectorised['compile_seconds']:.1f} s (not in model-steps/s)"
                if vectorised["compile_seconds"]
                else ""
            )
        )
        console.print(
            f"lanes {'/'.join(map(str, vectorised['checked_lanes']))} checked in float64 against "
            f"the eager loop in float64: max |Δw| {vectorised['max_difference']:.1e}, "
            f"{vectorised['worst_share']:.1e} of the movement (tolerance "
            f"{LANE_CHECK_TOLERANCE:g}; {vectorised['check_seconds']:.1f} s); lane 0 in float32: "
            f"{vectorised['float32_share']:.1e} of the float32 reference's movement (not judged: "
            "rounding flips near-ties, see docs/architecture.md, Performance)"
        )
    if json_path:
        write_output(json_path, json.dumps(figures, indent=2) + "\n")
    result.check()


@bench.command("plan")
@click.option("--dataset", default="mnist-10k", show_default=True)
@DATA_DIR
@DATASET_OPTION
@click.option("--partitions", default="dirichlet:0.5,classes:2", show_default=True)
@click.option("--clients", "clients_text", default="10,100,1000,10000", show_default=True)
@click.option(
    "--min-size",
    type=int,
    default=None,
    help="Dirichlet splits: smallest client size [default: min(10, N/2n), NIID-Bench's].",
)
@click.option(
    "--chunk", default=option_default(StratifyOptions, "chunk"), show_default=True, type=int
)
@click.option(
    "--selection",
    type=click.Choice(SELECTIONS),
    default=option_default(StratifyOptions, "selection"),
    show_default=True,
)
@click.option(
    "--train/--no-train",
    default=True,
    show_default=True,
    help="Also train the epoch, to give planning's share of its wall time.",
)
@JSON_OUTPUT
def plan(
    dataset,
    data_dir,
    dataset_options,
    partitions,
    clients_text,
    min_size,
    chunk,
    selection,
    train,
    json_path,
) -> None:
    """Planning cost per epoch against the number of clients, with peak memory."""
    client_counts = parse_int_list(clients_text, "--clients")
    specs = [spec.strip() for spec in partitions.split(",") if spec.strip()]
    with Console().status("planning") as status:
        result = bench_plan(
            dataset,
            specs,
            client_counts,
            data_dir=data_dir,
            dataset_options=parse_options(dataset_options),
            min_size=min_size,
            chunk=chunk,
            selection=selection,
            train=train,
            on_cell=lambda spec, clients: status.update(f"{spec}, {clients} clients"),
        )
    table = Table(title=f"planning one epoch · {dataset} · chunk {chunk} · {selection} selection")
    columns = ["partition", "clients", "pairs", "set-up ms", "plan ms", "µs/entry", "epoch s"]
    columns += ["share", "RSS planned MB", "peak RSS MB"]
    for column in columns:
        table.add_column(column, justify="left" if column == "partition" else "right")
    for row in result.rows:
        if "error" in row:
            message = row["error"] if len(row["error"]) < 60 else row["error"][:57] + "..."
            table.add_row(row["partition"], f"{row['clients']:,}", f"[red]{message}[/red]")
            continue
        table.add_row(
            row["partition"],
            f"{row['clients']:,}",
            f"{row['pairs']:,}",
            f"{row['setup_ms']:,.0f}",
            f"{row['plan_ms']:,.0f}",
            f"{1000 * row['plan_ms'] / max(row['entries'], 1):.1f}",
            f"{row['epoch_s']:.1f}" if "epoch_s" in row else "–",
            f"{100 * row['share']:.1f}%" if "share" in row else "–",
            f"{row['plan_rss_mb']:,.0f}",
            f"{row['peak_rss_mb']:,.0f}",
        )
    console = table_console()
    console.print(table)
    measured = result.measured
    if measured:
        console.print(
            f"{measured[0]['samples']:,} training samples; pairs: (client, label) pairs holding "
            "samples; set-up: registry (plain) + strategy set-up, once per run; plan: SLS + "
            "pools + selection, once per epoch; share = (set-up + plan) / the trained epoch's "
            "wall time; RSS planned: peak resident memory once the epoch is planned, before "
            f"training; {min(row['data_rss_mb'] for row in measured):,.0f} MB resident once "
            "the data is loaded, before any client exists."
        )
    if json_path:
        write_output(json_path, json.dumps(result.to_json(), indent=2) + "\n")


@bench.command("batch")
@split_options()
@MODEL
@click.option(
    "--norm",
    type=Choice(tuple(NORMS)),
    default=None,
    help="[default: the model's own, see train --help]",
)
@click.option(
    "--batch-labels",
    default=option_default(StratifyOptions, "batch_labels"),
    show_default=True,
    type=int,
)
@click.option(
    "--batch-path",
    type=click.Choice(BATCH_PATHS),
    default=option_default(StratifyOptions, "batch_path"),
    show_default=True,
)
@LR
@click.option(
    "--repeat",
    default=3,
    show_default=True,
    type=int,
    help="Timed passes of each loop (timing repetitions); medians.",
)
@THREADS
@JSON_OUTPUT
def batch(
    dataset,
    data_dir,
    spec,
    clients,
    model_name,
    norm,
    batch_labels,
    batch_path,
    lr,
    repeat,
    threads,
    json_path,
) -> None:
    """Batch mode's overhead: one epoch of global batches against a plain centralised loop
    over the same batches, from the same weights (checked to end alike)."""
    set_threads(threads)
    result = bench_batch(
        dataset,
        data_dir=data_dir,
        spec=spec,
        clients=clients,
        model_name=model_name,
        norm=norm,
        batch_labels=batch_labels,
        batch_path=batch_path,
        lr=lr,
        repeat=repeat,
    )
    figures = result.to_json()
    table = Table(
        title=f"batch mode · {dataset} · {result.model_name} · B = {batch_labels} · "
        f"{batch_path} path · lr {result.lr:g} · {figures['batches']} global batches · "
        f"median of {repeat}"
    )
    for column in ("loop", "seconds / epoch", "samples/s", "vs plain"):
        table.add_column(column, justify="left" if column == "loop" else "right")
    rows = [
        ("plain centralised loop, same batches", figures["plain_s"]),
        ("Stratify batch mode (execution)", figures["engine_s"]),
        ("Stratify batch mode + planning", figures["engine_s"] + figures["plan_s"]),
    ]
    for name, seconds in rows:
        table.add_row(
            name,
            f"{seconds:.3f}",
            f"{figures['samples'] / seconds:,.0f}",
            f"{seconds / figures['plain_s']:.3f}×",
        )
    console = table_console()
    console.print(table)
    console.print(
        f"weights {'match' if result.weights_match else 'DO NOT MATCH'}: max |Δw| "
        f"{figures['max_difference']:.1e}, {figures['difference_share']:.1e} of the movement "
        f"(max |w_end - w_start| {figures['moved']:.1e}); the first pass of each was a warm-up"
    )
    if json_path:
        write_output(json_path, json.dumps(figures, indent=2) + "\n")
    result.check()


@bench.command("rounds")
@split_options()
@click.option(
    "--methods",
    "--algorithms",
    "methods",
    default="fedavg,fedprox",
    show_default=True,
    metavar="LIST",
    help="Comma-separated methods, timed in turn (--algorithms is an alias).",
)
@click.option("--rounds", default=3, show_default=True, type=int)
@click.option(
    "--local-epochs", type=int, default=None, help="[default: each method's own, batch mode]"
)
@THREADS
@JSON_OUTPUT
def rounds(
    dataset, data_dir, spec, clients, methods, rounds, local_epochs, threads, json_path
) -> None:
    """Seconds per round of averaging methods in batch mode, the methods taking turns."""
    set_threads(threads)
    names = [name.strip() for name in methods.split(",") if name.strip()]
    result = bench_rounds(
        dataset,
        names,
        data_dir=data_dir,
        spec=spec,
        clients=clients,
        rounds=rounds,
        local_epochs=local_epochs,
    )
    first = result.methods[0].round_s
    table = Table(
        title=f"seconds per round · {dataset} · {spec} · {clients} clients · batch mode · "
        f"median of rounds 2-{rounds + 1}"
    )
    for column in ("method", "local epochs", "s / round", f"vs {names[0]}", "rounds (s)"):
        table.add_column(column, justify="left" if column == "method" else "right")
    for entry in result.methods:
        table.add_row(
            entry.method,
            str(entry.local_epochs),
            f"{entry.round_s:.2f}",
            f"{entry.round_s / first:.2f}×",
            ", ".join(f"{value:.2f}" for value in entry.rounds_s),
        )
    table_console().print(table)
    if json_path:
        write_output(json_path, json.dumps(result.to_json(), indent=2) + "\n")


bench.add_command(local)
bench.add_command(privacy)
bench.add_command(privacy_utility)
bench.add_command(stream)
