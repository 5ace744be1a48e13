"""`stratify bench`: benchmarks that print figures: engine steps/s (checked), planning cost per
clients, batch-mode overhead, seconds per round, chunk-size transfers."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from typing import Any

import click
import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from stratify.backend import DEVICES, resolve_device
from stratify.cli.bench_local import local
from stratify.cli.bench_plan import PlanCell, run_cell
from stratify.cli.bench_steps import (
    LANE_CHECK_TOLERANCE,
    MATCH_TOLERANCE,
    BackendSettings,
    BenchmarkError,
    WorkerJob,
    bench_engine,
    bench_samples,
    checked_comparison,
    parallel_seeds,
    vectorised_comparison,
)
from stratify.cli.bench_stream import stream
from stratify.cli.bench_training import (
    batch_engine,
    compare_batch_mode,
    round_engine,
    time_rounds,
)
from stratify.cli.common import (
    DATA_DIR,
    DATASET_OPTION,
    JSON_OUTPUT,
    Choice,
    checked,
    parse_options,
    write_output,
)
from stratify.compiled import COMPILE_MODES
from stratify.config import TrainConfig
from stratify.data.datasets import Dataset, load_dataset
from stratify.data.partition import parse_partition_spec
from stratify.engine import Engine
from stratify.errors import ConfigError
from stratify.experiment import build_experiment
from stratify.nn.models import MODELS, NORMS, check_model_norm, default_model
from stratify.options import option_default
from stratify.selection import HOPS, SELECTIONS
from stratify.stratify import (
    BATCH_PATHS,
    SINGLE_SAMPLE_BYTES_PER_STEP,
    Stratify,
    StratifyOptions,
)
from stratify.validation import (
    check_fits_in_memory,
    check_positive,
    check_positive_int,
    check_repeats,
)

#: bytes ``bench steps`` holds per step at least: the step list as int64 (8 B) and as a
#: Python list of ints (8 B pointer + 28 B int), and the loss the engine keeps per step
STEPS_BYTES_PER_STEP = 8 + 36 + SINGLE_SAMPLE_BYTES_PER_STEP

#: bytes a benchmark worker process holds at least: Python with torch imported (measured
#: about 650 MB resident, of which this much is its own)
WORKER_BYTES = 100 * 2**20

#: ``--json``: checked before any work, written atomically after it

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


def set_threads(threads: int | None) -> None:
    if threads is not None:
        torch.set_num_threads(check_positive_int(threads, "--threads"))


def wide_console() -> Console:
    """A console for the benchmark tables: 120 columns where the output is not a terminal."""
    console = Console()
    return console if console.is_terminal else Console(width=120)


def parse_int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise ConfigError(f"{flag} takes positive integers, got {text!r}")
    return values


def build_engine(
    dataset: Dataset,
    clients: int,
    spec: str,
    seed: int,
    chunk: int,
    model_name: str,
    selection: str = "uniform",
) -> Engine:
    """A single-sample Stratify engine on ``dataset`` (plain registry: no CKKS set-up cost)."""
    config = TrainConfig(
        dataset=dataset.name,
        partition=spec,
        clients=clients,
        model=model_name,
        seed=seed,
        secure=False,
        options={"chunk": chunk, "selection": selection},
    )
    return build_experiment(config, dataset=dataset).engine


@click.group("bench")
def bench() -> None:
    """Benchmarks that print figures: engine steps/s and chunk-size transfers."""


@bench.command("transfers")
@split_options(dataset="mnist-10k")
@click.option("--chunks", default="1,5,50,150", show_default=True)
@click.option(
    "--seeds",
    default=5,
    show_default=True,
    type=int,
    callback=checked(check_repeats),
    help="Epochs (schedules) averaged.",
)
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
    data = load_dataset(dataset, data_dir=data_dir, device="cpu")
    results: list[dict[str, Any]] = []
    for chunk in chunk_sizes:
        arrivals, counts = [], []
        # planning only: the cheapest model, never trained
        engine = build_engine(data, clients, spec, 0, chunk, "mlp", selection)
        stratify = engine.strategy
        assert isinstance(stratify, Stratify)
        for seed in range(seeds):
            plan = stratify.plan_epoch(engine.context, np.random.default_rng([seed, 1]))
            arrivals.append(plan.holders)
            counts.append(plan.model_transfers(hops))
        results.append(
            {
                "chunk": chunk,
                "holders": float(np.mean(arrivals)),
                "transfers": float(np.mean(counts)),
                "runs": counts,
            }
        )
    baseline = results[0]["transfers"]
    table = Table(
        title=f"transfers per epoch · {dataset} · {spec} · {clients} clients · {selection} "
        f"selection · hops via {hops} · mean of {seeds}"
    )
    for column in ("CS", "arrivals", "transfers", f"vs CS={chunk_sizes[0]}"):
        table.add_column(column, justify="right")
    for row in results:
        row["reduction"] = 1.0 - row["transfers"] / baseline
        table.add_row(
            str(row["chunk"]),
            f"{row['holders']:.1f}",
            f"{row['transfers']:.1f}",
            f"{-100 * row['reduction']:+.1f}%",
        )
    Console().print(table)
    if json_path:
        write_output(json_path, json.dumps(results, indent=2) + "\n")


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
@click.option(
    "--seeds", default=1, show_default=True, type=int, help="Independent engine runs at once."
)
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
    help="Also step this many runs (seeds) together, their weights stacked under one "
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
    for value, flag in ((steps, "--steps"), (check_every, "--check-every"), (seeds, "--seeds")):
        check_positive_int(value, flag)
    check_repeats(seeds, "--seeds")
    check_positive_int(workers, "--workers")
    if vectorize is not None:
        check_positive_int(vectorize, "--vectorize")
    check_fits_in_memory(steps * STEPS_BYTES_PER_STEP, f"--steps {steps:,}", "time fewer steps")
    check_model_norm(model_name, None, "single-sample")  # before the data is loaded
    processes = min(workers, seeds) if seeds > 1 or workers > 1 else 0
    check_fits_in_memory(
        processes * WORKER_BYTES,
        f"--workers {workers:,} with --seeds {seeds:,} ({processes:,} worker processes, "
        "each holding torch)",
        "use fewer workers",
    )
    default = BackendSettings.current()  # torch's own, before the engine changes them
    device = resolve_device(device)
    data = load_dataset(dataset, data_dir=data_dir, device=device)
    engine = bench_engine(
        data,
        spec=spec,
        clients=clients,
        model_name=model_name,
        seed=0,
        lr=lr,
        compile_mode=compile_mode,
    )
    lr = engine.base_lr  # the library's when --lr is not given
    model_name = model_name or default_model(data.input_shape)
    samples = bench_samples(engine, steps)
    loops, compile_seconds, weights_match = checked_comparison(
        engine, samples, check_every=check_every, lr=lr, default=default
    )
    reference, tuned, engine_loop = loops
    result: dict[str, Any] = {
        "eager_steps_per_s": reference.steps_per_s(steps),
        "tuned_eager_steps_per_s": tuned.steps_per_s(steps),
        "engine_steps_per_s": engine_loop.steps_per_s(steps),
    }
    result["ratio"] = result["engine_steps_per_s"] / result["eager_steps_per_s"]
    result["tuned_ratio"] = result["engine_steps_per_s"] / result["tuned_eager_steps_per_s"]
    parallel = None
    if seeds > 1 or workers > 1:
        job = WorkerJob(
            dataset=dataset,
            data_dir=data_dir,
            spec=spec,
            clients=clients,
            model_name=model_name,
            lr=lr,
            compile_mode=compile_mode,
            steps=steps,
            seeds=tuple(range(seeds)),
        )
        parallel = parallel_seeds(job, workers)
        result["model_steps_per_s"] = parallel["model_steps_per_s"]
    else:
        result["model_steps_per_s"] = result["engine_steps_per_s"]
    result.update(seeds=seeds, workers=min(workers, seeds), weights_match=weights_match)
    result["compile_seconds"] = compile_seconds
    vectorised = None
    if vectorize is not None:
        engines = [engine] + [
            bench_engine(
                data,
                spec=spec,
                clients=clients,
                model_name=model_name,
                seed=seed,
                lr=lr,
                compile_mode=compile_mode,
            )
            for seed in range(1, vectorize)
        ]
        vectorised = vectorised_comparison(
            engines,
            [samples] + [bench_samples(other, steps) for other in engines[1:]],
            check_every=check_every,
            lr=lr,
            compile=compile_mode != "off",
            default=default,
        )
        result["vectorized_lanes"] = vectorize
        result["vectorized_model_steps_per_s"] = vectorised["model_steps_per_s"]
        result["vectorized_single_steps_per_s"] = vectorised["single_steps_per_s"]
        result["vectorized_ratio"] = vectorised["ratio"]
        result["vectorized_compile_seconds"] = vectorised["compile_seconds"]
        result["vectorized_float64_share"] = vectorised["worst_share"]
        result["vectorized_float32_share"] = vectorised["float32_share"]
        result["weights_match"] = weights_match = weights_match and vectorised["weights_match"]

    table = Table(
        title=f"single-sample steps/s · {dataset} · {model_name} · lr {lr:g} · {device} · "
        f"{steps} steps"
    )
    for column in ("loop", "settings", "steps/s", "vs default", "max |Δw|", "Δw / moved"):
        table.add_column(column, justify="left" if column in ("loop", "settings") else "right")
    for loop in loops:
        checked = loop is not reference
        table.add_row(
            loop.name,
            f"{loop.settings.threads} thr., oneDNN {'on' if loop.settings.mkldnn else 'off'}",
            f"{loop.steps_per_s(steps):,.0f}",
            f"{loop.steps_per_s(steps) / reference.steps_per_s(steps):.2f}×",
            f"{loop.max_difference:.1e}" if checked else "reference",
            f"{loop.worst_share:.1e}" if checked else "",
        )
    console = wide_console()
    console.print(table)
    console.print(f"weights compared with the reference loop's every {check_every} steps")
    for loop in (tuned, engine_loop):
        if loop.rechecked:
            console.print(
                f"{loop.name}: {loop.rechecked} segment(s) agreed only when re-checked in "
                f"pieces of down to {Stratify.steps_per_call} steps (rounding flipped a "
                "near-tie somewhere in the segment; see docs/architecture.md, Performance)"
            )
    verdict = "match" if weights_match else "DO NOT MATCH"
    console.print(
        f"weights {verdict} (tolerance: {MATCH_TOLERANCE:g} of the reference's movement "
        f"per check); ratio {result['ratio']:.2f}×, tuned_ratio {result['tuned_ratio']:.2f}×"
        + (f"; compile {compile_seconds:.1f} s (not in steps/s)" if compile_seconds else "")
    )
    if parallel is not None:
        console.print(
            f"{seeds} seed(s) on {result['workers']} single-thread worker(s): "
            f"{result['model_steps_per_s']:,.0f} model-steps/s = "
            f"{result['model_steps_per_s'] / result['engine_steps_per_s']:.2f}× one run "
            f"(timed from when every worker was ready; start-up incl. data and compile "
            f"{parallel['slowest_start_seconds']:.1f} s)"
        )
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
        write_output(json_path, json.dumps(result, indent=2) + "\n")
    if vectorised is not None and not vectorised["weights_match"]:
        raise BenchmarkError(
            "the vectorised lanes, run in float64, ended a segment "
            f"{vectorised['worst_share']:.1e} of the movement away from the eager loop in "
            f"float64 (tolerance {LANE_CHECK_TOLERANCE:g}): they did not make the same updates"
        )
    if not weights_match:
        worst = max(tuned.worst_share, engine_loop.worst_share)
        raise BenchmarkError(
            "the engine and the eager loops ended a segment with different weights "
            f"(worst {worst:.1e} of the movement, "
            f"tolerance {MATCH_TOLERANCE:g}): they did not make the same updates"
        )


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
    for spec in specs:
        parse_partition_spec(spec)
    check_positive_int(chunk, "--chunk")
    if min_size is not None:
        check_positive_int(min_size, "--min-size")
    loader_options: dict[str, Any] = parse_options(dataset_options)
    load_dataset(dataset, data_dir=data_dir, device="cpu", seed=0, **loader_options)  # fail early
    options = tuple(sorted(loader_options.items()))
    rows = []
    with Console().status("planning") as status:
        for spec in specs:
            for clients in client_counts:
                status.update(f"{spec}, {clients} clients")
                cell = PlanCell(
                    dataset, data_dir, options, spec, clients, min_size, chunk, selection, train
                )
                rows.append(run_cell(cell))
    table = Table(title=f"planning one epoch · {dataset} · chunk {chunk} · {selection} selection")
    columns = ["partition", "clients", "pairs", "set-up ms", "plan ms", "µs/entry", "epoch s"]
    columns += ["share", "RSS planned MB", "peak RSS MB"]
    for column in columns:
        table.add_column(column, justify="left" if column == "partition" else "right")
    for row in rows:
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
    console = wide_console()
    console.print(table)
    measured = [row for row in rows if "error" not in row]
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
        write_output(json_path, json.dumps(rows, indent=2) + "\n")


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
@click.option("--repeat", default=3, show_default=True, type=int, help="Runs of each; medians.")
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
    check_repeats(repeat, "--repeat")
    check_model_norm(model_name, norm, "batch")  # before the data is loaded
    set_threads(threads)
    data = load_dataset(dataset, data_dir=data_dir, device="cpu")
    engine = batch_engine(
        data,
        spec=spec,
        clients=clients,
        model_name=model_name,
        norm=norm,
        batch_labels=batch_labels,
        batch_path=batch_path,
        lr=lr,
    )
    lr = engine.base_lr  # the library's when --lr is not given
    model_name = model_name or default_model(data.input_shape)
    result = compare_batch_mode(engine, repeat, lr)
    result["lr"] = lr
    result["overhead"] = result["engine_s"] / result["plain_s"] - 1
    result["overhead_with_planning"] = (result["engine_s"] + result["plan_s"]) / result[
        "plain_s"
    ] - 1
    result["weights_match"] = result["difference_share"] <= MATCH_TOLERANCE
    table = Table(
        title=f"batch mode · {dataset} · {model_name} · B = {batch_labels} · {batch_path} path · "
        f"lr {lr:g} · {result['batches']} global batches · median of {repeat}"
    )
    for column in ("loop", "seconds / epoch", "samples/s", "vs plain"):
        table.add_column(column, justify="left" if column == "loop" else "right")
    rows = [
        ("plain centralised loop, same batches", result["plain_s"]),
        ("Stratify batch mode (execution)", result["engine_s"]),
        ("Stratify batch mode + planning", result["engine_s"] + result["plan_s"]),
    ]
    for name, seconds in rows:
        table.add_row(
            name,
            f"{seconds:.3f}",
            f"{result['samples'] / seconds:,.0f}",
            f"{seconds / result['plain_s']:.3f}×",
        )
    console = wide_console()
    console.print(table)
    console.print(
        f"weights {'match' if result['weights_match'] else 'DO NOT MATCH'}: max |Δw| "
        f"{result['max_difference']:.1e}, {result['difference_share']:.1e} of the movement "
        f"(max |w_end - w_start| {result['moved']:.1e}); the first pass of each was a warm-up"
    )
    if json_path:
        write_output(json_path, json.dumps(result, indent=2) + "\n")
    if not result["weights_match"]:
        raise BenchmarkError(
            "batch mode and the plain loop ended with different weights "
            f"({result['difference_share']:.1e} of the movement): they did not make the same "
            "updates"
        )


@bench.command("rounds")
@split_options()
@click.option("--algorithms", default="fedavg,fedprox", show_default=True)
@click.option("--rounds", default=3, show_default=True, type=int)
@click.option(
    "--local-epochs", type=int, default=None, help="[default: each method's own, batch mode]"
)
@THREADS
@JSON_OUTPUT
def rounds(
    dataset, data_dir, spec, clients, algorithms, rounds, local_epochs, threads, json_path
) -> None:
    """Seconds per round of averaging methods in batch mode, the methods taking turns."""
    check_repeats(rounds, "--rounds")
    set_threads(threads)
    names = [name.strip() for name in algorithms.split(",") if name.strip()]
    options = {} if local_epochs is None else {"local_epochs": local_epochs}
    data = load_dataset(dataset, data_dir=data_dir, device="cpu")
    engines = {
        name: round_engine(data, name, spec=spec, clients=clients, options=options)
        for name in names
    }
    seconds = time_rounds(engines, rounds)
    first = statistics.median(seconds[names[0]])
    results = []
    table = Table(
        title=f"seconds per round · {dataset} · {spec} · {clients} clients · batch mode · "
        f"median of rounds 2-{rounds + 1}"
    )
    for column in ("method", "local epochs", "s / round", f"vs {names[0]}", "rounds (s)"):
        table.add_column(column, justify="left" if column == "method" else "right")
    for name in names:
        median = statistics.median(seconds[name])
        epochs = engines[name].strategy.options.to_dict().get("local_epochs")
        results.append(
            {
                "algorithm": name,
                "local_epochs": epochs,
                "round_s": median,
                "rounds_s": seconds[name],
            }
        )
        table.add_row(
            name,
            str(epochs),
            f"{median:.2f}",
            f"{median / first:.2f}×",
            ", ".join(f"{value:.2f}" for value in seconds[name]),
        )
    wide_console().print(table)
    if json_path:
        write_output(json_path, json.dumps(results, indent=2) + "\n")


bench.add_command(local)
bench.add_command(stream)
