"""`stratify bench`: engine throughput and chunk-size transfer counts, printed as figures."""

from __future__ import annotations

import json
from typing import Any

import click
import numpy as np
from rich.console import Console
from rich.table import Table

from stratify.backend import resolve_device
from stratify.cli.bench_steps import (
    MATCH_TOLERANCE,
    BackendSettings,
    BenchmarkError,
    WorkerJob,
    bench_router,
    bench_samples,
    checked_comparison,
    parallel_seeds,
)
from stratify.cli.common import DATA_DIR
from stratify.compiled import COMPILE_MODES
from stratify.config import TrainConfig
from stratify.data.datasets import Dataset, load_dataset
from stratify.errors import ConfigError
from stratify.experiment import build_experiment
from stratify.router import Router
from stratify.strategy import Stratify
from stratify.validation import check_positive, check_positive_int


def parse_int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise ConfigError(f"{flag} takes positive integers, got {text!r}")
    return values


def build_router(
    dataset: Dataset, clients: int, spec: str, seed: int, chunk: int, model_name: str, lr: float
) -> Router:
    """A single-sample Stratify router on ``dataset`` (plain registry: no CKKS set-up cost)."""
    config = TrainConfig(
        dataset=dataset.name,
        partition=spec,
        clients=clients,
        model=model_name,
        lr=lr,
        seed=seed,
        secure=False,
        options={"chunk": chunk},
    )
    return build_experiment(config, dataset=dataset).router


@click.group("bench")
def bench() -> None:
    """Benchmarks that print figures: engine steps/s and chunk-size transfers."""


@bench.command("transfers")
@click.option("--dataset", default="mnist-10k", show_default=True)
@DATA_DIR
@click.option("--partition", "spec", default="dirichlet:0.5", show_default=True)
@click.option("--clients", default=10, show_default=True, type=int)
@click.option("--chunks", default="1,5,50,150", show_default=True)
@click.option(
    "--seeds", default=5, show_default=True, type=int, help="Epochs (schedules) averaged."
)
@click.option("--json", "json_path", type=click.Path(dir_okay=False))
def transfers(dataset, data_dir, spec, clients, chunks, seeds, json_path) -> None:
    """Model transfers per epoch for chunk sizes CS (planning only, no training)."""
    chunk_sizes = parse_int_list(chunks, "--chunks")
    data = load_dataset(dataset, data_dir=data_dir, device="cpu")
    results: list[dict[str, Any]] = []
    for chunk in chunk_sizes:
        counts = []
        router = build_router(data, clients, spec, 0, chunk, "mlp", 0.01)
        stratify = router.strategy
        assert isinstance(stratify, Stratify)
        for seed in range(seeds):
            plan = stratify.plan_epoch(router.context, np.random.default_rng([seed, 1]))
            counts.append(plan.transfers)
        results.append({"chunk": chunk, "transfers": float(np.mean(counts)), "runs": counts})
    baseline = results[0]["transfers"]
    table = Table(
        title=f"transfers per epoch · {dataset} · {spec} · {clients} clients · mean of {seeds}"
    )
    for column in ("CS", "transfers", f"vs CS={chunk_sizes[0]}"):
        table.add_column(column, justify="right")
    for row in results:
        row["reduction"] = 1.0 - row["transfers"] / baseline
        table.add_row(
            str(row["chunk"]), f"{row['transfers']:.1f}", f"{-100 * row['reduction']:+.1f}%"
        )
    Console().print(table)
    if json_path:
        with open(json_path, "w") as handle:
            json.dump(results, handle, indent=2)


@bench.command("steps")
@click.option("--dataset", default="digits", show_default=True)
@DATA_DIR
@click.option("--partition", "spec", default="dirichlet:0.5", show_default=True)
@click.option("--clients", default=10, show_default=True, type=int)
@click.option("--model", "model_name", default="cnn", show_default=True)
@click.option("--steps", default=4096, show_default=True, type=int, help="Steps of every loop.")
@click.option(
    "--check-every",
    default=512,
    show_default=True,
    type=int,
    help="Steps between two weight checks against the reference loop.",
)
@click.option("--lr", default=0.01, show_default=True, type=float)
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
    "--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True
)
@click.option("--json", "json_path", type=click.Path(dir_okay=False))
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
    json_path,
) -> None:
    """Single-sample steps/s of the engine against plain eager PyTorch loops, checked to
    make the same updates; with --seeds/--workers, model-steps/s of many runs at once."""
    for value, flag in ((steps, "--steps"), (check_every, "--check-every"), (seeds, "--seeds")):
        check_positive_int(value, flag)
    check_positive_int(workers, "--workers")
    check_positive(lr, "--lr")
    default = BackendSettings.current()  # torch's own, before the router changes them
    device = resolve_device(device)
    data = load_dataset(dataset, data_dir=data_dir, device=device)
    router = bench_router(
        data,
        spec=spec,
        clients=clients,
        model_name=model_name,
        seed=0,
        lr=lr,
        compile_mode=compile_mode,
    )
    samples = bench_samples(router, steps)
    loops, compile_seconds = checked_comparison(
        router, samples, check_every=check_every, lr=lr, default=default
    )
    reference, tuned, engine = loops
    weights_match = all(loop.worst_share <= MATCH_TOLERANCE for loop in (tuned, engine))
    result: dict[str, Any] = {
        "eager_steps_per_s": reference.steps_per_s(steps),
        "tuned_eager_steps_per_s": tuned.steps_per_s(steps),
        "engine_steps_per_s": engine.steps_per_s(steps),
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

    table = Table(
        title=f"single-sample steps/s · {dataset} · {model_name} · {device} · {steps} steps"
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
    console = Console()
    console.print(table)
    console.print(f"weights compared with the reference loop's every {check_every} steps")
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
    if json_path:
        with open(json_path, "w") as handle:
            json.dump(result, handle, indent=2)
    if not weights_match:
        raise BenchmarkError(
            "the engine and the eager loops ended a segment with different weights "
            f"(worst {max(tuned.worst_share, engine.worst_share):.1e} of the movement, "
            f"tolerance {MATCH_TOLERANCE:g}): they did not make the same updates"
        )
