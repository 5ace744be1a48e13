"""More seeds where the seeds limit a verdict: the two-stage design of
``stratify reproduce --seeds-until-verdict MAX``.

The grid first runs the seeds given (stage 1). Each pair whose verdict is inconclusive
because its interval is wider than the effect (not a pair at chance, nor one without a
verdict) then gets the number of seeds in all that
:func:`~stratify.reproduce.paired.seeds_for_verdict` computes from the first stage's
spread, at most MAX, once (stage 2); its interval is then Stein's
(:func:`~stratify.reproduce.paired.stein_difference`). A pair is a method and its matched
comparator in a paired grid, or the grid's reference column and another column of the
same row where the grid names one (``Grid.reference``: Table I's Stratify)
(docs/architecture.md, "Reproducing the papers").
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import PurePath

from stratify.reproduce.paired import NEAR_CHANCE, paired_difference, seeds_for_verdict, verdict
from stratify.reproduce.results import (
    Run,
    at_own_rate,
    column_key,
    number,
    seed_values,
    unjudged,
)


def row_key(run: Run) -> str:
    """The folder name of ``run``'s row (``cells/ROW/COLUMN/seed-N``)."""
    return PurePath(run["run_dir"]).parent.parent.name


def seeds_needed(first: Sequence[Run], other: Sequence[Run], cap: int) -> int:
    """The seeds in all of the pair ``first − other`` (their first-stage runs), or the
    seeds it has where more would not change what it says."""
    ours = seed_values(first, "last_mean_accuracy")
    theirs = seed_values(other, "last_mean_accuracy")
    common = sorted(set(ours) & set(theirs))
    if len(common) < 2:
        return len(common)
    classes = next((int(value) for run in (*first, *other) if (value := number(run, "classes"))), 0)
    judged = verdict(
        paired_difference(ours, theirs),
        statistics.fmean(ours.values()),
        statistics.fmean(theirs.values()),
        classes or None,
    )
    if judged.reason == NEAR_CHANCE:
        return len(common)
    return seeds_for_verdict([ours[seed] - theirs[seed] for seed in common], cap)


def extension(runs: Sequence[Run], cap: int, reference: str | None = None) -> dict[str, int]:
    """Group (``ROW/COLUMN`` folder names) -> its seeds in all, for every group whose
    pair needs more seeds than its first stage has, from a grid's ``results.csv`` rows
    of the first stage (``runs``).

    Parameters
    ----------
    runs : sequence of mapping
        The grid's ``results.csv`` rows; only stage-1 runs are read.
    cap : int
        The most seeds of a pair (``--seeds-until-verdict``).
    reference : str, optional
        The reference column's folder name, for a grid compared against one column
        (Table I); a paired grid's pairs are its methods and their comparators.
    """
    groups: dict[tuple[str, str], list[Run]] = {}
    for run in runs:
        if run.get("stage", "1") == "1":
            groups.setdefault((row_key(run), column_key(run)), []).append(run)
    plan: dict[str, int] = {}

    def extend(row: str, column: str, total: int) -> None:
        if total > len(groups[(row, column)]):
            plan[f"{row}/{column}"] = max(plan.get(f"{row}/{column}", 0), total)

    for (row, column), group in groups.items():
        if reference is not None:
            ours = groups.get((row, reference))
            if column == reference or ours is None:
                continue
            total = seeds_needed(ours, group, cap)
            extend(row, column, total)
            extend(row, reference, total)
        elif group[0].get("role") == "method" and not at_own_rate(group[0]):
            # the design adds seeds to the matched pairs, those at the comparator's rate
            comparator = groups.get((row, group[0]["comparator"]), [])
            if comparator and unjudged(group, comparator) is None:
                extend(row, column, seeds_needed(group, comparator, cap))
    return plan
