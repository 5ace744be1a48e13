"""Paired grids: every method against its matched comparator, with the same local training.

The matched comparator of a method (its declared base, run with the method's local
optimizer, local work, clients per round, weighting, rounds and seed) is made by
:mod:`stratify.comparison`. A paired grid derives each comparator's cells from its
method's cells; comparators of several methods that come out the same (FedProx's and
FedAvgM's are both FedAvg with NIID-Bench's local SGD) run once
(:func:`stratify.reproduce.grids.pair_cells`).
The comparison itself is the difference of the two runs' last-rounds mean accuracies,
paired by seed, with a 95% interval over the seeds (:func:`paired_difference`);
:func:`~stratify.comparison.planned_sample_gradients` checks before anything runs that the
two do the same local work (docs/architecture.md, "Reproducing the papers").
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from stratify.comparison import planned_sample_gradients
from stratify.measures import NEAR_CHANCE_POINTS
from stratify.reproduce.grids import Cell

# -- budgets --------------------------------------------------------------------------------


@dataclass(frozen=True)
class PairBudget:
    """A method's and its comparator's planned local work per round, in one row."""

    row: str
    method: str
    comparator: str
    method_sample_gradients: float | None
    comparator_sample_gradients: float | None

    @property
    def equal(self) -> bool:
        return (
            self.method_sample_gradients is not None
            and self.method_sample_gradients == self.comparator_sample_gradients
        )


def pair_budgets(cells: Sequence[Cell]) -> list[PairBudget]:
    """The planned sample-gradients per round of every method and its comparator, for the
    first seed of each row (its partition sets the clients' sizes); the data is loaded
    and partitioned, nothing is trained."""
    from stratify.data.datasets import load_dataset
    from stratify.experiment import partition_clients

    first_seed = min(cell.seed for cell in cells)
    by_group = {(c.row.key, c.column.key): c for c in cells if c.seed == first_seed}
    sizes: dict[str, list[int]] = {}
    budgets = []
    for (row, _), cell in by_group.items():
        if cell.comparator is None:
            continue
        comparator = by_group[(row, cell.comparator)]
        config = cell.config
        key = json.dumps(
            [config.dataset, config.dataset_options, config.partition, config.clients, config.seed],
            default=str,
        )
        if key not in sizes:
            data = load_dataset(
                config.dataset,
                data_dir=config.data_dir,
                device="cpu",
                seed=config.seed,
                **config.dataset_options,
            )
            sizes[key] = [int(n) for n in partition_clients(data, config).client_sizes]
        budgets.append(
            PairBudget(
                cell.row.label,
                cell.column.label,
                comparator.column.label,
                planned_sample_gradients(config, sizes[key]),
                planned_sample_gradients(comparator.config, sizes[key]),
            )
        )
    return budgets


# -- the comparison -------------------------------------------------------------------------

#: the two-sided coverage of the interval on a paired difference
CONFIDENCE = 0.95


@dataclass(frozen=True)
class PairedDifference:
    """Method minus comparator over seeds, paired by seed.

    Parameters
    ----------
    mean : float
        The mean of the per-seed differences.
    half_width : float or None
        Half the 95% interval, ``t(0.975, n − 1) · s / √n`` with ``s`` the sample standard
        deviation of the differences; ``None`` for fewer than two seeds.
    seeds : int
        The seeds both runs have.
    """

    mean: float
    half_width: float | None
    seeds: int

    @property
    def interval(self) -> tuple[float, float] | None:
        if self.half_width is None:
            return None
        return self.mean - self.half_width, self.mean + self.half_width


def t_quantile(probability: float, freedom: int) -> float:
    """The Student-t quantile (scipy's, a dependency of scikit-learn)."""
    from scipy.stats import t  # type: ignore[import-untyped]

    return float(t.ppf(probability, freedom))


def paired_difference(
    method: Mapping[int, float], comparator: Mapping[int, float]
) -> PairedDifference | None:
    """The difference ``method − comparator`` of per-seed values (seed -> value), over the
    seeds both have, with its 95% t-interval; ``None`` without a common seed."""
    seeds = sorted(set(method) & set(comparator))
    if not seeds:
        return None
    differences = [method[seed] - comparator[seed] for seed in seeds]
    mean = statistics.fmean(differences)
    if len(differences) < 2:
        return PairedDifference(mean, None, 1)
    spread = statistics.stdev(differences) / math.sqrt(len(differences))
    half = t_quantile(0.5 + CONFIDENCE / 2, len(differences) - 1) * spread
    return PairedDifference(mean, half, len(differences))


# -- more seeds where the seeds limit the verdict -------------------------------------------


def seeds_for_verdict(differences: Sequence[float], cap: int) -> int:
    """How many seeds in all a pair runs under the two-stage design (Stein's), from the
    per-seed differences of its first stage (fractions).

    A pair whose first-stage interval already gives a verdict, or that has fewer than two
    seeds or no spread, keeps its ``n0`` seeds. Otherwise the total is
    ``n = ⌈(t(0.975, n0 − 1) · s0 / h)²⌉``, at least ``n0`` and at most ``cap``, with
    ``s0`` the first stage's sample standard deviation and ``h`` the half-width aimed
    at: half the larger of the observed mean difference and :data:`LEVEL_POINTS`, so that
    a difference the size of the first stage's mean comes out *ahead* or *behind* and
    one near zero *level*. The number is computed once, from the first stage alone; the
    final interval is :func:`stein_difference` (docs/architecture.md, "Reproducing the
    papers").

    Parameters
    ----------
    differences : sequence of float
        Method − comparator of each first-stage seed.
    cap : int
        The most seeds a pair runs.
    """
    first = len(differences)
    if first < 2:
        return first
    mean, spread = statistics.fmean(differences), statistics.stdev(differences)
    if spread == 0:
        return first
    difference = paired_difference(dict(enumerate(differences)), dict.fromkeys(range(first), 0.0))
    if verdict(difference, None, None, None).word != "inconclusive":
        return first
    target = max(abs(mean), LEVEL_POINTS / 100) / 2
    needed = math.ceil((t_quantile(0.5 + CONFIDENCE / 2, first - 1) * spread / target) ** 2)
    return min(cap, max(first, needed))


def stein_difference(first: Sequence[float], every: Sequence[float]) -> PairedDifference:
    """Stein's two-stage interval: the mean of ``every`` seed's difference ± ``t(0.975,
    n0 − 1) · s0 / √n``, with ``n0`` and ``s0`` the ``first`` stage's seeds and sample
    standard deviation and ``n`` all the seeds. Because ``n`` was computed from ``s0``
    alone, the interval covers the true difference with probability 95% exactly
    (normal differences), where the ordinary t-interval over seeds added on seeing the
    data would not.

    Parameters
    ----------
    first : sequence of float
        The first stage's differences (at least two).
    every : sequence of float
        Every seed's difference, the first stage's included.
    """
    spread = statistics.stdev(first) / math.sqrt(len(every))
    half = t_quantile(0.5 + CONFIDENCE / 2, len(first) - 1) * spread
    return PairedDifference(statistics.fmean(every), half, len(every))


# -- verdicts -------------------------------------------------------------------------------

#: a difference whose whole 95% interval lies within ± this many points is "level"
LEVEL_POINTS = 1.0
#: the verdict words, in the order the tables count them
VERDICTS = ("ahead", "behind", "level", "inconclusive")
#: the rate regime of a verdict between two methods each at its own validated rate (Table
#: I's, and a tuned paired grid's methods at their own rate)
OWN_RATES = "at each one's own rate"
#: the words of a pair that gets no verdict, in the order the tables count them: a run
#: of it diverged (the two ran unequal rounds), its comparator is not the method's
#: matched one, its runs ran unequal rounds otherwise, or its comparator stopped on a
#: plateau far below its own best (the earlier plateau rule stopped declining runs)
UNJUDGED = ("diverged", "unmatched", "unequal", "unconverged")
#: a run that stopped more than this many points below its own best had not converged
CONVERGED_POINTS = 5.0
#: the reasons of an *inconclusive* that no interval could change: nothing was learned
#: that tells the two runs apart
NEAR_CHANCE = "both runs near chance"
NEAR_ZERO_WORST_GROUP = "both runs' worst group near 0"


@dataclass(frozen=True)
class Verdict:
    """What a paired difference says, in words.

    Parameters
    ----------
    word : {"ahead", "behind", "level", "inconclusive"}
        The verdict.
    reason : str
        Why, in a few words (empty where the word says it all).
    regime : str
        At which learning rates the two runs compare ("at the base's rate"), shown after
        the word; empty where the table says it once.
    """

    word: str
    reason: str = ""
    regime: str = ""

    def __str__(self) -> str:
        text = f"{self.word} {self.regime}" if self.regime else self.word
        return f"{text} ({self.reason})" if self.reason else text


def verdict(
    difference: PairedDifference | None,
    method_accuracy: float | None,
    comparator_accuracy: float | None,
    classes: int | None,
    *,
    worst_group: bool = False,
) -> Verdict:
    """The verdict on a method against its matched comparator.

    In this order: *inconclusive* without an interval (fewer than two common seeds), when
    both runs are within :data:`NEAR_CHANCE_POINTS` of chance (``1 / classes``), or, for
    a worst-group accuracy, when both are within as many points of 0 (each gets a whole
    group wrong, so their difference says nothing about the method); *level* when the
    interval lies inside ``± LEVEL_POINTS``; *ahead* or *behind* when it lies above or
    below zero; else *inconclusive*: the interval is wider than the effect (it holds zero
    and reaches beyond ± 1 point).

    Parameters
    ----------
    difference : PairedDifference or None
        Method − comparator over the seeds (accuracies as fractions).
    method_accuracy, comparator_accuracy : float or None
        The two runs' mean accuracies over the seeds, as fractions.
    classes : int or None
        The data's classes, for the chance level; ``None``: not judged.
    worst_group : bool, default False
        Whether the accuracies are worst-group accuracies (the 0 floor is judged too).
    """
    if difference is None or difference.interval is None:
        return Verdict("inconclusive", "fewer than two seeds")
    if method_accuracy is not None and comparator_accuracy is not None:
        accuracies = (method_accuracy, comparator_accuracy)
        if classes and all(
            abs(accuracy - 1.0 / classes) * 100 <= NEAR_CHANCE_POINTS for accuracy in accuracies
        ):
            return Verdict("inconclusive", NEAR_CHANCE)
        if worst_group and all(accuracy * 100 <= NEAR_CHANCE_POINTS for accuracy in accuracies):
            return Verdict("inconclusive", NEAR_ZERO_WORST_GROUP)
    low, high = (100 * end for end in difference.interval)
    if -LEVEL_POINTS <= low and high <= LEVEL_POINTS:
        return Verdict("level")
    if low > 0:
        return Verdict("ahead")
    if high < 0:
        return Verdict("behind")
    return Verdict("inconclusive", "interval wider than the effect")
