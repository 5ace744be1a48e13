"""Each method's default learning rate per (dataset family, mode), read from a ``defaults``
grid's results (docs/architecture.md, "Default learning rates").

The ``defaults`` grids (:mod:`stratify.reproduce.grids`) run every method and mode at
every candidate rate on a validation split; their ``results.csv`` (one row per run),
committed as ``docs/results/defaults-<family>.csv``, is what this module reads. A
candidate's score is the mean over seeds of each run's last-rounds validation accuracy;
a candidate with a run that stopped early (a non-finite loss) ranks below every
candidate whose runs all finished. The *best* candidate has the highest score; the
*rule's* rate is the method's paper's rate where its paper fixes one and its score is
within :data:`TOLERANCE` of the best, else the best. Each method declares the rule's
rate on its card (``rates.tuned``); the test set is never read to choose.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from stratify.algorithms import build_strategy, method_label
from stratify.config import TrainConfig, resolve_lr
from stratify.data.datasets import dataset_family
from stratify.errors import ConfigError, CorruptRunError
from stratify.method import informative_epochs
from stratify.reproduce.results import (
    BASE_FIELDS,
    INTEGER_FIELDS,
    NUMBER_FIELDS,
    markdown_table,
)
from stratify.runfiles import read_text

#: how far (in validation accuracy, a share) a method's default may score below its best
#: candidate; a paper's rate further below is replaced by the best
TOLERANCE = 0.02


@dataclass(frozen=True)
class Candidate:
    """One candidate rate of a method and mode: its runs' last-rounds validation and test
    accuracies (one per seed) and whether every run finished."""

    lr: float
    validation: tuple[float, ...]
    test: tuple[float, ...]
    finished: bool

    @property
    def score(self) -> float:
        """The mean over seeds of the last-rounds validation accuracy."""
        return statistics.fmean(self.validation)

    def rank_key(self) -> tuple[bool, float]:
        return (self.finished, self.score)


@dataclass(frozen=True)
class DefaultChoice:
    """A method's candidates on a (family, mode), its paper's rate and the rule's rate.

    Parameters
    ----------
    algorithm, family, dataset, mode : str
        The method, the dataset family, the dataset the grid ran on, the mode.
    candidates : tuple of Candidate
        Ascending by rate.
    paper_lr : float, optional
        The rate its paper fixes there (``None``: none).
    """

    algorithm: str
    family: str
    dataset: str
    mode: str
    candidates: tuple[Candidate, ...]
    paper_lr: float | None

    @property
    def best(self) -> Candidate:
        return max(self.candidates, key=Candidate.rank_key)

    def candidate(self, lr: float) -> Candidate | None:
        return next((c for c in self.candidates if abs(c.lr - lr) <= 1e-12 * lr), None)

    def within_tolerance(self, lr: float) -> bool:
        """Whether rate ``lr`` is a candidate that finished and scores within
        :data:`TOLERANCE` of the best."""
        found = self.candidate(lr)
        return (
            found is not None
            and found.finished
            and found.score >= self.best.score - TOLERANCE - 1e-12
        )

    @property
    def rule_lr(self) -> float:
        """The paper's rate where it is within :data:`TOLERANCE` of the best, else the
        best candidate's."""
        if self.paper_lr is not None and self.within_tolerance(self.paper_lr):
            return self.paper_lr
        return self.best.lr

    @property
    def declared_lr(self) -> float:
        """The rate a run of the method takes here without ``--lr`` (its class's
        declarations, :func:`~stratify.config.resolve_lr`)."""
        strategy = build_strategy(self.algorithm, {}, self.mode)
        # as long a run as the method can make (FedBSS refuses one shorter than its warm-up)
        config = TrainConfig(
            algorithm=self.algorithm,
            dataset=self.dataset,
            mode=self.mode,
            epochs=informative_epochs(strategy),
            secure=False,
        )
        return resolve_lr(config, strategy)


@dataclass(frozen=True)
class ResultsColumns:
    """What a results file must hold for its table to be made from it.

    Parameters
    ----------
    required : tuple of str
        The columns its header must name.
    integers : frozenset of str
        The columns whose fields are whole numbers (or empty).
    numbers : frozenset of str
        The columns whose fields are finite numbers (or empty).
    filled : frozenset of str
        The columns whose fields may not be empty.
    """

    required: tuple[str, ...] = ()
    integers: frozenset[str] = frozenset()
    numbers: frozenset[str] = frozenset()
    filled: frozenset[str] = frozenset()


#: a grid's ``results.csv`` (and its committed copies)
GRID_COLUMNS = ResultsColumns(BASE_FIELDS, INTEGER_FIELDS, NUMBER_FIELDS)


