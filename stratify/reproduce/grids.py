"""The grids of ``stratify reproduce``: each paper comparison as rows × columns × seeds.

A :class:`Grid` holds the settings its cells share (``values`` for
:class:`~stratify.config.TrainConfig`, ``options`` for the method), its rows (usually the
partitions) and its columns (usually the methods); a row's or a column's values override
the grid's. :func:`plan_cells` expands a grid with the command's :class:`Settings` into
one :class:`Cell` per row, column and seed, each with its own run folder; a paired
column's cells come with their matched comparator's (:func:`pair_cells`)
(docs/architecture.md, "Reproducing the papers").
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stratify.algorithms import ALGORITHMS, build_strategy, method_label, strategy_class
from stratify.backend import DEVICES
from stratify.comparison import matched_config
from stratify.config import TrainConfig
from stratify.data.datasets import dataset_options
from stratify.data.datasets.base import check_options
from stratify.errors import ConfigError
from stratify.method import informative_epochs
from stratify.nn.models import MODELS
from stratify.validation import (
    check_bool,
    check_choice,
    check_path,
    check_positive_int,
    check_seeds,
    check_text,
)

BASELINES = ("fedavg", "fedprox", "scaffold", "sfl")
#: clients of a cell when neither the command nor the grid sets them
DEFAULT_CLIENTS = 10
#: the methods that declare settings of their own papers (the seed-paper methods)
SEED_METHODS = tuple(name for name in ALGORITHMS if strategy_class(name).card.paper.settings)
RESNETS = ("resnet9", "resnet18", "resnet20")


@dataclass(frozen=True)
class Row:
    """One row of a grid's table: its folder name, its label, what it sets, and, where not
    every column belongs in it, the keys of the columns that do (``columns``)."""

    key: str
    label: str
    values: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    columns: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Column:
    """One column: its folder name, its label, what it sets (``algorithm`` at least).

    ``paired``: the method runs beside its matched comparator, the base method with the
    same local training (:mod:`stratify.reproduce.paired`), whose cells are derived from
    this column's; ``comparator_options`` replace the matched comparator's options where a
    paper's own baseline differs from it (``comparator_label`` names that baseline).
    ``own_rate``: a paired method's column that keeps the method's own rate where a tuned
    grid steps the pair at its comparator's (:func:`own_rate_cells`).
    """

    key: str
    label: str
    values: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    paired: bool = False
    comparator_options: dict[str, Any] = field(default_factory=dict)
    comparator_label: str = "matched"
    own_rate: bool = False

    @property
    def algorithm(self) -> str:
        return str(self.values.get("algorithm", "stratify"))


@dataclass(frozen=True)
class Grid:
    """A comparison: shared settings, rows, columns, and what to draw and compare with.

    Parameters
    ----------
    name, description : str
        The grid's name on the command line and one line on what it reproduces.
    values, options : dict
        Settings of every cell (TrainConfig fields, method options); rows and columns
        override them.
    rows, columns : tuple
        The table's rows and columns.
    plots : tuple of str
        ``curves`` (test accuracy per epoch), ``accuracy-vs-c`` (best accuracy over #C),
        ``transfers-vs-chunk`` (transfers per epoch over the chunk size).
    transfers : bool
        Whether the table reports transfers per epoch too.
    paper : dict
        ``(row key, column key)`` -> the paper's figure, shown beside ours.
    paper_source : str
        Where the paper's figures come from (and on what data).
    paper_datasets : tuple of str
        The datasets on which our figures are comparable with the paper's.
    reference : str, optional
        A column (folder name) the table sets against every other column of its row,
        paired by seed (:mod:`stratify.reproduce.versus`; Table I's Stratify).
    """

    name: str
    description: str
    values: dict[str, Any]
    rows: tuple[Row, ...]
    columns: tuple[Column, ...]
    options: dict[str, Any] = field(default_factory=dict)
    plots: tuple[str, ...] = ("curves",)
    transfers: bool = False
    paper: dict[tuple[str, str], str] = field(default_factory=dict)
    paper_source: str = ""
    paper_datasets: tuple[str, ...] = ()
    reference: str | None = None

    @property
    def methods_are_columns(self) -> bool:
        return all("algorithm" in column.values for column in self.columns)

    @property
    def paired(self) -> bool:
        """Whether the grid compares each method with its matched comparator."""
        return any(column.paired for column in self.columns)


def slug(text: str) -> str:
    """A folder name for ``text``: lower case, runs of other characters as one ``-``."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def grid_label(algorithm: str, *notes: str) -> str:
    """``FedBSS (batch, C=1)``: the method's label with ``notes`` and its declared
    :attr:`~stratify.card.Comparison.grid_label`."""
    notes = (*notes, strategy_class(algorithm).card.comparison.grid_label)
    shown = ", ".join(note for note in notes if note)
    return method_label(algorithm) + (f" ({shown})" if shown else "")


def method_column(algorithm: str, **options: Any) -> Column:
    """A method in a comparison grid, with the options it declares for them
    (:attr:`~stratify.card.Comparison.grid_options`) and ``options`` over them."""
    return Column(
        algorithm,
        grid_label(algorithm),
        {"algorithm": algorithm},
        {**strategy_class(algorithm).card.comparison.grid_options, **options},
    )


def schedule_column(algorithm: str, schedule: str) -> Column:
    """A method at another learning-rate schedule than its default, labelled so."""
    return Column(
        f"{algorithm}-{schedule}",
        grid_label(algorithm, schedule),
        {"algorithm": algorithm, "lr_schedule": schedule},
        dict(strategy_class(algorithm).card.comparison.grid_options),
    )


def batch_column(algorithm: str) -> Column:
    """A batch-only method in a single-sample table: run in batch mode, labelled so."""
    return Column(
        algorithm,
        grid_label(algorithm, "batch"),
        {"algorithm": algorithm, "mode": "batch"},
        dict(strategy_class(algorithm).card.comparison.grid_options),
    )


def partition_row(spec: str, label: str) -> Row:
    return Row(slug(spec), label, {"partition": spec})


LABEL_SKEW_ROWS = (
    partition_row("classes:1", "#C=1"),
    partition_row("classes:3", "#C=3"),
    partition_row("classes:5", "#C=5"),
    partition_row("dirichlet:0.5", "Dirichlet(0.5)"),
    partition_row("iid", "IID"),
)

# Stratify paper, Table I, MNIST (single-sample learning, simple CNN, full MNIST)
TABLE1_PAPER = {
    ("classes-1", "fedavg"): "18.71%, E10",
    ("classes-1", "fedprox"): "12.37%, E14",
    ("classes-1", "scaffold"): "17.68%, E30",
    ("classes-1", "sfl"): "15.19%, E29",
    ("classes-1", "stratify"): "98.80%, E4",
    ("classes-3", "fedavg"): "91.67%, E30",
    ("classes-3", "fedprox"): "85.27%, E29",
    ("classes-3", "scaffold"): "91.11%, E18",
    ("classes-3", "sfl"): "72.52%, E30",
    ("classes-3", "stratify"): "99.06%, E5",
    ("classes-5", "fedavg"): "95.42%, E30",
    ("classes-5", "fedprox"): "96.51%, E30",
    ("classes-5", "scaffold"): "92.60%, E24",
    ("classes-5", "sfl"): "89.30%, E28",
    ("classes-5", "stratify"): "98.95%, E5",
    ("dirichlet-0-5", "fedavg"): "97.82%, E30",
    ("dirichlet-0-5", "fedprox"): "97.19%, E30",
    ("dirichlet-0-5", "scaffold"): "98.75%, E27",
    ("dirichlet-0-5", "sfl"): "97.76%, E28",
    ("dirichlet-0-5", "stratify"): "98.94%, E5",
    ("iid", "fedavg"): "98.32%, E30",
    ("iid", "fedprox"): "98.34%, E30",
    ("iid", "scaffold"): "98.71%, E19",
    ("iid", "sfl"): "98.79%, E5",
    ("iid", "stratify"): "98.82%, E5",
}


def selection_row(selection: str, chunk: int | None, mode: str = "single-sample") -> Row:
    """A row of the paper's Table V: "Single-Sample, U, CS5" or "Batch-Data, W"."""
    letter = selection[0].upper()
    if mode == "batch":
        return Row(
            f"batch-{letter.lower()}",
            f"Batch-Data, {letter}",
            {"mode": "batch"},
            {"selection": selection},
        )
    return Row(
        f"single-{letter.lower()}-cs{chunk}",
        f"Single-Sample, {letter}, CS{chunk}",
        {"mode": "single-sample"},
        {"selection": selection, "chunk": chunk},
    )


def paired_column(algorithm: str, label: str | None = None, **values: Any) -> Column:
    """A method that runs beside its matched comparator; ``values`` may hold options
    (any key that is not a :class:`~stratify.config.TrainConfig` field is one)."""
    config_keys = {"dataset", "epochs", "clients", "partition", "model", "norm", "lr"}
    return Column(
        algorithm,
        label or method_label(algorithm),
        {"algorithm": algorithm, **{k: v for k, v in values.items() if k in config_keys}},
        {k: v for k, v in values.items() if k not in config_keys},
        paired=True,
    )


#: The paired grid's budget, chosen to fit a few hours on two shared CPU cores: 20
#: rounds (``--plateau`` runs each pair to its comparator's plateau instead), with the
#: local work each method's card declares for it (``comparison.paired_setting``: one
#: local epoch unless the method says otherwise), each method's own optimizer, batch and
#: clients per round.
PAIRED_ROUNDS = 20
PAIRED_ROWS = (
    partition_row("classes:1", "#C=1"),
    partition_row("classes:3", "#C=3"),
    partition_row("dirichlet:0.1", "Dir(0.1)"),
    partition_row("dirichlet:0.5", "Dir(0.5)"),
    partition_row("iid", "IID"),
)


def paired_grid_column(algorithm: str) -> Column:
    """``algorithm``'s column of the ``paired`` grid, with the setting it declares for it
    (:attr:`~stratify.card.Comparison.paired_setting`; a data set of its own is named in
    its label); one without a comparator is left out with a note when paired."""
    cls = strategy_class(algorithm)
    if cls.card.comparison.comparator is None:
        return paired_column(algorithm)
    setting = cls.card.comparison.paired_setting
    label = f"{method_label(algorithm)} ({setting['dataset']})" if "dataset" in setting else None
    return paired_column(algorithm, label, **setting)


PAIRED_COLUMNS = tuple(
    paired_grid_column(name)
    for name in ALGORITHMS
    if strategy_class(name).card.comparison.comparator is not None
)


def paper_setting_grid() -> tuple[tuple[Row, ...], tuple[Column, ...]]:
    """The ``seed-papers`` grid's rows and columns, from the settings each registered
    method declares (:attr:`~stratify.card.Paper.settings`): a row per setting
    key, with the options of its first setting, holding a paired column per variant, with
    what the variant changes.

    Raises
    ------
    ConfigError
        Where a method's settings with one key differ in label or values, where a variant
        drops an option of its row, or where one variant name changes different options.
    """
    rows: dict[str, Row] = {}
    columns: dict[str, Column] = {}
    for name in ALGORITHMS:
        cls = strategy_class(name)
        for setting in cls.card.paper.settings:
            label = f"{cls.card.label}: {setting.label}"
            row_key = slug(f"{name}-{setting.key}")
            row = rows.setdefault(
                row_key, Row(row_key, label, dict(setting.values), dict(setting.options), ())
            )
            options = dict(setting.options)
            if (row.label, row.values) != (label, setting.values) or any(
                options.get(option) != value for option, value in row.options.items()
            ):
                raise ConfigError(
                    f"{name}: its paper settings {setting.key!r} differ in label, values or "
                    "the options of the row's first setting"
                )
            column = Column(
                slug(f"{name}-{setting.variant}" if setting.variant else name),
                f"{cls.card.label} ({setting.variant})" if setting.variant else cls.card.label,
                {"algorithm": name},
                {key: value for key, value in options.items() if key not in row.options},
                paired=True,
                comparator_options=dict(setting.comparator_options),
                comparator_label=", ".join(
                    f"{option}={value}" for option, value in setting.comparator_options.items()
                )
                or "matched",
            )
            if columns.setdefault(column.key, column) != column:
                raise ConfigError(f"{name}: its variant {setting.variant!r} changes two things")
            rows[row_key] = dataclasses.replace(row, columns=(*(row.columns or ()), column.key))
    return tuple(rows.values()), tuple(columns.values())


#: The `defaults` grids choose each method's default learning rate per (dataset family,
#: mode): every candidate rate (the rows) for every method and mode (the columns), on a
#: validation split of the training samples, at the budget of each mode (single-sample
#: epochs are passes over the data, batch rounds are E local epochs each), on Dir(0.5)
#: across 10 clients; :mod:`stratify.reproduce.defaults` reads the choice from the
#: results (docs/architecture.md, "Default learning rates").
DEFAULTS_CANDIDATES = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3)
DEFAULTS_VALUES = {"partition": "dirichlet:0.5", "clients": 10, "validation": 0.1}
#: epochs of each mode, per family (a family without a mode does not run it)
DEFAULTS_EPOCHS = {
    "digits": {"single-sample": 10, "batch": 5},
    "mnist": {"single-sample": 3, "batch": 20},
}


def lr_rows(candidates: Sequence[float]) -> tuple[Row, ...]:
    """One row per candidate learning rate."""
    return tuple(Row(slug(f"lr {lr:g}"), f"lr {lr:g}", {"lr": lr}) for lr in candidates)


def lr_columns(epochs: dict[str, int]) -> tuple[Column, ...]:
    """One column per registered method and mode of ``epochs`` it runs in, each with its
    own default options and the mode's epochs, or the more its mechanism needs to act
    (:meth:`~stratify.method.Budgeted.informative_epochs`: FedBSS's 50 warm-up rounds + 2)."""
    return tuple(
        Column(
            f"{name}-{mode}",
            f"{method_label(name)} ({mode})",
            {
                "algorithm": name,
                "mode": mode,
                "epochs": max(count, informative_epochs(build_strategy(name, {}, mode))),
            },
        )
        for name in ALGORITHMS
        for mode, count in epochs.items()
        if mode in strategy_class(name).card.identity.modes
    )


GRIDS: dict[str, Grid] = {
    grid.name: grid
    for grid in (
        Grid(
            "table1",
            "Stratify paper Table I: single-sample learning, simple CNN, label skew, each "
            "method at its own validated rate; the seed-paper methods, which run in batch "
            "mode only, in batch mode",
            # the 10% validation split is the one every method's rate was chosen on (the
            # defaults grids); it also tells whether a run converged (PlateauRule)
            {"dataset": "mnist-10k", "mode": "single-sample", "epochs": 30, "validation": 0.1},
            LABEL_SKEW_ROWS,
            tuple(method_column(name) for name in (*BASELINES, "fedavgm"))
            + tuple(batch_column(name) for name in SEED_METHODS)
            + (method_column("stratify"), schedule_column("stratify", "constant")),
            plots=("curves", "accuracy-vs-c"),
            paper=TABLE1_PAPER,
            paper_source="Stratify paper, Table I, MNIST (full 60,000-image training set)",
            paper_datasets=("mnist", "mnist-10k"),
            reference="stratify",
        ),
        Grid(
            "stratify-schedule",
            "Stratify's default schedule: the inverse-epoch decay against the paper's "
            "constant rate, Table I's Stratify runs (mnist-10k, single-sample, 30 epochs)",
            # Table I's settings: its two Stratify columns are these runs
            {"dataset": "mnist-10k", "mode": "single-sample", "epochs": 30, "validation": 0.1},
            LABEL_SKEW_ROWS,
            (method_column("stratify"), schedule_column("stratify", "constant")),
            reference="stratify",
        ),
        Grid(
            "table2",
            "Stratify paper Table II: batch-data learning, label skew "
            "(the paper: ResNet-9 with BN on CIFAR-10; --model resnet9 for it)",
            {"dataset": "mnist-10k", "mode": "batch", "epochs": 30},
            LABEL_SKEW_ROWS,
            tuple(method_column(name) for name in ("fedavg", "fedprox", "scaffold", "stratify")),
            plots=("curves", "accuracy-vs-c"),
        ),
        Grid(
            "ablation-chunk",
            "Stratify paper Table V: chunk size and client selection, single-sample",
            # the paper's constant rate, as its Table V ran
            {
                "dataset": "mnist-10k",
                "mode": "single-sample",
                "epochs": 10,
                "lr_schedule": "constant",
            },
            tuple(
                selection_row(selection, chunk)
                for selection in ("uniform", "weighted")
                for chunk in (1, 5, 50, 150)
            ),
            (Column("dirichlet-0-5", "Dirichlet(0.5)", {"partition": "dirichlet:0.5"}),),
            plots=("curves", "transfers-vs-chunk"),
            transfers=True,
        ),
        Grid(
            "ablation-selection",
            "Stratify paper Table V: uniform vs weighted selection, one domain "
            "concentrated on one client (feature skew) and Dirichlet label skew",
            # the paper's constant rate, as its Table V ran
            {
                "dataset": "rotated-mnist",
                "mode": "single-sample",
                "epochs": 10,
                "lr_schedule": "constant",
            },
            tuple(
                selection_row(selection, chunk)
                for selection in ("uniform", "weighted")
                for chunk in (5, 50, 150)
            )
            + (selection_row("uniform", None, "batch"), selection_row("weighted", None, "batch")),
            (
                Column("dirichlet-0-5", "Dirichlet(0.5)", {"partition": "dirichlet:0.5"}),
                Column("concentrated-0", "Domain 0 on one client", {"partition": "concentrated:0"}),
            ),
            transfers=True,
        ),
        Grid(
            "feature-skew",
            "Stratify paper Table I, feature skew: rotated MNIST by #D, Dirichlet and IID, "
            "each method at its own validated rate, Stratify (uniform selection, its "
            "default) against every other column",
            # the paper's PACS rows ran 30 epochs (Digits-DG 15), as Table I's label-skew
            # rows do; the 10% validation split tells whether a run converged
            # (PlateauRule, which needs 20 epochs at least)
            {"dataset": "rotated-mnist", "mode": "single-sample", "epochs": 30, "validation": 0.1},
            (
                partition_row("domains:1", "#D=1"),
                partition_row("domains:2", "#D=2"),
                partition_row("domain-dirichlet:0.5", "Dirichlet(0.5)"),
                partition_row("iid", "IID"),
            ),
            tuple(method_column(name) for name in BASELINES)
            + (
                Column(
                    "stratify-u",
                    "Stratify (U)",
                    {"algorithm": "stratify"},
                    {"selection": "uniform"},
                ),
                Column(
                    "stratify-w",
                    "Stratify (W)",
                    {"algorithm": "stratify"},
                    {"selection": "weighted"},
                ),
            ),
            reference="stratify-u",
        ),
        Grid(
            "real-data",
            "Stratify's single-sample job on real data: mnist-10k, one label per client "
            "and IID, 3 epochs with the inverse-epoch decay (docs/results.md)",
            {
                "dataset": "mnist-10k",
                "mode": "single-sample",
                "epochs": 3,
                "lr_schedule": "inverse-epoch",
            },
            (partition_row("classes:1", "#C=1"), partition_row("iid", "IID")),
            (method_column("stratify"),),
        ),
        Grid(
            "defaults",
            "every method's default learning rate on digits, each mode: the candidate rates "
            "on a validation split (stratify.reproduce.defaults)",
            {"dataset": "digits", **DEFAULTS_VALUES},
            lr_rows(DEFAULTS_CANDIDATES),
            lr_columns(DEFAULTS_EPOCHS["digits"]),
        ),
        Grid(
            "defaults-mnist",
            "every method's default learning rate on the MNIST family (mnist-10k), each "
            "mode: the candidate rates on a validation split (stratify.reproduce.defaults)",
            {"dataset": "mnist-10k", **DEFAULTS_VALUES},
            lr_rows(DEFAULTS_CANDIDATES),
            lr_columns(DEFAULTS_EPOCHS["mnist"]),
        ),
        Grid(
            "seed-methods",
            "FedBSS, FedBR, FedDiverse and LfD next to FedAvg and Stratify, batch-data",
            {"dataset": "mnist-10k", "mode": "batch", "epochs": 30},
            (
                partition_row("dirichlet:0.1", "Dirichlet(0.1)"),
                partition_row("dirichlet:0.5", "Dirichlet(0.5)"),
                partition_row("classes:2", "#C=2"),
            ),
            (method_column("fedavg"),)
            + tuple(method_column(name) for name in (*SEED_METHODS, "stratify")),
        ),
        Grid(
            "paired",
            "every method against its matched comparator (its base with the same local "
            "optimizer, local work, clients per round, weighting, rounds and seed), label "
            "skew, batch-data",
            {"dataset": "mnist-10k", "mode": "batch", "epochs": PAIRED_ROUNDS},
            PAIRED_ROWS,
            PAIRED_COLUMNS,
        ),
        Grid(
            "fedtan-digits",
            "FedTAN on digits with ResNet-20 against FedAvg with exactly its local SGD (each "
            "client's own BatchNorm statistics) and Stratify's batch mode with the sum-based "
            "BatchNorm (docs/methods.md)",
            {"dataset": "digits", "mode": "batch", "epochs": 30, "model": "resnet20", "lr": 0.05},
            (partition_row("classes:1", "#C=1"), partition_row("dirichlet:0.5", "Dir(0.5)")),
            (
                Column("fedtan", "FedTAN", {"algorithm": "fedtan", "norm": "bn"}),
                Column(
                    "fedavg",
                    "FedAvg, FedTAN's local SGD",
                    {"algorithm": "fedavg", "norm": "bn"},
                    {
                        "local_epochs": 1,
                        "local_batch_size": 128,
                        "local_momentum": 0.9,
                        "local_weight_decay": 1e-4,
                    },
                ),
                Column(
                    "stratify",
                    "Stratify (sum-based BN)",
                    {"algorithm": "stratify", "norm": "sumbn"},
                ),
            ),
            transfers=True,
        ),
        Grid(
            "seed-papers",
            "FedBSS, FedBR, FedDiverse and LfD each in its own paper's setting, as far as "
            "the data at hand allows, against its matched comparator",
            {"dataset": "mnist-10k", "mode": "batch"},
            *paper_setting_grid(),
        ),
    )
}


@dataclass(frozen=True)
class Settings:
    """What the command changes in a grid.

    Parameters
    ----------
    dataset, data_dir : str, optional
        Another dataset than the grid's; the folder holding its files.
    dataset_options : dict
        The loader's options (``-o KEY=VALUE``).
    epochs : int, optional
        Epochs of every cell (default: the grid's).
    seeds : tuple of int
        One cell per seed.
    clients : int, optional
        Clients of every cell (default: the grid's, or its rows', else
        :data:`DEFAULT_CLIENTS`).
    methods : tuple of str, optional
        Only these methods' columns (grids whose columns are methods).
    model : str, optional
        Another model; a ResNet takes BatchNorm in batch mode (Stratify its sum-based
        BatchNorm) and GroupNorm in single-sample mode.
    secure : bool
        The CKKS registry (it gives the same numbers as the plain one, slower).
    device : str
        Where each run's tensors live.
    plateau : int, optional
        Paired grids: R_min of the plateau budget. Every run holds out
        :data:`PLATEAU_VALIDATION` of the training samples; each comparator runs until its
        validation accuracy plateaus (``--stop-on-plateau``, the epochs the cap) and its
        methods then run the rounds it ran, seed by seed (docs/architecture.md,
        "Reproducing the papers").
    extended : mapping, optional
        The second stage of the seeds (``--seeds-until-verdict``): group (``ROW/COLUMN``
        folder names) -> the seeds it runs in all, the ``seeds`` first and then the next
        unused integers; its method's comparator runs them too. Other groups run ``seeds``.
    """

    dataset: str | None = None
    data_dir: str | None = None
    dataset_options: dict[str, Any] = field(default_factory=dict)
    epochs: int | None = None
    seeds: tuple[int, ...] = (0, 1, 2)
    clients: int | None = None
    methods: tuple[str, ...] | None = None
    model: str | None = None
    secure: bool = False
    device: str = "auto"
    plateau: int | None = None
    extended: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # frozen: the checked values are stored as object.__setattr__ does
        def store(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        if self.dataset is not None:
            dataset_options(check_text(self.dataset, "--dataset"))  # refuses an unknown one
        if self.data_dir is not None:
            store("data_dir", check_path(self.data_dir, "--data-dir"))
        if not isinstance(self.dataset_options, dict) or not all(
            isinstance(key, str) for key in self.dataset_options
        ):
            raise ConfigError(
                f"dataset options must be a dictionary of option names to values, got "
                f"{self.dataset_options!r:.60}"
            )
        if self.epochs is not None:
            store("epochs", check_positive_int(self.epochs, "--epochs"))
        store("seeds", check_seeds(self.seeds))
        if self.clients is not None:
            store("clients", check_positive_int(self.clients, "--clients"))
        if self.methods is not None:
            if not isinstance(self.methods, (list, tuple)) or not all(
                isinstance(name, str) and name for name in self.methods
            ):
                raise ConfigError(f"--methods takes method names, got {self.methods!r:.60}")
            store("methods", tuple(self.methods))
        if self.model is not None:
            check_choice(self.model, "--model", tuple(MODELS))
        store("secure", check_bool(self.secure, "--secure"))
        check_choice(self.device, "--device", DEVICES)
        if self.plateau is not None:
            store("plateau", check_positive_int(self.plateau, "--plateau"))
        for group, total in self.extended.items():
            check_positive_int(total, f"the seeds of {group}")

    def seeds_of(self, group: str) -> tuple[tuple[int, int], ...]:
        """``(seed, stage)`` of every cell of ``group`` (``ROW/COLUMN``): the seeds
        given (stage 1), then, where ``group`` is extended, the next unused integers up
        to its total (stage 2)."""
        seeds = [(seed, 1) for seed in self.seeds]
        added = (seed for seed in range(max(self.seeds) + 1, 10**9))
        while len(seeds) < self.extended.get(group, 0):
            seeds.append((next(added), 2))
        return tuple(seeds)


@dataclass(frozen=True)
class Cell:
    """One run of a grid: a row, a column and a seed, with its configuration; for a
    paired method's cell, ``comparator`` is the key of its comparator's column."""

    row: Row
    column: Column
    seed: int
    config: TrainConfig
    comparator: str | None = None
    #: 1: a seed the command gave; 2: a seed added by the two-stage design
    stage: int = 1

    @property
    def group(self) -> str:
        """The row and column: the cells of every seed, which share a tuned lr."""
        return f"{self.row.key}/{self.column.key}"

    @property
    def key(self) -> str:
        return f"{self.group}/seed-{self.seed}"

    @property
    def rate_group(self) -> str:
        """The cells that share a learning rate: a paired method's is its comparator's
        (the pair's rate is chosen for the comparator and used by both), but for a column
        at the method's own rate."""
        if self.comparator is None or self.column.own_rate:
            return self.group
        return f"{self.row.key}/{self.comparator}"

    @property
    def is_comparator(self) -> bool:
        """Whether the cell is a matched comparator of a paired grid."""
        return self.comparator is None and not self.column.paired


def grid_named(name: str) -> Grid:
    if name not in GRIDS:
        raise ConfigError(f"unknown grid {name!r}; choose one of {', '.join(GRIDS)}")
    return GRIDS[name]


def runnable(
    column: Column, values: dict[str, Any], options: dict[str, Any] | None = None
) -> str | None:
    """Why ``column``'s method cannot run with the cell ``values`` and method ``options``
    (default: the column's) here, or ``None``."""
    mode = values["mode"]
    if column.algorithm not in ALGORITHMS:
        return f"{column.label}: no method {column.algorithm!r} in this build, left out"
    if mode not in strategy_class(column.algorithm).card.identity.modes:
        return f"{column.label}: {column.algorithm} does not run in {mode} mode, left out"
    try:
        # a run its options cannot make (FedBSS's warm-up longer than the run): a shorter
        # warm-up would make it another algorithm (its stage 2 acts on a warm model), so
        # the column is left out rather than changed
        build_strategy(
            column.algorithm, column.options if options is None else options, mode
        ).check_epochs(values["epochs"])
    except ConfigError as error:
        return f"{column.label}: {error}; left out"
    model = values.get("model")
    if strategy_class(column.algorithm).card.paper.requires_batch_norm and (
        model not in RESNETS or values.get("norm", "bn") != "bn"
    ):
        return (
            f"{column.label}: {column.algorithm} needs BatchNorm layers, which --model "
            f"{model or 'cnn'} has none of; left out (give the grid --model resnet20)"
        )
    return None


def cell_values(grid: Grid, row: Row, column: Column, settings: Settings) -> dict[str, Any]:
    """The TrainConfig fields of a cell, seed and folder aside."""
    values = {"clients": DEFAULT_CLIENTS, **grid.values, **row.values, **column.values}
    if settings.clients is not None:
        values["clients"] = settings.clients
    values["secure"] = settings.secure
    values["device"] = settings.device
    if settings.dataset is not None:
        values["dataset"] = settings.dataset
    values["data_dir"] = settings.data_dir
    if settings.epochs is not None:
        values["epochs"] = settings.epochs
    if settings.model is not None:
        values["model"] = settings.model
        if settings.model in RESNETS:
            if values["mode"] == "single-sample":
                values["norm"] = "gn"
            else:
                values["norm"] = "sumbn" if values["algorithm"] == "stratify" else "bn"
    return values


def relabelled(column: Column, dataset: str) -> Column:
    """``column`` as it runs under ``--dataset``: a label naming the column's own data set
    (a paired column's, "FedDiverse (colored-mnist)") names the one that replaced it."""
    own = column.values.get("dataset")
    suffix = f" ({own})"
    if own is None or own == dataset or not column.label.endswith(suffix):
        return column
    return dataclasses.replace(column, label=f"{column.label[: -len(suffix)]} ({dataset})")


def plan_cells(
    grid: Grid, settings: Settings, out: str | Path, own_rates: bool = False
) -> tuple[list[Cell], list[str]]:
    """Every cell of ``grid`` under ``settings``, with run folders under ``out/cells``,
    and notes on the columns left out (a method missing from this build or not running
    in the grid's mode). Each configuration is checked now, before anything runs.
    ``own_rates``: a paired grid's methods run at their own rates too
    (:func:`own_rate_cells`; a tuned paired grid's).
    """
    notes: list[str] = []
    columns = list(grid.columns)
    if settings.methods is not None:
        if not grid.methods_are_columns:
            raise ConfigError(f"--methods: the columns of grid {grid.name} are not methods")
        known = {column.algorithm for column in grid.columns}
        unknown = sorted(set(settings.methods) - known)
        if grid.paired:
            # any registered method may be asked for: one without a comparator is left
            # out with a note when its cells are paired
            unknown = [name for name in unknown if name not in ALGORITHMS]
        if unknown:
            raise ConfigError(
                f"--methods: {', '.join(unknown)} not in grid {grid.name}; "
                f"its methods are {', '.join(sorted(known))}"
            )
        extra = [paired_grid_column(name) for name in settings.methods if name not in known]
        columns = [column for column in columns if column.algorithm in settings.methods]
        columns += extra if grid.paired else []
    if not settings.seeds:
        raise ConfigError("--seeds: give at least one seed")
    dataset = settings.dataset or str(grid.values["dataset"])
    # a bad -o would fail every cell: refused here, before anything runs
    check_options(dataset, dataset_options(dataset), settings.dataset_options)
    cells: list[Cell] = []
    left_out: set[str] = set()

    def note(reason: str) -> None:
        if reason not in left_out:
            left_out.add(reason)
            notes.append(reason)

    if settings.dataset is not None:
        columns = [relabelled(column, settings.dataset) for column in columns]
    for row in grid.rows:
        for column in columns:
            if row.columns is not None and column.key not in row.columns:
                continue
            values = cell_values(grid, row, column, settings)
            options = {**grid.options, **row.options, **column.options}
            reason = runnable(column, values, options)
            if reason is not None:
                note(reason)
                continue
            row_cells = [
                Cell(
                    row,
                    column,
                    seed,
                    TrainConfig(
                        **{key: value for key, value in values.items() if key != "dataset_options"},
                        seed=seed,
                        options=options,
                        # a row's loader options belong to its data set, not another one
                        dataset_options={
                            **(
                                values.get("dataset_options", {})
                                if settings.dataset is None
                                else {}
                            ),
                            **settings.dataset_options,
                        },
                        out=str(Path(out) / "cells" / row.key / column.key / f"seed-{seed}"),
                    ),
                    stage=stage,
                )
                for seed, stage in settings.seeds_of(f"{row.key}/{column.key}")
            ]
            if column.paired:
                paired, reason = pair_cells(row_cells, cells, out)
                if reason is not None:
                    note(reason)
                    continue
                row_cells = paired
            cells += row_cells
    if not cells:
        raise ConfigError(f"grid {grid.name}: no cell can run here ({'; '.join(notes)})")
    if own_rates and grid.paired:
        cells += own_rate_cells(cells, out)
    if settings.plateau is not None:
        cells = plateau_cells(grid, cells, settings.plateau)
    return cells, notes


#: the share of the training samples a plateau budget's runs hold out to watch
PLATEAU_VALIDATION = 0.1


def plateau_cells(grid: Grid, cells: Sequence[Cell], minimum_rounds: int) -> list[Cell]:
    """``cells`` under the plateau budget: every run holds out a validation split, each
    comparator stops once its validation accuracy has plateaued after at least
    ``minimum_rounds`` (its epochs the cap); a method's epochs are set to its comparator's
    once that has run (:func:`plateau_rounds`)."""
    if not grid.paired:
        raise ConfigError(
            f"--plateau: grid {grid.name} has no comparators whose plateau would set the rounds"
        )
    for cell in cells:
        # a pair that stopped before the method's mechanism could act would compare nothing
        needed = informative_epochs(
            build_strategy(cell.config.algorithm, cell.config.options, cell.config.mode)
        )
        if needed > minimum_rounds:
            raise ConfigError(
                f"--plateau {minimum_rounds}: {cell.column.label} needs {needed} rounds for its "
                f"mechanism to act; give --plateau {needed} or more"
            )
    planned = []
    for cell in cells:
        config = dataclasses.replace(cell.config, validation=PLATEAU_VALIDATION)
        if cell.is_comparator:
            if minimum_rounds > config.epochs:
                raise ConfigError(
                    f"--plateau {minimum_rounds}: at least that many rounds, but the cap "
                    f"(--epochs) is {config.epochs}"
                )
            config = dataclasses.replace(config, stop_on_plateau=minimum_rounds)
        planned.append(dataclasses.replace(cell, config=config))
    return planned


def plateau_rounds(cells: Sequence[Cell], rounds: Mapping[str, int]) -> list[Cell]:
    """``cells`` with each paired method's epochs set to the rounds its comparator ran for
    the same seed (``rounds``: comparator cell key -> epochs run); a method whose
    comparator has not run keeps its planned cap."""
    done = []
    for cell in cells:
        if cell.comparator is not None:
            key = f"{cell.row.key}/{cell.comparator}/seed-{cell.seed}"
            if rounds.get(key):
                cell = dataclasses.replace(
                    cell, config=dataclasses.replace(cell.config, epochs=rounds[key])
                )
        done.append(cell)
    return done


# -- paired columns: each method beside its matched comparator ---------------------------

#: the end of the folder name of a paired method's column at its own rate
OWN_RATE_SUFFIX = "-own-rate"


def own_rate_cells(cells: Sequence[Cell], out: str | Path) -> list[Cell]:
    """A tuned paired grid steps a method at its comparator's tuned rate, so that only the
    mechanism differs; these are the same methods' cells at their own rate (their card's
    default for the data, which the ``defaults`` grids chose on validation), beside the same
    comparator at its rate: the practical comparison of two methods each at its own rate.
    One per paired method cell of ``cells`` of the seeds given (stage 1: the sequential
    design adds seeds to the matched pairs only)."""
    added = []
    for cell in cells:
        if cell.comparator is None or cell.column.own_rate or cell.stage != 1:
            continue
        column = dataclasses.replace(
            cell.column,
            key=cell.column.key + OWN_RATE_SUFFIX,
            label=f"{cell.column.label} (own rate)",
            own_rate=True,
        )
        folder = Path(out) / "cells" / cell.row.key / column.key / f"seed-{cell.seed}"
        config = dataclasses.replace(cell.config, out=str(folder))
        added.append(dataclasses.replace(cell, column=column, config=config))
    return added


def comparator_key(config: TrainConfig) -> str:
    """A comparator column's folder name: its base and a digest of what it is, the
    same for every method whose comparator comes out the same."""
    identity = {
        key: value
        for key, value in dataclasses.asdict(config).items()
        if key not in ("seed", "out", "epochs", "partition", "clients", "data_dir", "device")
    }
    digest = hashlib.sha1(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()
    return f"{config.algorithm}-matched-{digest[:8]}"


def pair_cells(
    method_cells: Sequence[Cell], planned: Sequence[Cell], out: str | Path
) -> tuple[list[Cell], str | None]:
    """One row's cells of a paired method column, with their comparators.

    Returns the method's cells, each naming its comparator column, and the comparator
    cells not already among ``planned`` (a comparator that several methods share runs
    once: its column key is a digest of its configuration, :func:`comparator_key`); or no
    cells and the one-line reason the method cannot be paired.
    """
    if not method_cells:
        return [], None
    first = method_cells[0]
    try:
        matched = [matched_config(cell.config) for cell in method_cells]
    except ConfigError as error:
        return [], f"{first.column.label}: {error}; left out"
    if first.column.comparator_options:
        # a paper's own baseline: the matched comparator with these options replaced
        matched = [
            dataclasses.replace(
                config, options={**config.options, **first.column.comparator_options}
            )
            for config in matched
        ]
    key = comparator_key(matched[0])
    result = [dataclasses.replace(cell, comparator=key) for cell in method_cells]
    # the same comparator as an earlier method's runs once: only seeds it lacks are added
    # (a method whose seeds were extended further than the earlier one's)
    have = {
        cell.seed for cell in planned if (cell.row.key, cell.column.key) == (first.row.key, key)
    }
    base = matched[0].algorithm
    column = Column(
        key,
        f"{method_label(base)} ({first.column.comparator_label})",
        {"algorithm": base},
        matched[0].options,
    )
    result += [
        Cell(
            cell.row,
            column,
            cell.seed,
            dataclasses.replace(
                config, out=str(Path(out) / "cells" / cell.row.key / key / f"seed-{cell.seed}")
            ),
            stage=cell.stage,
        )
        for cell, config in zip(method_cells, matched)
        if cell.seed not in have
    ]
    return result, None
