"""What planning an epoch costs as the number of clients grows (:func:`bench_plan`,
``stratify bench plan``).

Each cell (partition × clients) runs in a fresh spawned process, so its peak resident
memory is its own: load the data, split it, register the labels and set up the strategy
(once per run), plan one epoch (SLS, pools, selection: once per epoch) and train that epoch,
whose wall time the planning is compared with.
"""

from __future__ import annotations

import multiprocessing
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stratify.config import TrainConfig
from stratify.data.datasets import load_dataset
from stratify.data.partition import parse_partition_spec, partition
from stratify.errors import ConfigError, StratifyError
from stratify.experiment import build_experiment
from stratify.federation import Federation
from stratify.stratify import Stratify
from stratify.validation import check_positive_int

#: seconds one cell may take (a Dirichlet split that cannot meet its minimum size retries
#: up to 1,000 times before it gives up)
CELL_TIMEOUT = 3600


@dataclass(frozen=True)
class PlanCell:
    """One cell of the table, in plain values (spawn pickles it)."""

    dataset: str
    data_dir: str | None
    dataset_options: tuple[tuple[str, str], ...]
    spec: str
    clients: int
    min_size: int | None
    chunk: int
    selection: str
    train: bool


def resident_mb() -> float:
    """Peak resident memory of this process so far, in MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_cell(cell: PlanCell) -> dict[str, Any]:
    """Split, set up, plan and (optionally) train one epoch; times and memory of each."""
    row: dict[str, Any] = {"partition": cell.spec, "clients": cell.clients}
    data = load_dataset(
        cell.dataset, data_dir=cell.data_dir, device="cpu", seed=0, **dict(cell.dataset_options)
    )
    row["samples"] = len(data.train_labels)
    row["data_rss_mb"] = resident_mb()
    start = time.perf_counter()
    indices = partition(data.train_labels, cell.clients, cell.spec, seed=0, min_size=cell.min_size)
    federation = Federation(indices, data.train_labels)
    row["partition_s"] = time.perf_counter() - start
    config = TrainConfig(
        dataset=cell.dataset,
        partition=cell.spec,
        clients=cell.clients,
        secure=False,
        seed=0,
        options={"chunk": cell.chunk, "selection": cell.selection},
    )
    # one-off costs that are not planning: torch's lazy imports on the first model and
    # optimizer, paid here on a one-client federation
    build_experiment(config, dataset=data, federation=Federation([indices[0]], data.train_labels))
    start = time.perf_counter()
    engine = build_experiment(config, dataset=data, federation=federation).engine
    row["setup_ms"] = 1000 * (time.perf_counter() - start)
    strategy = engine.strategy
    assert isinstance(strategy, Stratify)
    start = time.perf_counter()
    plan = strategy.plan_epoch(engine.context, engine.epoch_rng(1))
    row["plan_ms"] = 1000 * (time.perf_counter() - start)
    row["entries"] = len(plan.samples) + plan.skipped
    row["pairs"] = int((federation.placeholder_counts(engine.placeholders) > 0).sum())
    row["transfers"] = plan.model_transfers()
    row["plan_rss_mb"] = resident_mb()
    if cell.train:
        start = time.perf_counter()
        engine.run_epoch(1)  # plans the same epoch again, then trains it
        row["epoch_s"] = time.perf_counter() - start
        row["share"] = (row["setup_ms"] + row["plan_ms"]) / 1000 / row["epoch_s"]
    row["peak_rss_mb"] = resident_mb()
    return row


def cell_process(cell: PlanCell, results) -> None:
    try:
        results.put(measure_cell(cell))
    except StratifyError as error:  # reported as the cell's row: e.g. too many clients
        results.put({"partition": cell.spec, "clients": cell.clients, "error": str(error)})
    except BaseException as error:
        results.put(
            {
                "partition": cell.spec,
                "clients": cell.clients,
                "error": f"{type(error).__name__}: {error}",
            }
        )


def run_cell(cell: PlanCell) -> dict[str, Any]:
    """:func:`measure_cell` in a fresh spawned process."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    process = context.Process(target=cell_process, args=(cell, results))
    process.start()
    try:
        return results.get(timeout=CELL_TIMEOUT)
    except Exception:
        return {"partition": cell.spec, "clients": cell.clients, "error": "no result (timeout)"}
    finally:
        process.join(timeout=60)
        if process.is_alive():
            process.terminate()


@dataclass
class PlanResult:
    """What :func:`bench_plan` measured: one row per partition and number of clients, a
    cell that could not be built holding its ``error``."""

    dataset: str
    chunk: int
    selection: str
    rows: list[dict[str, Any]]

    @property
    def measured(self) -> list[dict[str, Any]]:
        return [row for row in self.rows if "error" not in row]

    def to_json(self) -> list[dict[str, Any]]:
        """The rows as ``bench plan --json`` writes them."""
        return self.rows


#: the most clients of a cell: a million one-sample clients already plans for minutes
MAX_CLIENTS = 1_000_000


def bench_plan(
    dataset: str,
    specs: list[str],
    client_counts: list[int],
    *,
    data_dir: str | None = None,
    dataset_options: dict[str, str] | None = None,
    min_size: int | None = None,
    chunk: int = 5,
    selection: str = "uniform",
    train: bool = True,
    on_cell: Callable[[str, int], None] | None = None,
) -> PlanResult:
    """Planning cost per epoch for every partition and number of clients, each cell in its
    own process (:func:`run_cell`).

    Parameters
    ----------
    dataset, data_dir, dataset_options : str, str or None, dict or None
        The data, as ``stratify train`` takes it.
    specs, client_counts : list of str, list of int
        The partitions and the numbers of clients of the table.
    min_size : int or None
        Dirichlet splits: the smallest client size (``None``: the partition's default).
    chunk, selection : int, str
        Stratify's options.
    train : bool
        Also train the epoch, to give planning's share of its wall time.
    on_cell : callable or None
        Called with each cell's partition and clients before it runs (a progress line).
    """
    for spec in specs:
        parse_partition_spec(spec)
    check_positive_int(chunk, "--chunk")
    if min_size is not None:
        check_positive_int(min_size, "--min-size")
    loader_options = dict(dataset_options or {})
    if max(client_counts, default=0) > MAX_CLIENTS:
        raise ConfigError(
            f"--clients takes at most {MAX_CLIENTS:,} clients, got {max(client_counts):,}"
        )
    # loaded now to fail early, and to bound the sizes by its training samples: a chunk or
    # a smallest client larger than the data plans nothing (more clients than samples is
    # a row of the table: the sweep's largest counts may exceed a small data set)
    data = load_dataset(dataset, data_dir=data_dir, device="cpu", seed=0, **loader_options)
    samples = len(data.train_labels)
    for flag, value in (("--chunk", chunk), ("--min-size", min_size)):
        if value is not None and value > samples:
            raise ConfigError(
                f"{flag} {value:,}: more than the {samples:,} training samples of {dataset}"
            )
    options = tuple(sorted(loader_options.items()))
    rows = []
    for spec in specs:
        for clients in client_counts:
            if on_cell is not None:
                on_cell(spec, clients)
            cell = PlanCell(
                dataset, data_dir, options, spec, clients, min_size, chunk, selection, train
            )
            rows.append(run_cell(cell))
    return PlanResult(dataset, chunk, selection, rows)
