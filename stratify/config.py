"""The configuration of a run: one dataclass, its defaults written once.

:class:`TrainConfig` is what ``config.json`` records and what
:func:`stratify.experiment.build_experiment` builds from; the ``train`` command generates
its flags from the fields (help and default included), like the methods' options
(docs/architecture.md, "Options").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stratify.algorithms import ALGORITHMS, build_strategy
from stratify.backend import DEVICES
from stratify.method import LR_SCHEDULES
from stratify.options import MODES, RunSettings, option
from stratify.validation import (
    check_positive,
    check_positive_int,
    check_seed,
    check_share,
    check_widths,
)

# datasets whose single-sample runs need another base rate: the 8x8 digits leave the CNN on
# its initial plateau for a whole epoch at 0.01 (5 epochs: 0.91 at 0.01, 0.97 at 0.05)
DEFAULT_LR = {"digits": 0.05}
FALLBACK_LR = 0.01
PROTOCOLS = ("packed", "naive")
# options that may change between a run and its resumption
RESUMABLE_CHANGES = ("epochs", "device", "out")


@dataclass
class TrainConfig(RunSettings):
    """Everything that defines a run; written to ``config.json``.

    Every field made with :func:`~stratify.options.option` is a flag of ``stratify
    train`` with that help text. ``options`` holds the method's options (fields of its
    :class:`~stratify.options.StrategyOptions` class) and ``dataset_options`` the
    loader's (``-o KEY=VALUE``). Invalid values are refused on creation.
    """

    dataset: str = option("digits", "Dataset name, e.g. digits, mnist-10k, colored-mnist.")
    data_dir: str | None = option(
        None,
        "Folder holding the dataset files (not needed for digits and synthetic).",
        cli_type=str,
        envvar="STRATIFY_DATA_DIR",
    )
    partition: str = option(
        "classes:1",
        "iid | classes:k | dirichlet:α | shards:s | domains:d | domain-dirichlet:α | "
        "concentrated:d",
    )
    clients: int = option(10, "Number of clients.", check=check_positive_int)
    algorithm: str = option(
        "stratify",
        "Federated method (`stratify algorithms` lists them).",
        choices=tuple(ALGORITHMS),
    )
    mode: str = option("single-sample", "Learning setting.", choices=MODES)
    epochs: int = option(
        5, "Epochs (Stratify: passes of the SLS; baselines: rounds).", check=check_positive_int
    )
    lr: float | None = option(
        None,
        "Base learning rate [default: the method's own where its paper fixes one "
        f"(`stratify algorithms`), else {DEFAULT_LR['digits']} on digits and {FALLBACK_LR} "
        "otherwise].",
        check=check_positive,
        cli_type=float,
    )
    lr_schedule: str | None = option(
        None,
        "Epoch e trains with lr/e (inverse-epoch) or lr (constant) "
        "[default: constant, every method's papers' schedule].",
        choices=LR_SCHEDULES,
        cli_type=str,
    )
    model: str | None = option(
        None,
        "cnn | mlp | resnet9 | resnet18 | resnet20 [default: cnn for images, mlp for tabular].",
        cli_type=str,
    )
    mlp_hidden: tuple[int, ...] | None = option(
        None,
        "Hidden-layer widths of --model mlp, comma-separated [default: 200,200].",
        check=check_widths,
        cli_type=str,
    )
    norm: str | None = option(
        None,
        "bn | gn | sumbn | sumbn-client-mean | none [default: bn for the ResNets; cnn and mlp "
        "have no norm layers, so none is their only norm].",
        cli_type=str,
    )
    seed: int = option(
        0,
        "Seeds data generation, partition, registry, schedule, selection and model init.",
        check=check_seed,
    )
    validation: float = option(
        0.0,
        "Share of the training samples held out (per label) before partitioning; the run "
        "is evaluated on them as well as on the test set, so an epoch or a learning rate "
        "can be chosen without the test set. 0: no validation split.",
        check=check_share,
    )
    device: str = option("auto", "Where tensors live.", choices=DEVICES)
    secure: bool = option(True, "CKKS placeholder registry, or the plain one.")
    protocol: str = option("packed", "CKKS protocol of the secure registry.", choices=PROTOCOLS)
    options: dict[str, Any] = field(default_factory=dict)
    dataset_options: dict[str, Any] = field(default_factory=dict)
    out: str | None = None

    resumable_changes = RESUMABLE_CHANGES

    def __post_init__(self) -> None:
        super().__post_init__()
        # the method's options are checked now, before any data is loaded, and kept typed
        given = {key: value for key, value in self.options.items() if value is not None}
        strategy = build_strategy(self.algorithm, given, self.mode)
        strategy.check_epochs(self.epochs)
        self.options = {key: getattr(strategy.options, key) for key in given}


def default_lr(dataset: str) -> float:
    """The base learning rate used when ``--lr`` is not given."""
    return DEFAULT_LR.get(dataset, FALLBACK_LR)
