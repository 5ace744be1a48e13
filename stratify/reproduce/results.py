"""A grid's results: one row per run in ``results.csv``, the paper's table in
``results.md`` ("98.80%, E4", mean ± std over seeds).

Everything is read back from the run folders (``config.json``, ``metrics.jsonl``), so
the tables of a grid finished in several sittings are those of one uninterrupted run.
"""

from __future__ import annotations

import csv
import io
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stratify.errors import CorruptRunError
from stratify.parallel import RunOutcome, best_of
from stratify.reproduce.grids import Cell, Column, Grid, Row
from stratify.reproduce.tuning import Choice, Tuning
from stratify.runfiles import is_metric, read_json_object, read_records

#: statuses of a cell without every epoch asked for, listed under the table
UNFINISHED = ("failed", "corrupt", "missing", "incomplete")

CSV_FIELDS = (
    "grid",
    "row",
    "column",
    "algorithm",
    "dataset",
    "partition",
    "mode",
    "seed",
    "epochs",
    "lr",
    "tuned",
    "status",
    "best_accuracy",
    "best_epoch",
    "final_accuracy",
    "transfers_per_epoch",
    "total_transfers",
    "wall_seconds",
    "run_dir",
)


@dataclass(frozen=True)
class CellResult:
    """What one cell's run folder holds, up to the epochs asked for.

    ``status``: ``finished`` (every epoch), ``diverged`` (stopped by a non-finite loss;
    its best epoch before that counts), ``failed`` (``message`` says why), ``corrupt``
    (its folder cannot be read back; ``message`` says why), ``incomplete`` or
    ``missing``. ``corrupt`` says why the folder was found corrupt before it was run
    again from its first epoch.
    """

    cell: Cell
    status: str
    records: tuple[dict[str, Any], ...]
    lr: float | None
    message: str = ""
    corrupt: str = ""

    @property
    def best(self) -> tuple[float | None, int | None]:
        return best_of(self.records)

    @property
    def transfers_per_epoch(self) -> float | None:
        if not self.records:
            return None
        return sum(record["transfers"] for record in self.records) / len(self.records)


def read_cell(cell: Cell, outcome: RunOutcome | None = None) -> CellResult:
    """``cell``'s result from its folder; ``outcome`` tells a divergence or failure apart.
    A folder whose files cannot be read back is ``corrupt``, never an error."""
    folder = Path(str(cell.config.out))
    corrupt = outcome.corrupt if outcome is not None else ""
    try:
        records = tuple(read_records(folder)[: cell.config.epochs])
    except CorruptRunError as error:
        return CellResult(cell, "corrupt", (), None, str(error), corrupt)
    if outcome is not None and outcome.status == "corrupt":
        return CellResult(cell, "corrupt", records, None, outcome.message, corrupt)
    message = outcome.message if outcome is not None else ""
    if len(records) >= cell.config.epochs:
        status = "finished"
    elif outcome is not None and outcome.status in ("diverged", "failed"):
        status = outcome.status
    else:
        status = "incomplete" if records else "missing"
    return CellResult(cell, status, records, resolved_lr(folder), message, corrupt)


def resolved_lr(folder: Path) -> float | None:
    """The learning rate ``folder/config.json`` says the run used, if it can be read."""
    try:
        lr = read_json_object(folder / "config.json").get("resolved", {}).get("lr")
    except (CorruptRunError, OSError, AttributeError):
        return None
    return float(lr) if is_metric(lr) else None


def csv_row(grid: Grid, result: CellResult, tuned: bool) -> dict[str, Any]:
    config = result.cell.config
    best, epoch = result.best
    final = result.records[-1]["test_accuracy"] if result.records else None
    per_epoch = result.transfers_per_epoch
    return {
        "grid": grid.name,
        "row": result.cell.row.label,
        "column": result.cell.column.label,
        "algorithm": config.algorithm,
        "dataset": config.dataset,
        "partition": config.partition,
        "mode": config.mode,
        "seed": config.seed,
        "epochs": len(result.records),
        "lr": result.lr,
        "tuned": tuned,
        "status": result.status,
        "best_accuracy": best,
        "best_epoch": epoch,
        "final_accuracy": final,
        "transfers_per_epoch": None if per_epoch is None else round(per_epoch, 1),
        "total_transfers": sum(record["transfers"] for record in result.records),
        "wall_seconds": round(sum(record["wall_seconds"] for record in result.records), 2),
        "run_dir": str(config.out),
    }