def read_results(path: str | Path, columns: ResultsColumns = GRID_COLUMNS) -> list[dict[str, str]]:
    """The rows of a grid's ``results.csv`` (or its committed copy), checked against
    ``columns`` before any table is made of them.

    The file is read as every file a user may have replaced is
    (:func:`~stratify.runfiles.read_text`: a FIFO or a device is refused without waiting
    on it), and a file no grid writes is one line naming the line and the column, so
    ``stratify tables`` never renders a NaN nor fails inside a renderer.

    Parameters
    ----------
    path : str or Path
        The CSV file.
    columns : ResultsColumns
        What it must hold (default: a grid's columns).

    Raises
    ------
    CorruptRunError
        Not a regular UTF-8 file; not CSV (a NUL, a field over the csv module's 128 KiB);
        no header or no row; a row of another length than the header; a required column
        missing; text where a number belongs, a NaN or an infinite number; an empty
        field where one is required.
    ConfigError
        The file cannot be opened (missing, permissions).
    """
    try:
        text = read_text(Path(path))
    except OSError as error:
        raise ConfigError(f"cannot read results file {path}: {error.strerror}") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        lines = list(reader)
    except csv.Error as error:
        raise CorruptRunError(f"{path} line {reader.line_num} is not CSV ({error})") from None
    if not lines:
        raise CorruptRunError(f"{path} is empty: a results file has a header and a row per run")
    header, body = lines[0], lines[1:]
    if not body:
        raise CorruptRunError(f"{path} holds a header and no run")
    missing = [name for name in columns.required if name not in header]
    if missing:
        raise CorruptRunError(f"{path} has no column {', '.join(missing[:3])}")
    rows = []
    for number, fields in enumerate(body, start=2):
        if len(fields) != len(header):
            raise CorruptRunError(
                f"{path} line {number} has {len(fields)} fields, its header {len(header)}"
            )
        row = dict(zip(header, fields))
        for name, value in row.items():
            problem = field_problem(name, value, columns)
            if problem is not None:
                raise CorruptRunError(f"{path} line {number}, column {name}: {problem}")
        rows.append(row)
    return rows


def field_problem(name: str, value: str, columns: ResultsColumns) -> str | None:
    """What is wrong with ``value`` in column ``name`` of a results file, or ``None``."""
    if not value:
        return "empty" if name in columns.filled else None
    if name in columns.integers:
        try:
            int(value)
        except ValueError:  # text, a fraction, 1e999, more digits than Python converts
            return f"{value!r:.40} is not a whole number"
    elif name in columns.numbers:
        try:
            finite = math.isfinite(float(value))
        except ValueError:
            return f"{value!r:.40} is not a number"
        if not finite:
            return f"{value!r:.40} is not a finite number"
    return None


def score(run: Mapping[str, str], key: str) -> float:
    """``run``'s accuracy ``key``; 0 for a run stopped before its first epoch ended."""
    return float(run[key]) if run[key] else 0.0


def default_choices(rows: Iterable[Mapping[str, str]]) -> list[DefaultChoice]:
    """One :class:`DefaultChoice` per method and mode of a ``defaults`` grid's rows, in the
    order they first appear.

    Raises
    ------
    ConfigError
        A finished run without a validation accuracy (a grid run without a validation
        split, or a file that is not a ``defaults`` grid's).
    """
    runs: dict[tuple[str, str, str], dict[float, list[Mapping[str, str]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for row in rows:
        if row.get("status") == "finished" and not row.get("last_mean_validation_accuracy"):
            raise ConfigError(
                f"run {row.get('run_dir', '?')}: no validation accuracy; the defaults are "
                "chosen from a defaults grid's results.csv"
            )
        key = (row["algorithm"], row["dataset"], row["mode"])
        runs[key][float(row["lr"])].append(row)
    choices = []
    for (algorithm, dataset, mode), by_lr in runs.items():
        candidates = tuple(
            Candidate(
                lr,
                tuple(score(run, "last_mean_validation_accuracy") for run in seeds),
                tuple(score(run, "last_mean_accuracy") for run in seeds),
                all(run["status"] == "finished" for run in seeds),
            )
            for lr, seeds in sorted(by_lr.items())
        )
        paper = build_strategy(algorithm, {}, mode).paper_lr(mode, dataset)
        choices.append(
            DefaultChoice(algorithm, dataset_family(dataset), dataset, mode, candidates, paper)
        )
    return choices


def percent(value: float) -> str:
    return f"{100 * value:.1f}"


def defaults_table(rows: Sequence[Mapping[str, str]]) -> str:
    """The markdown table of a ``defaults`` grid's results: per method and mode, every
    candidate's validation score (mean over seeds, %), the best, the paper's rate, the
    default a run takes and how far below the best it scores.

    Parameters
    ----------
    rows : sequence of mapping
        The rows of the grid's ``results.csv``.
    """
    choices = default_choices(rows)
    rates = sorted({c.lr for choice in choices for c in choice.candidates})
    header = [
        "method",
        "mode",
        *(f"lr {lr:g}" for lr in rates),
        "best",
        "paper's",
        "default",
        "default − best, points",
        "test at default, %",
    ]
    lines = []
    for choice in choices:
        declared = choice.declared_lr
        cells = []
        for lr in rates:
            found = choice.candidate(lr)
            if found is None:
                cells.append("–")
                continue
            text = percent(found.score) + ("" if found.finished else " (diverged)")
            cells.append(f"**{text}**" if lr == declared else text)
        at_default = choice.candidate(declared)
        lines.append(
            [
                method_label(choice.algorithm),
                choice.mode,
                *cells,
                f"{choice.best.lr:g}",
                "–" if choice.paper_lr is None else f"{choice.paper_lr:g}",
                f"{declared:g}",
                "not a candidate"
                if at_default is None
                else f"{100 * (at_default.score - choice.best.score):+.1f}".replace("-", "−"),
                "–" if at_default is None else percent(statistics.fmean(at_default.test)),
            ]
        )
    return markdown_table(header, lines)
