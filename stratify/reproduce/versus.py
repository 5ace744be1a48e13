"""One method against every other column of a grid, paired by seed: Table I's question.

In a grid whose columns are methods, each at its own validated rate and schedule (not a
matched pair: the practical question "which method should I use?"), the reference
column (Stratify) is set against each other column of the same row: the difference of
the two runs' last-rounds mean test accuracies, paired by seed, with its 95% t-interval
and a verdict (:mod:`stratify.reproduce.paired`); beside it, whether each run's
validation accuracy converged by :class:`~stratify.measures.PlateauRule` within the
grid's epochs, the final and best accuracies, the paper's figures and the measured
budgets (docs/architecture.md, "Reproducing the papers").
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from pathlib import PurePath

from stratify.reproduce.paired import OWN_RATES, VERDICTS, verdict
from stratify.reproduce.results import (
    UNFINISHED,
    Run,
    markdown_table,
    mean_text,
    number,
    seed_difference,
    seed_values,
    signed_points,
)

VERSUS_HEADER = (
    "split",
    "against",
    "reference, %",
    "other, %",
    "reference − other, points [95% interval]",
    "verdict",
    "converged by the cap (seeds, epoch): reference / other",
    "final, %: reference / other",
    "best (chosen on test), %: reference / other",
    "paper: reference / other",
    "sample-gradients per epoch: reference / other",
    "transfers per epoch: reference / other",
)


def row_key(run: Run) -> str:
    """The folder name of ``run``'s row (``cells/ROW/COLUMN/seed-N``)."""
    return PurePath(run["run_dir"]).parent.parent.name


def column_key(run: Run) -> str:
    """The folder name of ``run``'s column."""
    return PurePath(run["run_dir"]).parent.name


def converged_text(runs: Sequence[Run]) -> str:
    """``5/5 (E20–24)``: how many runs converged within their epochs, and where."""
    finished = [run for run in runs if run["status"] not in UNFINISHED]
    epochs = sorted(int(run["converged_epoch"]) for run in finished if run.get("converged_epoch"))
    text = f"{len(epochs)}/{len(finished)}"
    if epochs:
        text += f" (E{epochs[0]}" + (f"–{epochs[-1]})" if epochs[-1] != epochs[0] else ")")
    return text


def all_converged(runs: Sequence[Run]) -> bool:
    finished = [run for run in runs if run["status"] not in UNFINISHED]
    return bool(finished) and all(run.get("converged_epoch") for run in finished)


def mean_number(runs: Sequence[Run], field: str) -> str:
    values = [value for run in runs if (value := number(run, field)) is not None]
    return f"{statistics.fmean(values):,.0f}" if values else "–"


def versus_verdict(reference: Sequence[Run], other: Sequence[Run]) -> str:
    """The verdict on ``reference − other`` at each one's own rate, naming the side(s)
    whose validation accuracy had not converged within the epochs on some seed, or that
    a run diverged."""
    diverged = [run for run in (*reference, *other) if run["status"] == "diverged"]
    if diverged:
        return f"diverged ({len(diverged)} run(s) of {len(reference) + len(other)})"
    ours = seed_values(reference, "last_mean_accuracy")
    theirs = seed_values(other, "last_mean_accuracy")
    classes = next(
        (int(value) for run in (*reference, *other) if (value := number(run, "classes"))), None
    )
    judged = verdict(
        seed_difference(reference, other, "last_mean_accuracy"),
        statistics.fmean(ours.values()) if ours else None,
        statistics.fmean(theirs.values()) if theirs else None,
        classes,
    )
    text = str(dataclasses.replace(judged, regime=OWN_RATES))
    unconverged = [runs[0]["column"] for runs in (reference, other) if not all_converged(runs)]
    if unconverged:
        text += f"; {' and '.join(unconverged)} not converged on every seed"
    else:
        text += "; both converged"
    return text


