"""A run's accuracy summarised without choosing an epoch on the test set.

"Best test accuracy over the epochs" picks the epoch on the test set itself, which
flatters the runs that swing most between rounds. The measures here do not: the final
epoch's accuracy, the mean (± sample standard deviation) over the last rounds, and, where
a validation split is held out, the test accuracy at the epoch of the best *validation*
accuracy (docs/architecture.md, "Run folder"). Pure functions over per-epoch values, so
the run summary, the grid tables and the tests compute them the same way.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stratify.errors import ConfigError

#: the last-rounds window: this share of the epochs run ...
LAST_SHARE = 0.1
#: ... and never fewer than this many (all of them in a shorter run)
LAST_MINIMUM = 3


def last_window(epochs: int) -> int:
    """How many final epochs the last-rounds mean covers: ``max(3, ⌈0.1 · epochs⌉)``,
    at most ``epochs`` (``last_window(30) == 3``, ``last_window(200) == 20``)."""
    if epochs <= 0:
        return 0
    return min(epochs, max(LAST_MINIMUM, math.ceil(LAST_SHARE * epochs - 1e-9)))


@dataclass(frozen=True)
class LastRounds:
    """Mean and sample standard deviation of a value over a run's last rounds.

    Parameters
    ----------
    mean, std : float
        Over the window (``std`` is 0 for a window of one).
    rounds : int
        The window's length, :func:`last_window` of the epochs given.
    """

    mean: float
    std: float
    rounds: int


def last_rounds(values: Sequence[float]) -> LastRounds | None:
    """:class:`LastRounds` of the last :func:`last_window` values; ``None`` for none."""
    window = list(values[len(values) - last_window(len(values)) :])
    if not window:
        return None
    std = statistics.stdev(window) if len(window) > 1 else 0.0
    return LastRounds(statistics.fmean(window), std, len(window))


@dataclass(frozen=True)
class ValidationChoice:
    """The epoch chosen on the validation split and the test accuracy there.

    Parameters
    ----------
    epoch : int
        The epoch of the best validation accuracy (the first, on ties).
    validation_accuracy : float
        That best validation accuracy.
    test_accuracy : float or None
        The test accuracy of the same epoch (``None`` where the record has none).
    """

    epoch: int
    validation_accuracy: float
    test_accuracy: float | None


def best_on_validation(records: Sequence[Mapping[str, Any]]) -> ValidationChoice | None:
    """The epoch with the best ``validation_accuracy`` among ``records`` (dicts of one
    epoch each, as in ``metrics.jsonl``), the first on ties; ``None`` when no record has a
    validation accuracy. The test accuracy is only read at the chosen epoch."""
    scored = [record for record in records if record.get("validation_accuracy") is not None]
    if not scored:
        return None
    best = max(scored, key=lambda record: record["validation_accuracy"])
    return ValidationChoice(
        int(best["epoch"]), float(best["validation_accuracy"]), best.get("test_accuracy")
    )


def accuracy_summary(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The accuracy entries of a run's summary, from its per-epoch records (dicts).

    ``best_accuracy``/``best_epoch`` (chosen on test, kept for comparison with papers
    that report it), ``final_accuracy``, ``last_mean_accuracy`` ± ``last_std_accuracy``
    over ``last_rounds`` epochs, the same for the worst-group accuracy where the data has
    attributes, and, with a validation split, ``best_val_epoch``,
    ``best_validation_accuracy``, ``test_accuracy_at_best_val`` and
    ``last_mean_validation_accuracy`` (over the same last rounds as the test
    accuracy's). Entries that cannot be computed (no epoch yet, no attributes, no
    validation split) are ``None``.
    """
    accuracies = [float(record["test_accuracy"]) for record in records]
    best = max(records, key=lambda record: record["test_accuracy"], default=None)
    last = last_rounds(accuracies)
    groups = [record.get("worst_group_accuracy") for record in records]
    known = [value for value in groups if value is not None]
    last_groups = last_rounds(known) if len(known) == len(groups) else None
    choice = best_on_validation(records)
    validation = [record.get("validation_accuracy") for record in records]
    measured = [float(value) for value in validation if value is not None]
    last_validation = last_rounds(measured) if len(measured) == len(validation) else None
    return {
        "best_accuracy": None if best is None else best["test_accuracy"],
        "best_epoch": None if best is None else best["epoch"],
        "final_accuracy": accuracies[-1] if accuracies else None,
        "last_rounds": None if last is None else last.rounds,
        "last_mean_accuracy": None if last is None else last.mean,
        "last_std_accuracy": None if last is None else last.std,
        "best_worst_group_accuracy": max(known) if known else None,
        "final_worst_group_accuracy": groups[-1] if groups else None,
        "last_mean_worst_group_accuracy": None if last_groups is None else last_groups.mean,
        "last_std_worst_group_accuracy": None if last_groups is None else last_groups.std,
        "best_val_epoch": None if choice is None else choice.epoch,
        "best_validation_accuracy": None if choice is None else choice.validation_accuracy,
        "test_accuracy_at_best_val": None if choice is None else choice.test_accuracy,
        "last_mean_validation_accuracy": None if last_validation is None else last_validation.mean,
    }


# -- the plateau budget -----------------------------------------------------------------

#: an accuracy within this many points of chance (100 / classes) tells nothing apart: two
#: such runs get no verdict, and a run there has not plateaued, it has not started
NEAR_CHANCE_POINTS = 5.0


