"""A grid's results: one row per run in ``results.csv``, the tables in ``results.md``.

Every table leads with the mean accuracy over a run's last rounds (:mod:`stratify.measures`)
and shows the best test accuracy over the epochs beside it, marked as chosen on the test
set ("97.10 ± 0.20% (best 97.50 ± 0.10%, E9)"); a paired grid's table sets each method
beside its matched comparator with the difference and its 95% interval over seeds
(:mod:`stratify.reproduce.paired`). Everything is read back from the run folders
(``config.json``, ``metrics.jsonl``), so the tables of a grid finished in several sittings
are those of one uninterrupted run.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from stratify.algorithms import method_label, strategy_class
from stratify.config import run_complete
from stratify.errors import CorruptRunError
from stratify.measures import PlateauRule, accuracy_summary, plateau_budget
from stratify.parallel import RunOutcome, best_of
from stratify.reproduce.grids import OWN_RATE_SUFFIX, Cell, Column, Grid, Row
from stratify.reproduce.paired import (
    CONVERGED_POINTS,
    NEAR_CHANCE,
    NEAR_ZERO_WORST_GROUP,
    OWN_RATES,
    UNJUDGED,
    VERDICTS,
    PairedDifference,
    Verdict,
    paired_difference,
    stein_difference,
    verdict,
)
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
    "stage",
    "epochs",
    "lr",
    "tuned",
    "status",
    "last_mean_accuracy",
    "last_std_accuracy",
    "last_rounds",
    "final_accuracy",
    "best_accuracy",
    "best_epoch",
    "best_val_epoch",
    "test_accuracy_at_best_val",
    "last_mean_validation_accuracy",
    "best_validation_accuracy",
    "converged_epoch",
    "last_mean_worst_group_accuracy",
    "final_worst_group_accuracy",
    "sample_gradients_per_round",
    "transfers_per_epoch",
    "bytes_per_round",
    "total_transfers",
    "distinct_clients",
    "role",
    "comparator",
    "wall_seconds",
    "run_dir",
    # what a paired table reads of each run besides its accuracies (PAIRED_HEADER)
    "best_worst_group_accuracy",
    "classes",
    "clients",
    "cap",
    "plateau",
    "warm_accuracy",
    "biased_share",
    "blocked_by",
    "attribute_free",
)

#: the columns of ``results.csv`` that hold whole numbers, and those that hold other
#: numbers (finite: a run writes no NaN); any of them is empty where nothing was measured
INTEGER_FIELDS = frozenset(
    {
        "seed",
        "stage",
        "epochs",
        "last_rounds",
        "best_epoch",
        "best_val_epoch",
        "converged_epoch",
        "total_transfers",
        "distinct_clients",
        "classes",
        "clients",
        "cap",
        "plateau",
    }
)
NUMBER_FIELDS = frozenset(
    {
        "lr",
        "last_mean_accuracy",
        "last_std_accuracy",
        "final_accuracy",
        "best_accuracy",
        "test_accuracy_at_best_val",
        "last_mean_validation_accuracy",
        "best_validation_accuracy",
        "last_mean_worst_group_accuracy",
        "final_worst_group_accuracy",
        "sample_gradients_per_round",
        "transfers_per_epoch",
        "bytes_per_round",
        "wall_seconds",
        "best_worst_group_accuracy",
        "warm_accuracy",
        "biased_share",
    }
)
#: the columns every ``results.csv`` has held, those of the earliest committed copies
#: (later versions added the validation and the paired tables' columns)
BASE_FIELDS = tuple(
    name
    for name in CSV_FIELDS[: CSV_FIELDS.index("run_dir") + 1]
    if name
    not in ("stage", "last_mean_validation_accuracy", "best_validation_accuracy", "converged_epoch")
)


#: a row of ``results.csv`` as read back (every value text)
Run = Mapping[str, str]


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
    #: the data's classes (config.json; the placeholders in folders written before)
    classes: int | None = None

    @property
    def best(self) -> tuple[float | None, int | None]:
        return best_of(self.records)

    @property
    def transfers_per_epoch(self) -> float | None:
        if not self.records:
            return None
        return sum(record["transfers"] for record in self.records) / len(self.records)

    @property
    def summary(self) -> dict[str, Any]:
        """:func:`~stratify.measures.accuracy_summary` of the records."""
        return accuracy_summary(self.records)

    def per_epoch(self, key: str) -> float | None:
        """The mean of ``key`` over the records that have it (``None`` if none has)."""
        values = [record[key] for record in self.records if record.get(key) is not None]
        return statistics.fmean(values) if values else None

    @property
    def distinct_clients(self) -> int | None:
        """Clients that returned an update over the run (``None`` where none did)."""
        trained = {c for record in self.records for c in record.get("clients_trained") or ()}
        return len(trained) if trained else None


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
    resolved = resolved_settings(folder)
    lr = resolved.get("lr")
    classes = resolved.get("num_classes", resolved.get("num_placeholders"))
    accuracies = [record.get("validation_accuracy") for record in records]
    if run_complete(cell.config, accuracies, resolved.get("num_classes")):
        status = "finished"
    elif outcome is not None and outcome.status in ("diverged", "failed"):
        status = outcome.status
    else:
        status = "incomplete" if records else "missing"
    return CellResult(
        cell,
        status,
        records,
        float(lr) if is_metric(lr) else None,
        message,
        corrupt,
        int(classes) if isinstance(classes, int) else None,
    )


def resolved_settings(folder: Path) -> dict[str, Any]:
    """What ``folder/config.json`` says the run resolved (its ``resolved`` entry: the
    learning rate, the classes, …), or nothing if it cannot be read."""
    try:
        resolved = read_json_object(folder / "config.json").get("resolved", {})
    except (CorruptRunError, OSError, AttributeError):
        return {}
    return resolved if isinstance(resolved, dict) else {}


def csv_row(grid: Grid, result: CellResult, tuned: bool) -> dict[str, Any]:
    config = result.cell.config
    best, epoch = result.best
    summary = result.summary
    per_epoch = result.transfers_per_epoch
    gradients = result.per_epoch("sample_gradients")
    bytes_sent = result.per_epoch("bytes_sent")
    return {
        "grid": grid.name,
        "row": result.cell.row.label,
        "column": result.cell.column.label,
        "algorithm": config.algorithm,
        "dataset": config.dataset,
        "partition": config.partition,
        "mode": config.mode,
        "seed": config.seed,
        "stage": result.cell.stage,
        "epochs": len(result.records),
        # a run stopped before it resolved its rate ran at its cell's, where one is set
        "lr": result.lr if result.lr is not None else config.lr,
        # a paired method's column at its own rate keeps it where the grid is tuned
        "tuned": tuned and not result.cell.column.own_rate,
        "status": result.status,
        "last_mean_accuracy": summary["last_mean_accuracy"],
        "last_std_accuracy": summary["last_std_accuracy"],
        "last_rounds": summary["last_rounds"],
        "final_accuracy": summary["final_accuracy"],
        "best_accuracy": best,
        "best_epoch": epoch,
        "best_val_epoch": summary["best_val_epoch"],
        "test_accuracy_at_best_val": summary["test_accuracy_at_best_val"],
        "last_mean_validation_accuracy": summary["last_mean_validation_accuracy"],
        "best_validation_accuracy": summary["best_validation_accuracy"],
        "converged_epoch": converged_epoch(result),
        "last_mean_worst_group_accuracy": summary["last_mean_worst_group_accuracy"],
        "final_worst_group_accuracy": summary["final_worst_group_accuracy"],
        "sample_gradients_per_round": None if gradients is None else round(gradients, 1),
        "transfers_per_epoch": None if per_epoch is None else round(per_epoch, 1),
        "bytes_per_round": None if bytes_sent is None else round(bytes_sent, 1),
        "total_transfers": sum(record["transfers"] for record in result.records),
        "distinct_clients": result.distinct_clients,
        "role": role(grid, result.cell),
        "comparator": result.cell.comparator,
        "wall_seconds": round(sum(record["wall_seconds"] for record in result.records), 2),
        "run_dir": str(config.out),
        "best_worst_group_accuracy": summary["best_worst_group_accuracy"],
        "classes": result.classes,
        "clients": config.clients,
        "cap": config.epochs,
        "plateau": config.stop_on_plateau,
        **mechanism(result.records),
    }


def converged_epoch(result: CellResult) -> int | None:
    """The first epoch after which ``result``'s validation accuracy had converged by
    :class:`~stratify.measures.PlateauRule` (from epoch 1, the run's epochs the cap,
    chance from its classes), whether or not the run stopped there; ``None`` where it
    never did, or has no validation accuracy."""
    accuracies = [record.get("validation_accuracy") for record in result.records]
    known = [float(accuracy) for accuracy in accuracies if accuracy is not None]
    if not accuracies or len(known) < len(accuracies):
        return None
    chance = 1.0 / result.classes if result.classes else None
    budget = plateau_budget(known, PlateauRule(1, len(known), chance=chance))
    return budget.rounds if budget is not None and budget.reason == "plateau" else None


def mechanism(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What a run's records say about whether its method's mechanism acted: the test
    accuracy of the warm model entering stage 2 (FedBSS), the mean biased-set share, why
    its selection could not act, and whether a diverse selection found no attribute."""
    infos = [record.get("info") or {} for record in records]
    stages = [info.get("stage") for info in infos]
    warm = records[stages.index(2) - 1]["test_accuracy"] if 2 in stages[1:] else None
    shares = [info["biased_share"] for info in infos if "biased_share" in info]
    blocked = sorted({info["blocked_by"] for info in infos if "blocked_by" in info})
    diverse = any(info.get("selection") == "diverse" for info in infos)
    return {
        "warm_accuracy": warm,
        "biased_share": statistics.fmean(shares) if shares else None,
        "blocked_by": "; ".join(blocked) or None,
        "attribute_free": diverse and not any(info.get("attribute") for info in infos),
    }


