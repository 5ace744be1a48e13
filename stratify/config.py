"""The configuration of a run: one dataclass, its defaults written once.

:class:`TrainConfig` is what ``config.json`` records and what
:func:`stratify.experiment.build_experiment` builds from; the ``train`` command generates
its flags from the fields (help and default included), like the methods' options
(docs/architecture.md, "Options").
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from stratify.algorithms import build_strategy, check_algorithm
from stratify.common_options import CommonOptions
from stratify.data.datasets import DATASETS, dataset_family, dataset_options
from stratify.data.datasets.base import check_options
from stratify.data.partition import parse_partition_spec
from stratify.errors import ConfigError, OutputError
from stratify.measures import PlateauRule, plateau_budget
from stratify.method import LR_SCHEDULES, Strategy
from stratify.nn.catalog import BATCH_STATISTICS_NORMS, check_model_norm, default_norm
from stratify.options import MODES, RunSettings, check_given, option, option_of
from stratify.privacy.accounting import DP_FIELDS, DPOptions, DPSettings, dp_settings_of
from stratify.validation import (
    check_path,
    check_positive_int,
    check_share,
    check_text,
)

# The dataset's rate, for a method without one of its own there: every registered method
# declares its own per (dataset family, mode) where a `defaults` grid measured it
# (stratify.reproduce.defaults); these serve the other datasets
DEFAULT_LR = {("digits", "batch"): 0.05}
FALLBACK_LR = 0.01
# options that may change between a run and its resumption (every registry protocol gives
# the same placeholders and counts, so the protocol is one of them)
RESUMABLE_CHANGES = ("epochs", "stop_on_plateau", "device", "out", "protocol")
#: methods whose clients' local training all goes through the trainer with fixed passes
#: over their samples, so that a private trainer clips and noises all of it and each
#: sample's uses are known in advance (docs/architecture.md, "Differential privacy")
DP_ALGORITHMS = ("stratify", "fedavg", "fedprox", "scaffold", "fedavgm")


def check_partition(value: object, flag: str) -> str:
    """A partition spec (``classes:2``), checked by the partitioner's own parser."""
    parse_partition_spec(check_text(value, flag))
    return str(value)


