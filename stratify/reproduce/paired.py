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