def role(grid: Grid, cell: Cell) -> str:
    """A paired grid's ``method`` and ``comparator`` cells; ``run`` in other grids."""
    if not grid.paired:
        return "run"
    return "comparator" if cell.comparator is None else "method"


def csv_text(grid: Grid, results: Sequence[CellResult], tuned: bool) -> bytes:
    """``results.csv``: one row per run (cell), empty fields where nothing was measured."""
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS)
    writer.writeheader()
    for result in results:
        row = csv_row(grid, result, tuned)
        writer.writerow({key: "" if value is None else value for key, value in row.items()})
    return buffer.getvalue().encode()


def csv_runs(grid: Grid, results: Sequence[CellResult], tuned: bool) -> list[dict[str, str]]:
    """The rows of ``results.csv`` as read back from the file (every value text)."""
    return list(csv.DictReader(io.StringIO(csv_text(grid, results, tuned).decode())))


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
    last: Sequence[tuple[float, float]] = (),
) -> str:
    """A table cell: the last-rounds mean first, the paper's best-over-epochs beside it.

    ``97.10 ± 0.20% (best 97.50 ± 0.10%, E9)``: over several seeds, the mean and sample
    standard deviation of each seed's last-rounds mean, then of each seed's best test
    accuracy with the median epoch; for one seed, the mean ± standard deviation over its
    last rounds, then its best (``98.80%, E4``). Without ``last``, the best alone.

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
    last : sequence of (mean, std)
        Each seed's last-rounds mean and its standard deviation over those rounds.
    """
    if not accuracies:
        return "–"
    mean, std = mean_std(accuracies)
    best = f"{100 * mean:.2f}%" if len(accuracies) == 1 else f"{100 * mean:.2f} ± {100 * std:.2f}%"
    best += f", E{median_epoch(epochs)}"
    if last:
        if len(last) == 1:
            last_mean, last_std = last[0]
        else:
            last_mean, last_std = mean_std([value for value, _ in last])
        text = f"{100 * last_mean:.2f} ± {100 * last_std:.2f}% (best {best})"
    else:
        text = best
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


