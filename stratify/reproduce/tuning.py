"""Fair tuning: every method's learning rate picked the same way, never on the test set.

For each row and column of a grid, the first seed's cell is run once per candidate rate
(the method's default times each factor) on a validation split held out of the training
samples (``TrainConfig.validation``); the rate with the best validation accuracy is then
used by that row and column's cells of every seed. Only the validation accuracy is read:
a tuning run also records its test accuracy, like every run, but the choice never looks
at it. A tuning run is at least as long as the method needs for its own mechanism to act
(:meth:`~stratify.method.Strategy.informative_epochs`: FedBSS's warm-up + 2), and runs
with the final runs' options, so FedBSS tunes with the warm-up it is then run with
(docs/architecture.md, "Reproducing the papers").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from stratify.algorithms import build_strategy
from stratify.config import TrainConfig, default_lr
from stratify.errors import ConfigError, CorruptRunError
from stratify.parallel import COMPLETE, RunOutcome, RunSpec
from stratify.reproduce.grids import Cell
from stratify.runfiles import read_records
from stratify.validation import check_positive, check_positive_int, check_share

#: the candidate rates, as multiples of each method's default
DEFAULT_FACTORS = (0.3, 1.0, 3.0)
DEFAULT_VALIDATION = 0.1


@dataclass(frozen=True)
class Tuning:
    """How learning rates are tuned.

    Parameters
    ----------
    factors : tuple of float
        Candidate rates as multiples of each method's default rate.
    validation : float
        Share of every label's training samples held out to score the candidates.
    epochs : int, optional
        Epochs of a tuning run (default: the cell's).
    """

    factors: tuple[float, ...] = DEFAULT_FACTORS
    validation: float = DEFAULT_VALIDATION
    epochs: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.factors, (list, tuple)):
            raise ConfigError(f"--tune-factors takes a list of factors, got {self.factors!r:.60}")
        if not self.factors:
            raise ConfigError("--tune-factors: give at least one factor")
        object.__setattr__(
            self, "factors", tuple(check_positive(f, "--tune-factors") for f in self.factors)
        )
        check_share(self.validation, "--validation")
        if self.validation == 0:
            check_positive(self.validation, "--validation")
        if self.epochs is not None:
            check_positive_int(self.epochs, "--tune-epochs")


@dataclass(frozen=True)
class Trial:
    """One candidate rate's validation result."""

    lr: float
    accuracy: float | None
    epoch: int | None
    status: str


@dataclass(frozen=True)
class Choice:
    """The rate chosen for a row and column, and the trials it was chosen from."""

    group: str
    default: float
    lr: float
    trials: tuple[Trial, ...]


def best_validation(records: Sequence[dict]) -> tuple[float | None, int | None]:
    """The best validation accuracy of a tuning run's records and its epoch (the first, on
    ties). Records written before runs kept their test set measured the validation split
    as ``test_accuracy`` and have no ``validation_accuracy``: that value is read then."""
    scored = [
        (record.get("validation_accuracy", record.get("test_accuracy")), record["epoch"])
        for record in records
    ]
    scored = [(accuracy, epoch) for accuracy, epoch in scored if accuracy is not None]
    if not scored:
        return None, None
    accuracy, epoch = max(scored, key=lambda entry: (entry[0], -entry[1]))
    return accuracy, epoch


def tuning_epochs(config: TrainConfig, requested: int | None) -> int:
    """A tuning run's epochs: ``requested`` (default: the cell's), but never fewer than the
    method's :meth:`~stratify.method.Strategy.informative_epochs`."""
    strategy = build_strategy(config.algorithm, config.options, config.mode)
    return max(requested or config.epochs, strategy.informative_epochs())


def method_default_lr(config: TrainConfig) -> float:
    """The rate ``config``'s method uses when none is given: its paper's, else the
    dataset's default."""
    strategy = build_strategy(config.algorithm, config.options, config.mode)
    return strategy.lr_for(config.mode, config.dataset) or default_lr(config.dataset, config.mode)


def candidates(default: float, factors: Sequence[float]) -> tuple[float, ...]:
    """``default`` times each factor, to 6 significant digits, ascending, without repeats."""
    return tuple(sorted({float(f"{default * factor:.6g}") for factor in factors}))


def choose(trials: Sequence[Trial], default: float) -> float:
    """The rate of the best validation accuracy.

    Trials that finished every epoch come first; only when none did, the diverged ones
    count with their best epoch before diverging. Ties go to the rate nearest the
    default (on a log scale), then the smaller.
    """
    scored = [trial for trial in trials if trial.accuracy is not None]
    complete = [trial for trial in scored if trial.status in COMPLETE]
    pool = complete or scored
    if not pool:
        return default
    best = min(
        pool,
        key=lambda trial: (
            -(trial.accuracy or 0.0),
            abs(math.log(trial.lr / default)),
            trial.lr,
        ),
    )
    return best.lr


def tuning_cells(cells: Sequence[Cell]) -> dict[str, Cell]:
    """Per row and column, the cell tuning runs for: that of the first seed given."""
    first: dict[str, Cell] = {}
    for cell in cells:
        first.setdefault(cell.group, cell)
    return first


def tuning_specs(cells: Sequence[Cell], tuning: Tuning, out: str | Path) -> list[RunSpec]:
    """One run per row, column and candidate rate, on the validation split, in
    ``out/tune/<row>/<column>/lr-<rate>``."""
    specs = []
    for group, cell in tuning_cells(cells).items():
        default = method_default_lr(cell.config)
        for lr in candidates(default, tuning.factors):
            name = f"tune/{group}/lr-{lr:g}"
            config = replace(
                cell.config,
                lr=lr,
                validation=tuning.validation,
                epochs=tuning_epochs(cell.config, tuning.epochs),
                out=str(Path(out) / name),
            )
            specs.append(RunSpec(name, config))
    return specs


def choices(
    cells: Sequence[Cell],
    specs: Sequence[RunSpec],
    outcomes: dict[str, RunOutcome],
) -> dict[str, Choice]:
    """The rate chosen per row and column, from the tuning runs' folders."""
    chosen = {}
    for group, cell in tuning_cells(cells).items():
        default = method_default_lr(cell.config)
        trials = []
        for spec in specs:
            if not spec.name.startswith(f"tune/{group}/"):
                continue
            outcome = outcomes.get(spec.name)
            status = outcome.status if outcome is not None else "missing"
            try:
                records = read_records(str(spec.config.out))[: spec.config.epochs]
            except CorruptRunError:
                records, status = [], "corrupt"
            accuracy, epoch = best_validation(records)
            if status not in COMPLETE and len(records) >= spec.config.epochs:
                status = "finished"
            assert spec.config.lr is not None  # tuning runs always name their rate
            trials.append(Trial(spec.config.lr, accuracy, epoch, status))
        chosen[group] = Choice(group, default, choose(trials, default), tuple(trials))
    return chosen


def tuned_cells(cells: Sequence[Cell], chosen: dict[str, Choice]) -> list[Cell]:
    """``cells`` with their row and column's chosen rate."""
    return [replace(cell, config=replace(cell.config, lr=chosen[cell.group].lr)) for cell in cells]