@dataclass
class TrainConfig(RunSettings):
    """Everything that defines a run; written to ``config.json``.

    Every field made with :func:`~stratify.options.option` is a flag of ``stratify
    train`` with that help text. ``options`` holds the method's options (fields of its
    :class:`~stratify.options.StrategyOptions` class) and ``dataset_options`` the
    loader's (``-o KEY=VALUE``). Invalid values are refused on creation.
    """

    dataset: str = option(
        "digits", "Dataset name, e.g. digits, mnist-10k, colored-mnist.", check=check_text
    )
    data_dir: str | None = option(
        None,
        "Folder holding the dataset files (not needed for digits and synthetic).",
        check=check_path,
        cli_type=str,
        envvar="STRATIFY_DATA_DIR",
    )
    partition: str = option(
        "classes:1",
        "iid | classes:k | dirichlet:α | shards:s | domains:d | domain-dirichlet:α | gsc:k | "
        "concentrated:d",
        check=check_partition,
    )
    clients: int = option(10, "Number of clients.", check=check_positive_int)
    algorithm: str = option(
        "stratify", "Federated method (`stratify methods` lists them).", check=check_algorithm
    )
    mode: str = option("single-sample", "Learning setting.", choices=MODES)
    epochs: int = option(
        5, "Epochs (Stratify: passes of the SLS; baselines: rounds).", check=check_positive_int
    )
    lr: float | None = option_of(
        CommonOptions,
        "lr",
        help="Base learning rate [default: the method's own where its paper or a validation "
        f"grid fixes one (`stratify methods`), else {DEFAULT_LR['digits', 'batch']} on "
        f"digits in batch mode and {FALLBACK_LR} otherwise].",
    )
    lr_schedule: str | None = option(
        None,
        "Epoch e trains with lr/e (inverse-epoch) or lr (constant) "
        "[default: the method's, `stratify methods`: its paper's constant rate, except "
        "Stratify's single-sample runs, which decay].",
        choices=LR_SCHEDULES,
        cli_type=str,
    )
    model: str | None = option_of(CommonOptions, "model")
    mlp_hidden: tuple[int, ...] | None = option_of(CommonOptions, "mlp_hidden")
    norm: str | None = option_of(CommonOptions, "norm")
    seed: int = option_of(CommonOptions, "seed")
    validation: float = option(
        0.0,
        "Share of the training samples held out (per label) before partitioning; the run "
        "is evaluated on them as well as on the test set, so an epoch or a learning rate "
        "can be chosen without the test set. 0: no validation split.",
        check=check_share,
    )
    stop_on_plateau: int | None = option(
        None,
        "Stop once the validation accuracy has converged: after at least this many epochs, "
        "when the last 10% of the epochs run (at least 10) set no best more than 0.5 points "
        "above the best before them, their median and the mean of the last 10% (at least 3) "
        "are within 2 points of the best, and the median is over 5 points above chance "
        "(--epochs is the cap; needs --validation). Default: run every epoch.",
        check=check_positive_int,
        cli_type=int,
    )
    device: str = option_of(CommonOptions, "device")
    secure: bool = option_of(CommonOptions, "secure")
    protocol: str = option_of(CommonOptions, "protocol")
    dp_epsilon: float | None = option_of(DPOptions, "dp_epsilon")
    dp_noise: float | None = option_of(DPOptions, "dp_noise")
    dp_delta: float | None = option_of(DPOptions, "dp_delta")
    dp_clip: float | None = option_of(DPOptions, "dp_clip")
    dp_seed: int | None = option_of(DPOptions, "dp_seed")
    options: dict[str, Any] = field(default_factory=dict)
    dataset_options: dict[str, Any] = field(default_factory=dict)
    out: str | None = None

    resumable_changes = RESUMABLE_CHANGES

    def __post_init__(self) -> None:
        check_given(self)
        super().__post_init__()
        if self.out is not None:
            if isinstance(self.out, str) and not self.out.strip():
                raise OutputError("--out needs a folder name, got an empty one")
            self.out = check_path(self.out, "--out")
        for name in ("options", "dataset_options"):
            value = getattr(self, name)
            if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
                raise ConfigError(
                    f"{name} must be a dictionary of option names to values, got {value!r:.60}"
                )
        if self.dataset in DATASETS:  # a caller's own dataset declares no options here
            check_options(self.dataset, dataset_options(self.dataset), self.dataset_options)
        # like the choices above, checked before any data is loaded: the default model
        # (cnn or mlp) has no norm layers, so a norm is refused even without --model
        check_model_norm(self.model, self.norm, self.mode)
        if self.stop_on_plateau is not None:
            if not self.validation:
                raise ConfigError(
                    "--stop-on-plateau watches the validation accuracy: give --validation "
                    "(e.g. 0.1)"
                )
            if self.stop_on_plateau > self.epochs:
                raise ConfigError(
                    f"--stop-on-plateau {self.stop_on_plateau}: at least that many epochs "
                    f"before stopping, but --epochs is {self.epochs} (the cap)"
                )
        # the method's options are checked now, before any data is loaded, and kept typed
        given = {key: value for key, value in self.options.items() if value is not None}
        strategy = build_strategy(self.algorithm, given, self.mode)
        strategy.check_epochs(self.epochs)
        self.options = {key: getattr(strategy.options, key) for key in given}
        check_private(self)

    def comparable(self) -> dict[str, Any]:
        # a run without DP compares as before the DP settings existed
        values = super().comparable()
        for name in DP_FIELDS:
            if values.get(name) is None:
                values.pop(name, None)
        return values


def dp_settings(config: TrainConfig) -> DPSettings | None:
    """The run's differential privacy, ``None`` when it asks for none."""
    return dp_settings_of(config)