def groups_of(runs: Sequence[Run]) -> tuple[list[str], list[str], dict[tuple[str, str], list[Run]]]:
    """The row and column labels of a grid's ``results.csv`` rows in the order they first
    appear (the grid's), and the runs of each (row, column)."""
    rows: dict[str, None] = {}
    columns: dict[str, None] = {}
    groups: dict[tuple[str, str], list[Run]] = {}
    for run in runs:
        rows.setdefault(run["row"])
        columns.setdefault(run["column"])
        groups.setdefault((run["row"], run["column"]), []).append(run)
    return list(rows), list(columns), groups


def accuracy_table(runs: Sequence[Run], seeds: int) -> str:
    """The accuracy table of a grid's ``results.csv`` rows (``runs``; ``seeds`` the seeds
    asked for): a line per row, a cell per column (:func:`format_accuracy`), a tuned
    rate shown beside its cell.

    Parameters
    ----------
    runs : sequence of mapping
        The rows of the grid's ``results.csv``.
    seeds : int
        The seeds asked for: a cell with fewer says so.
    """
    rows, columns, groups = groups_of(runs)
    partitions = {run["partition"] for run in runs}
    corner = "Partitioning" if len(partitions) == len(rows) else "Setting"
    lines = []
    for row in rows:
        line = [row]
        for column in columns:
            measured = [run for run in groups.get((row, column), []) if int(run["epochs"])]
            best = [
                (float(run["best_accuracy"]), int(run["best_epoch"]))
                for run in measured
                if run["best_accuracy"]
            ]
            last = [
                (float(run["last_mean_accuracy"]), float(run["last_std_accuracy"]))
                for run in measured
                if run["last_mean_accuracy"]
            ]
            tuned = [float(run["lr"]) for run in measured if run["tuned"] == "True" and run["lr"]]
            line.append(
                format_accuracy(
                    [accuracy for accuracy, _ in best],
                    [epoch for _, epoch in best],
                    expected=seeds,
                    diverged=sum(run["status"] == "diverged" for run in measured),
                    lr=tuned[0] if tuned else None,
                    last=last,
                )
            )
        lines.append(line)
    return markdown_table([corner, *columns], lines)


