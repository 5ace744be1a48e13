"""A method's matched comparator: its base run with the same local training.

A method M that modifies a base method (its class's ``comparator``: FedAvg for FedProx,
SCAFFOLD, FedAvgM, FedBSS, FedBR, LfD, FedTAN; FedAvgM for FedDiverse) is compared with
the base run with M's local optimizer (learning rate, momentum, weight decay), M's local
work (epochs or iterations × batch), M's clients per round, M's aggregation weights, and
the run's rounds and seed, so that the only difference between the two runs is M's own
mechanism (:func:`comparator_for`, :func:`matched_config`); :func:`planned_sample_gradients`
checks that the two plan the same local work. The paired grids
(:mod:`stratify.reproduce.paired`) and the conformance checks (:mod:`stratify.testing`)
build on it (docs/architecture.md, "Reproducing the papers").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from stratify.algorithms import build_strategy, strategy_class
from stratify.config import TrainConfig, resolve_lr
from stratify.errors import ConfigError
from stratify.method import planned_sample_gradients as planned_budget

#: the local-training options a comparator copies from its method (resolved for the mode)
LOCAL_TRAINING = (
    "local_epochs",
    "local_steps",
    "local_batch_size",
    "local_momentum",
    "local_weight_decay",
    "client_fraction",
    "weighting",
)
#: the server options a comparator copies too, where its base takes them (FedAvgM)
SERVER_OPTIONS = ("server_momentum", "server_lr")


def comparator_for(
    method: str, options: Mapping[str, Any], mode: str = "batch"
) -> tuple[str, dict[str, Any]]:
    """The matched comparator of ``method`` run with ``options``: its base's name and the
    base's options.

    The options are ``method``'s own resolved for ``mode`` (defaults filled in), reduced to
    what the base shares with it: local epochs or iterations, batch, momentum, weight
    decay, client fraction and aggregation weights (for a base with a server optimizer
    also its server momentum and rate). Everything that is ``method``'s mechanism (μ,
    control variates, pacing, pseudo-data, drift regulariser, shared statistics, client
    selection) is left out. The learning rate, the rounds and the seed are run settings,
    not options: :func:`matched_config` copies them.

    Parameters
    ----------
    method : str
        A registered method.
    options : mapping
        Its options as given (``None`` or absent: the method's default).
    mode : {"batch", "single-sample"}
        The learning setting the two run in.

    Raises
    ------
    ConfigError
        One line, for a method with no base or no local optimizer to match.
    """
    cls = strategy_class(method)
    base = cls.card.comparison.comparator
    if base is None:
        reason = (
            cls.card.comparison.no_comparator or f"{method} has no base method declared to match"
        )
        raise ConfigError(f"no matched comparator: {reason}")
    resolved = build_strategy(method, options, mode).options
    base_options = {entry.name for entry in strategy_class(base).options_class.option_fields()}
    shared = [name for name in LOCAL_TRAINING + SERVER_OPTIONS if name in base_options]
    values = {
        name: getattr(resolved, name)
        for name in shared
        if getattr(resolved, name, None) is not None
    }
    missing = [name for name in ("local_batch_size", "local_momentum") if name not in values]
    if missing:
        raise ConfigError(
            f"no matched comparator: {method} has no local optimizer to match (no "
            f"{', '.join(missing)})"
        )
    if cls.card.comparison.effective_weighting is not None:
        values["weighting"] = cls.card.comparison.effective_weighting
    # the base resolves its own defaults the same way: what is given here wins
    build_strategy(base, values, mode)
    return base, values


def matched_config(config: TrainConfig) -> TrainConfig:
    """The comparator run of the method run ``config``: :func:`comparator_for`'s base and
    options, the method's resolved learning rate and schedule, and every other setting
    (data, split, clients, model, rounds, seed, device) as in ``config``; no ``out``.

    Parameters
    ----------
    config : TrainConfig
        The method's run.
    """
    base, options = comparator_for(config.algorithm, config.options, config.mode)
    strategy = build_strategy(config.algorithm, config.options, config.mode)
    return dataclasses.replace(
        config,
        algorithm=base,
        options=options,
        lr=resolve_lr(config, strategy),
        lr_schedule=config.lr_schedule or strategy.card.rates.schedule_for(config.mode),
        out=None,
    )


def planned_sample_gradients(config: TrainConfig, client_sizes: Sequence[int]) -> float | None:
    """The local training samples a round of ``config``'s method is planned to take, in
    expectation over its uniformly drawn participants, for clients of ``client_sizes``
    samples (:meth:`~stratify.method.Budgeted.planned_sample_gradients`); ``None`` where
    the method plans no such budget.

    Parameters
    ----------
    config : TrainConfig
        The run.
    client_sizes : sequence of int
        The samples each client holds.
    """
    strategy = build_strategy(config.algorithm, config.options, config.mode)
    return planned_budget(strategy, [int(size) for size in client_sizes])