def check_private(config: TrainConfig) -> None:
    """Refuse, in one line, differential privacy a run cannot give: options without a
    noise level, a method or a model whose updates cannot be clipped per sample, and the
    compiled step (which reads the samples itself, unclipped)."""
    if dp_settings_of(config) is None:
        return
    if config.algorithm not in DP_ALGORITHMS:
        raise ConfigError(
            f"--dp-epsilon/--dp-noise apply to --method {', '.join(DP_ALGORITHMS)}; "
            f"{config.algorithm}'s local training is not clipped per sample"
        )
    norm = config.norm or (default_norm(config.model) if config.model else "none")
    if norm in BATCH_STATISTICS_NORMS:
        raise ConfigError(
            f"--norm {norm} couples the samples of a batch through its statistics, so a "
            "sample's gradient cannot be clipped alone; with DP use --norm gn (or none)"
        )
    if config.options.get("compile") == "on":
        raise ConfigError(
            "--compile on skips the per-sample clipping of DP; with DP the steps run eagerly "
            "(--compile off or auto)"
        )
    if config.options.get("local_steps") is not None:
        raise ConfigError(
            "--local-steps draws samples with replacement, so a sample's uses are not fixed; "
            "with DP use --local-epochs"
        )


def plateau_rule(config: TrainConfig, classes: int | None = None) -> PlateauRule | None:
    """The rule that ends ``config``'s run early, or ``None`` (every epoch runs); with
    the data's ``classes``, a run still within 5 points of chance has not plateaued."""
    if config.stop_on_plateau is None:
        return None
    chance = 1.0 / classes if classes else None
    return PlateauRule(config.stop_on_plateau, config.epochs, chance=chance)


def run_complete(
    config: TrainConfig,
    validation_accuracies: Sequence[float | None],
    classes: int | None = None,
) -> bool:
    """Whether a run of ``config`` that has these validation accuracies so far (one per
    finished epoch) is over: every epoch run, or its validation accuracy plateaued
    (:func:`plateau_rule`; ``classes``: the data's, for the chance level)."""
    if len(validation_accuracies) >= config.epochs:
        return True
    rule = plateau_rule(config, classes)
    if rule is None or any(accuracy is None for accuracy in validation_accuracies):
        return False
    budget = plateau_budget([float(a) for a in validation_accuracies if a is not None], rule)
    return budget is not None


def default_lr(dataset: str, mode: str) -> float:
    """The base learning rate used when ``--lr`` is not given and the method has none of
    its own: the dataset's rate in ``mode``."""
    return DEFAULT_LR.get((dataset, mode), FALLBACK_LR)


def resolve_lr(config: TrainConfig, strategy: Strategy | None = None) -> float:
    """The base learning rate ``config``'s run steps at: its ``--lr``, else the method's
    own (:meth:`~stratify.method.Strategy.lr_for`: the rate chosen for the dataset's
    family and the mode, else its paper's), else the dataset's (:func:`default_lr`).

    Parameters
    ----------
    config : TrainConfig
        The run; ``config.lr`` ``None`` means not given.
    strategy : Strategy, optional
        ``config``'s method as built for the run (default: built from ``config``).
    """
    if config.lr is not None:
        return config.lr
    if strategy is None:
        strategy = build_strategy(config.algorithm, config.options, config.mode)
    own = strategy.lr_for(
        config.mode, family=dataset_family(config.dataset), dataset=config.dataset
    )
    return own or default_lr(config.dataset, config.mode)


def resolved_differences(used: dict[str, Any], config: TrainConfig) -> list[str]:
    """Where the rate, schedule or options a run used (``used``, its ``config.json``'s
    ``"resolved"``) differ from what ``config`` resolves to today, one
    ``"key (resolved): used vs today"`` each. An option the run did not record (added
    since, with a default that keeps the old behaviour) is not compared.

    Parameters
    ----------
    used : dict
        The ``"resolved"`` record of the run's ``config.json``.
    config : TrainConfig
        The run asked for now.
    """
    strategy = build_strategy(config.algorithm, config.options, config.mode)
    # as config.json records them (JSON: tuples become lists)
    today = json.loads(
        json.dumps(
            {
                "lr": resolve_lr(config, strategy),
                "lr_schedule": config.lr_schedule or strategy.card.rates.schedule_for(config.mode),
                "options": strategy.options.to_dict(),
            },
            default=str,
        )
    )
    differences = [
        f"{key} (resolved): {used.get(key)!r:.60} vs {today[key]!r}"
        for key in ("lr", "lr_schedule")
        if key in used and used[key] != today[key]
    ]
    recorded = used.get("options")
    if isinstance(recorded, dict):
        differences += [
            f"options.{name} (resolved): {recorded[name]!r:.60} vs {value!r}"
            for name, value in today["options"].items()
            if name in recorded and recorded[name] != value
        ]
    return differences