def transfers_table(runs: Sequence[Run]) -> str:
    """Model transfers per epoch of a grid's ``results.csv`` rows, mean over the seeds."""
    rows, columns, groups = groups_of(runs)
    lines = []
    for row in rows:
        line = [row]
        for column in columns:
            values = [
                value
                for run in groups.get((row, column), [])
                if (value := number(run, "transfers_per_epoch")) is not None
            ]
            line.append(f"{statistics.fmean(values):,.1f}" if values else "–")
        lines.append(line)
    return markdown_table(["Setting", *columns], lines)


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
        ["row/column", "default lr", "last-rounds validation accuracy per lr", "chosen"], lines
    )


LAST_ROUNDS_TEXT = "the last 10% of the rounds, at least the last 3"


def describe(grid: Grid, cells: Sequence[Cell], seeds: Sequence[int], tuning: Tuning | None) -> str:
    """One paragraph on how the table was obtained."""
    config = cells[0].config
    modes = sorted({cell.config.mode for cell in cells})
    epochs = sorted({cell.config.epochs for cell in cells})
    datasets = sorted({cell.config.dataset for cell in cells})
    clients = sorted({cell.config.clients for cell in cells})
    text = (
        f"Grid `{grid.name}`: {grid.description}. Dataset "
        f"{' and '.join(f'`{name}`' for name in datasets)}, "
        f"{' and '.join(modes)} mode, {'/'.join(map(str, clients))} clients, "
        f"{'/'.join(map(str, epochs))} epochs, seeds {', '.join(map(str, seeds))}"
    )
    if config.model:
        text += f", model `{config.model}`"
    if tuning is not None:
        factors = ", ".join(f"{factor:g}" for factor in tuning.factors)
        text += (
            f"; each learning rate chosen from {factors} × the method's default by the "
            f"accuracy over the last rounds on a {100 * tuning.validation:g}% validation "
            f"split of the training samples (seed {seeds[0]}"
            + (f", {tuning.epochs} epoch{'s' * (tuning.epochs != 1)}" if tuning.epochs else "")
            + "), never the test set"
        )
    elif any("lr" in row.values for row in grid.rows):
        text += "; each row's learning rate"
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
    # the tables are rendered from results.csv's rows, as the docs render a committed copy
    runs = csv_runs(grid, results, tuning is not None)
    if grid.paired:
        parts += paired_tables(runs, len(seeds))
    else:
        parts.append(
            f"Test accuracy: the mean over each run's last rounds ({LAST_ROUNDS_TEXT}), "
            + (
                "mean ± sample standard deviation over the seeds"
                if len(seeds) > 1
                else "± its standard deviation over those rounds"
            )
            + "; in brackets the best test accuracy over the epochs and the epoch it was "
            "reached"
            + (" (median over the seeds)" if len(seeds) > 1 else "")
            + " — chosen on the test set, so optimistic. A diverged run counts with its "
            "epochs before the loss became non-finite.\n"
        )
        parts.append(accuracy_table(runs, len(seeds)))
    if grid.paper and cells[0].config.dataset in grid.paper_datasets:
        parts.append(f"{grid.paper_source}:")
        parts.append(paper_table(grid, results))
    if grid.transfers:
        parts.append("Model transfers per epoch (mean over seeds and epochs):")
        parts.append(transfers_table(runs))
    if chosen:
        parts.append(
            "Learning-rate tuning (each candidate's validation accuracy over its last rounds):"
        )
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