def csv_text(grid: Grid, results: Sequence[CellResult], tuned: bool) -> bytes:
    """``results.csv``: one row per run (cell), empty fields where nothing was measured."""
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS)
    writer.writeheader()
    for result in results:
        row = csv_row(grid, result, tuned)
        writer.writerow({key: "" if value is None else value for key, value in row.items()})
    return buffer.getvalue().encode()


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    mean = statistics.fmean(values)
    return mean, statistics.stdev(values) if len(values) > 1 else 0.0


def median_epoch(epochs: Sequence[int]) -> int:
    """The median epoch; of an even count, the lower middle one (an epoch that occurred)."""
    ordered = sorted(epochs)
    return ordered[(len(ordered) - 1) // 2]


def format_accuracy(
    accuracies: Sequence[float],
    epochs: Sequence[int],
    *,
    expected: int | None = None,
    diverged: int = 0,
    lr: float | None = None,
) -> str:
    """The paper's cell: ``98.80%, E4`` for one run, ``98.80 ± 0.12%, E4`` for several.

    Parameters
    ----------
    accuracies, epochs : sequence
        Each seed's best test accuracy (a fraction) and the epoch it was reached.
    expected : int, optional
        The seeds asked for; fewer results are marked "(n of N seeds)".
    diverged : int
        Runs among them that diverged (their best epoch before that counts).
    lr : float, optional
        The learning rate to show (a tuned one).
    """
    if not accuracies:
        return "–"
    mean, std = mean_std(accuracies)
    text = f"{100 * mean:.2f}%" if len(accuracies) == 1 else f"{100 * mean:.2f} ± {100 * std:.2f}%"
    text += f", E{median_epoch(epochs)}"
    notes = []
    if expected is not None and len(accuracies) < expected:
        notes.append(f"{len(accuracies)} of {expected} seeds")
    if diverged:
        notes.append(f"{diverged} diverged")
    if notes:
        text += f" ({', '.join(notes)})"
    if lr is not None:
        text += f" · lr {lr:g}"
    return text


def present(grid: Grid, results: Sequence[CellResult]) -> tuple[list[Row], list[Column]]:
    """The grid's rows and columns that have cells, in the grid's order."""
    rows = {result.cell.row.key for result in results}
    columns = {result.cell.column.key for result in results}
    return (
        [row for row in grid.rows if row.key in rows],
        [column for column in grid.columns if column.key in columns],
    )


def by_group(results: Sequence[CellResult]) -> dict[tuple[str, str], list[CellResult]]:
    groups: dict[tuple[str, str], list[CellResult]] = {}
    for result in results:
        groups.setdefault((result.cell.row.key, result.cell.column.key), []).append(result)
    return groups


def markdown_table(header: Sequence[str], lines: Sequence[Sequence[str]]) -> str:
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    rows += ["| " + " | ".join(line) + " |" for line in lines]
    return "\n".join(rows) + "\n"


def accuracy_table(
    grid: Grid, results: Sequence[CellResult], seeds: int, chosen: dict[str, Choice] | None
) -> str:
    rows, columns = present(grid, results)
    groups = by_group(results)
    corner = "Partitioning" if all("partition" in row.values for row in rows) else "Setting"
    lines = []
    for row in rows:
        line = [row.label]
        for column in columns:
            measured = [r for r in groups.get((row.key, column.key), []) if r.records]
            best = [r.best for r in measured]
            choice = chosen.get(f"{row.key}/{column.key}") if chosen else None
            line.append(
                format_accuracy(
                    [accuracy for accuracy, _ in best if accuracy is not None],
                    [epoch for _, epoch in best if epoch is not None],
                    expected=seeds,
                    diverged=sum(r.status == "diverged" for r in measured),
                    lr=choice.lr if choice else None,
                )
            )
        lines.append(line)
    return markdown_table([corner, *(column.label for column in columns)], lines)


def transfers_table(grid: Grid, results: Sequence[CellResult]) -> str:
    rows, columns = present(grid, results)
    groups = by_group(results)
    lines = []
    for row in rows:
        line = [row.label]
        for column in columns:
            values = [
                value
                for r in groups.get((row.key, column.key), [])
                if (value := r.transfers_per_epoch) is not None
            ]
            line.append(f"{statistics.fmean(values):,.1f}" if values else "–")
        lines.append(line)
    return markdown_table(["Setting", *(column.label for column in columns)], lines)


def paper_table(grid: Grid, results: Sequence[CellResult]) -> str:
    rows, columns = present(grid, results)
    columns = [c for c in columns if any((row.key, c.key) in grid.paper for row in rows)]
    lines = [
        [row.label, *(grid.paper.get((row.key, column.key), "–") for column in columns)]
        for row in rows
    ]
    return markdown_table(["Partitioning", *(column.label for column in columns)], lines)


def tuning_table(chosen: dict[str, Choice]) -> str:
    lines = []
    for choice in chosen.values():
        trials = ", ".join(
            f"{trial.lr:g}: "
            + ("–" if trial.accuracy is None else f"{100 * trial.accuracy:.2f}%")
            + ("" if trial.status in ("finished", "skipped") else f" ({trial.status})")
            for trial in choice.trials
        )
        lines.append([choice.group, f"{choice.default:g}", trials, f"**{choice.lr:g}**"])
    return markdown_table(
        ["row/column", "default lr", "validation accuracy per lr", "chosen"], lines
    )


def describe(grid: Grid, cells: Sequence[Cell], seeds: Sequence[int], tuning: Tuning | None) -> str:
    """One paragraph on how the table was obtained."""
    config = cells[0].config
    modes = sorted({cell.config.mode for cell in cells})
    epochs = sorted({cell.config.epochs for cell in cells})
    text = (
        f"Grid `{grid.name}`: {grid.description}. Dataset `{config.dataset}`, "
        f"{' and '.join(modes)} mode, {config.clients} clients, "
        f"{'/'.join(map(str, epochs))} epochs, seeds {', '.join(map(str, seeds))}"
    )
    if config.model:
        text += f", model `{config.model}`"
    if tuning is not None:
        factors = ", ".join(f"{factor:g}" for factor in tuning.factors)
        text += (
            f"; each learning rate chosen from {factors} × the method's default by the best "
            f"accuracy on a {100 * tuning.validation:g}% validation split of the training "
            f"samples (seed {seeds[0]}"
            + (f", {tuning.epochs} epoch{'s' * (tuning.epochs != 1)}" if tuning.epochs else "")
            + "), never the test set"
        )
    else:
        text += "; each method at its default learning rate"
    return text + "."


def markdown(
    grid: Grid,
    cells: Sequence[Cell],
    results: Sequence[CellResult],
    seeds: Sequence[int],
    tuning: Tuning | None,
    chosen: dict[str, Choice] | None,
    notes: Sequence[str],
) -> str:
    """``results.md``: the accuracy table, the paper's beside it, transfers, tuning."""
    parts = [f"# {grid.name}\n", describe(grid, cells, seeds, tuning) + "\n"]
    parts.append(
        "Best test accuracy and the epoch it was reached ("
        + (
            "mean ± sample standard deviation over the seeds; E: the median epoch"
            if len(seeds) > 1
            else "one seed"
        )
        + "). A diverged run counts with its best epoch before the loss became "
        "non-finite.\n"
    )
    parts.append(accuracy_table(grid, results, len(seeds), chosen))
    if grid.paper and cells[0].config.dataset in grid.paper_datasets:
        parts.append(f"{grid.paper_source}:")
        parts.append(paper_table(grid, results))
    if grid.transfers:
        parts.append("Model transfers per epoch (mean over seeds and epochs):")
        parts.append(transfers_table(grid, results))
    if chosen:
        parts.append("Learning-rate tuning (best validation accuracy of each candidate):")
        parts.append(tuning_table(chosen))
    missing = [r for r in results if r.status in UNFINISHED]
    rerun = [r for r in results if r.corrupt and r.status != "corrupt"]
    if notes or missing or rerun:
        lines = [f"- {note}" for note in notes]
        lines += [
            f"- {r.cell.key}: {r.status}" + (f" ({r.message})" if r.message else "")
            for r in missing
        ]
        lines += [f"- {r.cell.key}: was corrupt ({r.corrupt}); run again" for r in rerun]
        parts.append("Notes:\n\n" + "\n".join(lines))
    return "\n".join(part.strip("\n") + "\n" for part in parts)