def versus_lines(
    runs: Sequence[Run],
    reference: str,
    paper: Mapping[tuple[str, str], str] | None = None,
) -> list[list[str]]:
    """One line per row and other column of a grid's ``results.csv`` rows (``runs``):
    ``reference`` (a column's folder name) against it, paired by seed.

    Parameters
    ----------
    runs : sequence of mapping
        The rows of the grid's ``results.csv``.
    reference : str
        The folder name of the reference column (``stratify``).
    paper : mapping, optional
        ``(row key, column key)`` -> the paper's figure.
    """
    paper = paper or {}
    groups: dict[tuple[str, str], list[Run]] = {}
    for run in runs:
        groups.setdefault((row_key(run), column_key(run)), []).append(run)
    lines = []
    for (row, column), other in groups.items():
        ours = groups.get((row, reference))
        if column == reference or not ours:
            continue
        # the reference's figures over this pair's seeds: where the reference ran more
        # seeds for another pair (the sequential design), its mean would not be the one
        # the difference subtracts from
        seeds = {run["seed"] for run in other}
        ours = [run for run in ours if run["seed"] in seeds]
        difference = seed_difference(ours, other, "last_mean_accuracy")
        lines.append(
            [
                other[0]["row"],
                other[0]["column"],
                mean_text(seed_values(ours, "last_mean_accuracy")),
                mean_text(seed_values(other, "last_mean_accuracy")),
                signed_points(difference),
                versus_verdict(ours, other),
                f"{converged_text(ours)} / {converged_text(other)}",
                f"{mean_text(seed_values(ours, 'final_accuracy'))} / "
                f"{mean_text(seed_values(other, 'final_accuracy'))}",
                f"{mean_text(seed_values(ours, 'best_accuracy'))} / "
                f"{mean_text(seed_values(other, 'best_accuracy'))}",
                f"{paper.get((row, reference), '–')} / {paper.get((row, column), '–')}",
                f"{mean_number(ours, 'sample_gradients_per_round')} / "
                f"{mean_number(other, 'sample_gradients_per_round')}",
                f"{mean_number(ours, 'transfers_per_epoch')} / "
                f"{mean_number(other, 'transfers_per_epoch')}",
            ]
        )
    return lines


def versus_counts(lines: Sequence[Sequence[str]]) -> str:
    """``3 ahead, 1 behind, 0 level, 1 inconclusive, 0 diverged``: the verdicts counted."""
    column = VERSUS_HEADER.index("verdict")
    words = [line[column].split(" ", 1)[0] for line in lines]
    return ", ".join(f"{words.count(word)} {word}" for word in (*VERDICTS, "diverged"))


def versus_markdown(
    runs: Sequence[Run], reference: str, paper: Mapping[tuple[str, str], str] | None = None
) -> str:
    """The comparison as a grid's ``results.md`` and the docs show it: what it is, the
    table with the reference column named, and the verdicts counted.

    Parameters
    ----------
    runs : sequence of mapping
        The rows of the grid's ``results.csv``.
    reference : str
        The folder name of the reference column.
    paper : mapping, optional
        ``(row key, column key)`` -> the paper's figure.
    """
    lines = versus_lines(runs, reference, paper)
    label = next((run["column"] for run in runs if column_key(run) == reference), reference)
    header = [name.replace("reference", label) for name in VERSUS_HEADER]
    if not paper:  # a grid without the paper's figures shows no column of dashes
        column = VERSUS_HEADER.index("paper: reference / other")
        header.pop(column)
        lines = [line[:column] + line[column + 1 :] for line in lines]
    return (
        f"{label} − each other column, paired by seed, each method at its own rate (the "
        f"difference of the last-rounds means with its 95% t-interval over the seeds, "
        f"Stein's where the two-stage design added seeds; verdicts as in the paired "
        f"tables). Converged: the seeds whose validation accuracy converged by the plateau "
        f"rule within the epochs run, and the epochs where it did:\n\n"
        f"{markdown_table(header, lines)}\nVerdicts: {versus_counts(lines)}.\n"
    )