# -- paired grids -------------------------------------------------------------------------


def percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.2f}"


def signed_points(difference: PairedDifference | None) -> str:
    """``+1.23 [−0.50, +2.96]``: the mean difference in points and its 95% interval."""
    if difference is None:
        return "–"
    text = f"{100 * difference.mean:+.2f}"
    if difference.interval is not None:
        low, high = difference.interval
        text += f" [{100 * low:+.2f}, {100 * high:+.2f}]"
    return text.replace("-", "−")


def number(run: Run, field: str) -> float | None:
    """``run``'s ``field`` as a number; ``None`` where the file has none (or no column)."""
    text = run.get(field) or ""
    return float(text) if text else None


def seed_values(runs: Sequence[Run], field: str) -> dict[int, float]:
    """Seed -> ``field`` of each run that has it. A run stopped short of its epochs (a
    report of a grid stopped part way) is left out: compared with a finished one, it
    would be a comparison at unequal rounds."""
    values = {}
    for run in runs:
        value = number(run, field)
        if run["status"] not in UNFINISHED and value is not None:
            values[int(run["seed"])] = value
    return values


def seed_difference(
    method: Sequence[Run], comparator: Sequence[Run], field: str
) -> PairedDifference | None:
    """``method − comparator`` on ``field``, paired by seed: the t-interval over the
    seeds, or Stein's two-stage interval where seeds were added by the two-stage design
    (a run of stage 2; :func:`~stratify.reproduce.paired.stein_difference`)."""
    ours, theirs = seed_values(method, field), seed_values(comparator, field)
    added = {int(run["seed"]) for run in (*method, *comparator) if run.get("stage") == "2"}
    common = sorted(set(ours) & set(theirs))
    first = [ours[seed] - theirs[seed] for seed in common if seed not in added]
    if not added or len(first) < 2:
        return paired_difference(ours, theirs)
    return stein_difference(first, [ours[seed] - theirs[seed] for seed in common])


def mean_text(values: dict[int, float]) -> str:
    """``mean ± std`` in percent over the seeds (one seed: its value)."""
    if not values:
        return "–"
    mean, std = mean_std(list(values.values()))
    return f"{100 * mean:.2f}" + (f" ± {100 * std:.2f}" if len(values) > 1 else "")


def budget_text(method: Sequence[Run], comparator: Sequence[Run], field: str) -> str:
    """``method / comparator`` means of a per-round count (bytes in MB)."""
    shown = []
    for runs in (method, comparator):
        values = [value for run in runs if (value := number(run, field)) is not None]
        if not values:
            shown.append("–")
        elif field == "bytes_per_round":
            shown.append(f"{statistics.fmean(values) / 1e6:.2f}")
        else:
            shown.append(f"{statistics.fmean(values):,.0f}")
    return " / ".join(shown)


def method_notes(runs: Sequence[Run]) -> str:
    """What a paired method's runs say about whether its mechanism acted."""
    notes = []
    warm = [value for run in runs if (value := number(run, "warm_accuracy")) is not None]
    if warm:
        notes.append(f"warm model {100 * statistics.fmean(warm):.1f}%")
    shares = [value for run in runs if (value := number(run, "biased_share")) is not None]
    if shares:
        notes.append(f"biased share {100 * statistics.fmean(shares):.0f}%")
    blocked = sorted({part for run in runs for part in (run.get("blocked_by") or "").split("; ")})
    if any(blocked):
        notes.append("selection cannot act: " + "; ".join(part for part in blocked if part))
    if any(run.get("attribute_free") == "True" for run in runs):
        notes.append("no attribute in the data: triplets carry class imbalance only")
    distinct = [int(value) for run in runs if (value := number(run, "distinct_clients"))]
    clients = [int(value) for run in runs if (value := number(run, "clients"))]
    if distinct and clients and min(distinct) < max(clients):
        notes.append(f"{min(distinct)}–{max(distinct)} distinct clients trained")
    diverged = sum(run["status"] == "diverged" for run in runs)
    if diverged:
        notes.append(f"{diverged} diverged")
    return "; ".join(notes)