@dataclass(frozen=True)
class PlateauRule:
    """How long a run goes on: until its validation accuracy has converged (a run with
    ``--stop-on-plateau``; in a paired grid, the comparator's, which sets its pair's rounds).

    A run has converged after round ``r`` (``minimum_rounds ≤ r``) when, with ``w =
    max(minimum_window, ceil(window · r))`` (the last 10% of the rounds, at least 10; a
    run is undecided before ``2 · w`` rounds), both hold:

    - *patience*: its best validation accuracy over the last ``w`` rounds is less than
      ``gain_points`` above its best over every round before them (no new best for ``w``
      rounds), and
    - *near its best*: the median of its last ``w`` rounds, and the mean of the last
      rounds a table reports (:func:`last_rounds`), are both within ``margin_points`` of
      its best over all ``r`` rounds.

    At ``cap`` rounds it stops in any case. With ``chance`` given, a last window whose
    median is within :data:`NEAR_CHANCE_POINTS` of it has not converged: a run that has
    not left chance yet goes on (on `digits`, FedAvgM with momentum at a small rate stays
    at chance for 30–60 rounds and then climbs to 97%).

    The second condition is what the earlier rule (two windows' medians gaining less than
    half a point) lacked: a declining or collapsing run gains nothing either, and it
    stopped there; 23 of 133 `mnist-10k` comparators stopped that way ended more than 10
    points below their own best. A declining run, or one swinging by tens of points, is
    now not converged and goes on to the cap; a single lucky round keeps a run going
    (the best it set must be within ``margin_points`` of the median) rather than
    stopping it early. The last-rounds mean is asked too because the median alone let a
    run stop in a swing: 4 of 150 `digits` comparators stopped with seven of their ten
    last rounds near the best and the last three, the rounds a table reports, 5.0–32.2
    points below it (docs/architecture.md, "Reproducing the papers").

    Parameters
    ----------
    minimum_rounds : int
        R_min: the rounds every run goes at least.
    cap : int
        The most rounds a run goes.
    gain_points : float, default 0.5
        A new best less than this many points above the best before the window is no
        improvement.
    margin_points : float, default 2.0
        How far, in points, the last window's median and the last-rounds mean may sit
        below the run's best.
    window : float, default 0.1
        The share of the rounds run so far that patience and the median look back over.
    minimum_window : int, default 10
        The fewest rounds of that window.
    chance : float, optional
        The chance accuracy (``1 / classes``) as a fraction; ``None``: not judged.
    """

    minimum_rounds: int
    cap: int
    gain_points: float = 0.5
    margin_points: float = 2.0
    window: float = 0.10
    minimum_window: int = 10
    chance: float | None = None

    def __post_init__(self) -> None:
        if self.minimum_rounds < 1 or self.cap < self.minimum_rounds:
            raise ConfigError(
                f"the plateau rule needs 1 ≤ R_min ≤ cap, got R_min {self.minimum_rounds} "
                f"and cap {self.cap}"
            )
        if not (
            self.gain_points > 0
            and self.margin_points > 0
            and 0 < self.window <= 1
            and self.minimum_window >= 1
        ):
            raise ConfigError(
                f"the plateau rule needs a positive gain and margin, a window in (0, 1] and "
                f"a minimum window of at least 1, got {self.gain_points}, "
                f"{self.margin_points}, {self.window} and {self.minimum_window}"
            )

    def window_rounds(self, rounds: int) -> int:
        """``w``: the last rounds of ``rounds`` that patience and the median look at."""
        return max(self.minimum_window, math.ceil(self.window * rounds))

    def converged(self, accuracies: Sequence[float]) -> bool:
        """Whether a run with these validation accuracies (round 1 first, all of them
        run so far) has converged after its last round; ``minimum_rounds`` and ``cap``
        aside."""
        rounds = len(accuracies)
        window = self.window_rounds(rounds)
        if rounds < 2 * window:
            return False
        best_before = max(accuracies[: rounds - window])
        best = max(best_before, max(accuracies[rounds - window :]))
        median = statistics.median(accuracies[rounds - window :])
        reported = last_rounds(accuracies)
        lowest = median if reported is None else min(median, reported.mean)
        started = self.chance is None or 100 * (median - self.chance) > NEAR_CHANCE_POINTS
        patient = 100 * (best - best_before) < self.gain_points
        return started and patient and 100 * (best - lowest) <= self.margin_points


@dataclass(frozen=True)
class PlateauBudget:
    """The rounds a run went and why, with the rule's bounds (all recorded).

    Parameters
    ----------
    rounds : int
        Rounds run.
    reason : {"plateau", "cap"}
        Whether the comparator plateaued or the cap stopped it.
    minimum_rounds, cap : int
        The rule's R_min and cap.
    """

    rounds: int
    reason: str
    minimum_rounds: int
    cap: int


def plateau_budget(accuracies: Sequence[float], rule: PlateauRule) -> PlateauBudget | None:
    """The rounds a run goes under ``rule``, from its validation accuracy after each
    round so far (fractions, round 1 first); ``None`` while undecided.

    Parameters
    ----------
    accuracies : sequence of float
        The validation accuracy after rounds 1, 2, …
    rule : PlateauRule
        R_min, the cap, the gain and the window.
    """
    for rounds in range(rule.minimum_rounds, min(len(accuracies), rule.cap) + 1):
        if rule.converged(accuracies[:rounds]):
            return PlateauBudget(rounds, "plateau", rule.minimum_rounds, rule.cap)
    if len(accuracies) >= rule.cap:
        return PlateauBudget(rule.cap, "cap", rule.minimum_rounds, rule.cap)
    return None