def column_key(run: Run) -> str:
    """The key of ``run``'s column: the folder above its seed's (``cells/ROW/COLUMN/seed-N``),
    which a method's ``comparator`` names."""
    return PurePath(run["run_dir"]).parent.name


def paired_lines(runs: Sequence[Run], seeds: int, field: str) -> list[list[str]]:
    """One table line per row and paired method, on ``field`` of a grid's ``results.csv``
    rows (``runs``); ``seeds`` the seeds asked for."""
    methods: dict[tuple[str, str], list[Run]] = {}
    comparators: dict[tuple[str, str], list[Run]] = {}
    for run in runs:
        group = methods if run["role"] == "method" else comparators
        group.setdefault((run["row"], column_key(run)), []).append(run)
    lines = []
    for (row, _), method in methods.items():
        comparator = comparators.get((row, method[0]["comparator"]), [])
        ours, theirs = seed_values(method, field), seed_values(comparator, field)
        if not ours and not theirs:
            continue
        missing = seeds - len(set(ours) & set(theirs))
        best_ours = seed_values(method, "best_accuracy")
        best_theirs = seed_values(comparator, "best_accuracy")
        base = (
            comparator[0]["algorithm"]
            if comparator
            else str(strategy_class(method[0]["algorithm"]).card.comparison.comparator)
        )
        difference = seed_difference(method, comparator, field)
        lines.append(
            [
                row,
                method[0]["column"],
                mean_text(ours),
                f"{method_label(base)}: {mean_text(theirs)}",
                signed_points(difference)
                + (f" ({seeds - missing} of {seeds} seeds)" if missing > 0 else ""),
                str(
                    unjudged(method, comparator)
                    or pair_verdict(difference, ours, theirs, method, comparator, field)
                ),
                rounds_text(comparator),
                f"{mean_text(best_ours)} / {mean_text(best_theirs)}",
                budget_text(method, comparator, "sample_gradients_per_round"),
                budget_text(method, comparator, "bytes_per_round"),
                method_notes(method),
            ]
        )
    return lines


def rounds_text(comparator: Sequence[Run]) -> str:
    """The rounds a pair ran over its seeds (``20``, ``23–41``), and under a plateau
    budget how many comparators plateaued before the cap and how many diverged (stopped
    before it by a non-finite loss, not by the plateau)."""
    ran = [run for run in comparator if int(run["epochs"]) and run["status"] not in UNFINISHED]
    rounds = sorted(int(run["epochs"]) for run in ran)
    if not rounds:
        return "–"
    text = str(rounds[0]) if rounds[0] == rounds[-1] else f"{rounds[0]}–{rounds[-1]}"
    watched = [run for run in ran if run.get("plateau")]
    if watched:
        diverged = sum(run["status"] == "diverged" for run in watched)
        plateaued = sum(
            run["status"] != "diverged" and int(run["epochs"]) < int(run["cap"]) for run in watched
        )
        stopped = f", {diverged} diverged" if diverged else ""
        text += f" ({plateaued} of {len(watched)} plateaued{stopped}, cap {watched[0]['cap']})"
    return text


def rate_regime(method: Sequence[Run], comparator: Sequence[Run]) -> str:
    """At which rates a pair's runs stepped: both at the base's (a tuned grid chose it for
    the comparator and the method used it too), both at the method's (an untuned grid), or
    each at its own (a method's column at its own rate beside its tuned comparator)."""
    tuned = (
        [run.get("tuned") == "True" for run in method],
        [run.get("tuned") == "True" for run in comparator],
    )
    if any(tuned[1]) and not any(tuned[0]):
        return OWN_RATES
    return "at the base's rate" if any(tuned[0]) or any(tuned[1]) else "at the method's rate"


def pair_verdict(
    difference: PairedDifference | None,
    ours: dict[int, float],
    theirs: dict[int, float],
    method: Sequence[Run],
    comparator: Sequence[Run],
    field: str = "last_mean_accuracy",
) -> Verdict:
    """:func:`~stratify.reproduce.paired.verdict` on a pair's per-seed values of ``field``,
    with the chance level of the data its runs recorded, naming the rates the two ran at
    (:func:`rate_regime`)."""
    runs = [*method, *comparator]
    classes = next((int(value) for run in runs if (value := number(run, "classes"))), None)
    judged = verdict(
        difference,
        statistics.fmean(ours.values()) if ours else None,
        statistics.fmean(theirs.values()) if theirs else None,
        classes,
        worst_group="worst_group" in field,
    )
    reason = judged.reason
    if "worst_group" not in field:
        # the word still compares the last rounds, but a run that fell that far from its
        # best (an oscillating or collapsed run) had not converged: the verdict says so
        unsettled = [
            f"a {role} run ended {max(below):.1f} points below its best"
            for role, group in (("method", method), ("comparator", comparator))
            if (below := [points for run in group if (points := ended_below_best(run)) is not None])
            and max(below) > CONVERGED_POINTS
        ]
        reason = "; ".join(part for part in (reason, " and ".join(unsettled)) if part)
    return dataclasses.replace(judged, reason=reason, regime=rate_regime(method, comparator))


def stopped_below_best(run: Run) -> float | None:
    """How many points below its own best a run that stopped on a plateau ended
    (:func:`ended_below_best`); ``None`` for a run that did not stop on a plateau."""
    if not run.get("plateau") or run["status"] != "finished":
        return None
    if int(run["epochs"]) >= int(run["cap"]):
        return None
    return ended_below_best(run)


def ended_below_best(run: Run) -> float | None:
    """How many points below its own best a finished run ended: its last-rounds mean
    against its best validation accuracy (files written before that was recorded: the
    test accuracy's, the one both were kept for); ``None`` for an unfinished run."""
    if run["status"] != "finished":
        return None
    best, last = number(run, "best_validation_accuracy"), "last_mean_validation_accuracy"
    if best is None:
        best, last = number(run, "best_accuracy"), "last_mean_accuracy"
    ended = number(run, last)
    return None if best is None or ended is None else 100 * (best - ended)


def unjudged(method: Sequence[Run], comparator: Sequence[Run]) -> Verdict | None:
    """Why a pair gets no verdict (a word of :data:`UNJUDGED`), or ``None``: a run of it
    diverged, its comparator is not the method's matched one, two runs of a seed ran
    unequal rounds, or the comparator stopped on a plateau more than
    :data:`CONVERGED_POINTS` below its own best."""
    runs = [*method, *comparator]
    diverged = sum(run["status"] == "diverged" for run in runs)
    if diverged:
        return Verdict("diverged", f"{diverged} run(s) of {len(runs)}", "at this rate")
    if comparator and not comparator[0]["column"].endswith("(matched)"):
        return Verdict("unmatched", f"comparator {comparator[0]['column']}")
    rounds = {int(run["seed"]): run["epochs"] for run in comparator}
    if any(rounds.get(int(run["seed"]), run["epochs"]) != run["epochs"] for run in method):
        return Verdict("unequal", "rounds differ within a seed")
    below = [points for run in comparator if (points := stopped_below_best(run)) is not None]
    if below and max(below) > CONVERGED_POINTS:
        return Verdict(
            "unconverged",
            f"a comparator stopped on a plateau {max(below):.1f} points below its best",
        )
    return None


def verdict_counts(lines: Sequence[Sequence[str]]) -> str:
    """``2 ahead, 0 behind, 3 level, 2 inconclusive (1 with both runs near chance); not
    counted: 1 diverged``: how many pairs reached each verdict (the verdict column of
    :data:`PAIRED_HEADER`), then the pairs that got none."""
    column = PAIRED_HEADER.index(VERDICT_COLUMN)
    words = [line[column].split(" ", 1)[0] for line in lines]
    reasons = []
    for reason in (NEAR_CHANCE, NEAR_ZERO_WORST_GROUP):
        count = sum(reason in line[column] for line in lines)
        reasons += [f"{count} with {reason}"] if count else []
    text = ", ".join(f"{words.count(word)} {word}" for word in VERDICTS)
    text += f" ({'; '.join(reasons)})" if reasons else ""
    unjudged_counts = [f"{words.count(word)} {word}" for word in UNJUDGED if word in words]
    return text + (f"; not counted: {', '.join(unjudged_counts)}" if unjudged_counts else "")


VERDICT_COLUMN = "verdict"
PAIRED_HEADER = (
    "split",
    "method",
    "method, %",
    "matched comparator, %",
    "difference, points [95% interval]",
    VERDICT_COLUMN,
    "rounds",
    "best (chosen on test), %: method / comparator",
    "sample-gradients per round: method / comparator",
    "MB per round: method / comparator",
    "notes",
)


#: the column of the best accuracy chosen on test
BEST_COLUMN = PAIRED_HEADER.index("best (chosen on test), %: method / comparator")


def paired_tables(runs: Sequence[Run], seeds: int) -> list[str]:
    """The paired grid's tables from its ``results.csv`` rows (``runs``; ``seeds`` the
    seeds asked for): test accuracy, and worst-group accuracy where the data has
    attributes, each method beside its matched comparator, with the verdicts; where the
    grid was tuned, its methods at their own rates beside the same comparators too."""
    own = [run for run in runs if at_own_rate(run) or run["role"] == "comparator"]
    runs = [run for run in runs if not at_own_rate(run)]
    lines = paired_lines(runs, seeds, "last_mean_accuracy")
    parts = [
        f"Each method against its matched comparator (the same local optimizer, local work, "
        f"clients per round, weighting, rounds and seeds). Test accuracy in %: the mean over "
        f"each run's last rounds ({LAST_ROUNDS_TEXT}), mean ± sample standard deviation over "
        f"the seeds; the difference is method − comparator, paired by seed, with its 95% "
        f"t-interval over the seeds. The best test accuracy over the rounds is chosen on the "
        f"test set and shown for comparison with papers only. Budgets are measured means per "
        f"round. Verdict: ahead or behind (the interval above or below zero), level (inside "
        f"±1 point), or inconclusive (the interval holds zero and is wider than ±1 point, or "
        f"both runs are within 5 points of chance), each at the rate both runs stepped at; "
        f"it names a run of the pair whose last rounds ended more than "
        f"{CONVERGED_POINTS:g} points below its own best (validation accuracy where "
        f"recorded): an oscillating or collapsed run, not a converged one. "
        f"No verdict, and not counted: a run of the pair diverged, the comparator is not "
        f"the matched one, two runs of a seed ran unequal rounds, or the comparator stopped "
        f"on a plateau more than {CONVERGED_POINTS:g} points below its own best "
        f"(unconverged). Rounds: those each pair ran over its seeds; under a plateau budget "
        f"(`--plateau`) the comparator ran until its validation accuracy plateaued by the "
        f"rule in force when the grid ran, and the method the same rounds.\n",
        markdown_table(PAIRED_HEADER, lines),
        f"Verdicts: {verdict_counts(lines)}.\n",
    ]
    groups = paired_lines(runs, seeds, "last_mean_worst_group_accuracy")
    if groups:
        parts.append(
            "Worst-group accuracy in % (the lowest accuracy over the test set's (label, "
            "attribute) groups), last-rounds mean, where the data has attributes; a pair "
            "whose runs both score within 5 points of 0 on it is inconclusive:\n"
        )
        header = list(PAIRED_HEADER)
        header[BEST_COLUMN] = "best worst group (chosen on test), %: method / comparator"
        worst = paired_lines_worst(runs, seeds)
        parts.append(markdown_table(header, worst))
        parts.append(f"Verdicts on the worst group: {verdict_counts(worst)}.\n")
    if any(at_own_rate(run) for run in own):
        lines = paired_lines(own, seeds, "last_mean_accuracy")
        parts += [
            "Each method at its own rate (its default for the data, chosen on a validation "
            "split by the `defaults` grids), against the same matched comparator at the rate "
            "tuned for it, the same rounds and seeds: the two methods each at its own rate, "
            f"as a user would run them, where the table above steps both at the comparator's "
            f"rate. Columns and verdicts as above, {OWN_RATES}:\n",
            markdown_table(PAIRED_HEADER, lines),
            f"Verdicts, {OWN_RATES}: {verdict_counts(lines)}.\n",
        ]
    return parts


def at_own_rate(run: Run) -> bool:
    """Whether ``run`` is of a paired method's column at its own rate
    (:func:`~stratify.reproduce.grids.own_rate_cells`)."""
    return column_key(run).endswith(OWN_RATE_SUFFIX)


def paired_lines_worst(runs: Sequence[Run], seeds: int) -> list[list[str]]:
    """:func:`paired_lines` on the worst-group accuracy."""
    lines = paired_lines(runs, seeds, "last_mean_worst_group_accuracy")
    best = {
        (line[0], line[1]): line for line in paired_lines(runs, seeds, "best_worst_group_accuracy")
    }
    for line in lines:
        other = best.get((line[0], line[1]))
        if other is not None:
            line[BEST_COLUMN] = f"{other[2]} / {other[3].split(': ', 1)[-1]}"
    return lines
