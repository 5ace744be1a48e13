"""One experiment factory: config -> dataset, partition, federation, registry, strategy,
model, engine, with one set of defaults.

``Run`` (the ``train`` command), the benchmarks, the stream learner, the examples and the
tests build their engines here, so a default changes in one place (docs/architecture.md,
"Data flow"). Parts a caller already holds (a loaded dataset, a window's federation, a
model kept across windows) are passed in and not rebuilt.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from stratify.algorithms import build_strategy
from stratify.backend import configure_cpu_for_single_sample, resolve_device
from stratify.client import LocalTrainer, PrivateTrainer, private_trainer
from stratify.config import TrainConfig, dp_settings, resolve_lr
from stratify.data.datasets import Dataset, load_dataset
from stratify.data.holdout import EvaluationSet, holdout_validation
from stratify.data.partition import partition
from stratify.engine import Engine
from stratify.errors import ConfigError
from stratify.federation import Federation
from stratify.method import Strategy
from stratify.nn.models import build_model, default_model
from stratify.nn.norm import has_batch_norm
from stratify.registry import make_registry
from stratify.registry.base import LabelRegistry, RegistryResult
from stratify.validation import check_fits_in_memory


@dataclass
class Experiment:
    """The built parts of a run, with the defaults that were resolved."""

    config: TrainConfig
    device: torch.device
    dataset: Dataset
    federation: Federation
    placeholders: RegistryResult
    strategy: Strategy
    model: nn.Module
    engine: Engine
    lr: float
    lr_schedule: str
    validation: EvaluationSet | None = None


def build_experiment(
    config: TrainConfig,
    *,
    dataset: Dataset | None = None,
    federation: Federation | None = None,
    registry: LabelRegistry | None = None,
    model: nn.Module | None = None,
    strategy: Strategy | None = None,
    trainer: LocalTrainer | None = None,
) -> Experiment:
    """Build every part of ``config``'s run, in the order that fixes its random state.

    Parameters
    ----------
    config : TrainConfig
        The run's configuration; ``lr`` and ``lr_schedule`` left ``None`` take the
        dataset's and the method's defaults.
    dataset : Dataset, optional
        An already loaded dataset (default: load ``config.dataset``), on its device. With
        ``config.validation`` > 0 its validation split is taken here, from either; the
        engine then evaluates on the split and on the test set.
    federation : Federation, optional
        The clients (default: partition the training labels by ``config.partition``; only
        then are labels that no client holds refused, since a caller's federation, e.g. a
        streaming window, may hold a subset of the labels).
    registry : LabelRegistry, optional
        The label registry to run (default: CKKS or plain by ``config.secure``; a default
        CKKS one draws fresh clients' secrets, so its placeholders differ from run to run:
        :class:`~stratify.run.Run` passes one with the secrets it keeps in the run folder).
    model : torch.nn.Module, optional
        The global model (default: a fresh ``config.model`` seeded with ``config.seed``).
    strategy : Strategy, optional
        A strategy instance, e.g. of a method not in the registry (default:
        ``config.algorithm`` with ``config.options``).
    trainer : LocalTrainer, optional
        Local training of the clients (default: plain SGD).
    """
    device = dataset.x_train.device if dataset is not None else resolve_device(config.device)
    if device.type == "cpu" and config.mode == "single-sample":
        configure_cpu_for_single_sample()
    if dataset is None:
        dataset = load_dataset(
            config.dataset,
            data_dir=config.data_dir,
            device=device,
            seed=config.seed,
            **config.dataset_options,
        )
    validation = None
    if config.validation:
        # before partitioning: the held-out samples belong to no client
        dataset, validation = holdout_validation(dataset, config.validation, seed=config.seed)
    if federation is None:
        federation = partition_clients(dataset, config)
    if registry is None:
        registry = make_registry(config.secure, seed=config.seed, protocol=config.protocol)
    placeholders = registry.register(federation.label_counts(), num_classes=dataset.num_classes)
    if strategy is None:
        strategy = build_strategy(config.algorithm, config.options, config.mode)
    lr = resolve_lr(config, strategy)
    lr_schedule = config.lr_schedule or strategy.card.rates.schedule_for(config.mode)
    if model is None:
        model_name = config.model or default_model(dataset.input_shape)
        if model_name == "mlp" and config.mlp_hidden is not None:
            check_mlp_fits_in_memory(dataset.input_shape, config.mlp_hidden, dataset.num_classes)
        torch.manual_seed(config.seed)
        model = build_model(
            model_name,
            dataset.input_shape,
            dataset.num_classes,
            norm=config.norm,
            hidden=config.mlp_hidden,
        )
        model = model.to(device)
    if config.mode == "single-sample" and has_batch_norm(model):
        raise ConfigError(
            f"{type(model).__name__} normalises with batch statistics, which one sample cannot "
            "give; in --mode single-sample use --norm gn (or none), or use --mode batch"
        )
    privacy = dp_settings(config)
    if privacy is not None and trainer is not None and private_trainer(trainer) is None:
        if not getattr(trainer, "clips_on_nodes", False):
            # a caller's trainer whose clients do not clip or noise
            raise ConfigError(
                f"--dp-epsilon/--dp-noise are not available with {type(trainer).__name__} "
                "(its clients do not clip and noise their updates)"
            )
    if privacy is not None and trainer is None:
        if has_batch_norm(model):
            raise ConfigError(
                f"{type(model).__name__} normalises with batch statistics, so a sample's "
                "gradient cannot be clipped alone; with DP use --norm gn (or none)"
            )
        trainer = PrivateTrainer(
            dataset.x_train,
            dataset.y_train,
            clip=privacy.clip,
            noise_multiplier=0.0,  # calibrated below, once the plan's uses are known
            seed=privacy.seed,
            owners=sample_owners(federation, len(dataset.y_train)),
        )
    engine = Engine(
        model,
        dataset,
        federation,
        placeholders,
        strategy,
        mode=config.mode,
        lr=lr,
        lr_schedule=lr_schedule,
        seed=config.seed,
        trainer=trainer,
        total_epochs=config.epochs,
        validation=validation,
    )
    private = private_trainer(trainer)
    if private is None and getattr(trainer, "clips_on_nodes", False):
        # Flower's trainer: its nodes clip and noise with the σ calibrated here
        private = trainer  # type: ignore[assignment]
    if privacy is not None and private is not None:
        # a caller's private trainer too (one a recorder wraps): σ for this run's uses
        private.privacy = privacy
        private.uses_per_epoch = uses_per_epoch(strategy, placeholders)
        private.noise_multiplier = privacy.sigma(config.epochs * private.uses_per_epoch)
    return Experiment(
        config,
        device,
        dataset,
        federation,
        placeholders,
        strategy,
        model,
        engine,
        lr,
        lr_schedule,
        validation,
    )


def sample_owners(federation: Federation, samples: int) -> np.ndarray | None:
    """The client of every one of ``samples`` training samples, by which each client
    draws its DP noise from its own generator (as its node does over Flower); ``None``
    when the federation does not cover the dataset's training samples one to one."""
    owners = federation.sample_clients()
    return owners if len(owners) == samples else None


def uses_per_epoch(strategy: Strategy, placeholders: RegistryResult) -> int:
    """The most times one epoch of ``strategy`` trains on any one sample, known before
    the run (docs/architecture.md, "Differential privacy"): Stratify's schedule takes
    ``r_l`` entries of a label with ``n_l`` samples, a new pass over them each time they
    run out, so ``max_l ⌈r_l / n_l⌉``; an averaging baseline's participant makes
    ``local_epochs`` passes over its samples per round."""
    repeats = getattr(strategy, "repeats", None)
    if repeats is not None:
        counts = np.maximum(np.asarray(placeholders.global_counts, dtype=np.int64), 1)
        return int(np.max(-(-np.asarray(repeats, dtype=np.int64) // counts)))
    local_epochs = getattr(strategy, "local_epochs", None)
    if isinstance(local_epochs, int) and local_epochs > 0:
        return local_epochs
    raise ConfigError(f"{strategy.card.name}: how often it uses a sample is not known; DP refused")


def mlp_parameters(input_shape: tuple[int, ...], hidden: tuple[int, ...], num_classes: int) -> int:
    """Weights and biases of an MLP ``prod(input_shape) → hidden → … → num_classes``."""
    widths = (math.prod(input_shape), *hidden, num_classes)
    return sum((fan_in + 1) * fan_out for fan_in, fan_out in zip(widths[:-1], widths[1:]))


def check_mlp_fits_in_memory(
    input_shape: tuple[int, ...], hidden: tuple[int, ...], num_classes: int
) -> None:
    """Refuse ``--mlp-hidden`` widths whose weights and gradients exceed the machine's
    memory, before the layers are allocated (the only model whose size is set freely)."""
    count = mlp_parameters(input_shape, hidden, num_classes)
    itemsize = torch.tensor([], dtype=torch.get_default_dtype()).element_size()
    check_fits_in_memory(
        2 * count * itemsize,
        f"--mlp-hidden {','.join(map(str, hidden))} ({count:,} parameters, with their gradients)",
        "use narrower layers",
    )


def partition_clients(dataset: Dataset, config: TrainConfig) -> Federation:
    """Split the training samples into ``config.clients`` clients by ``config.partition``.

    Refuses more clients than samples and a split that leaves a label with no client (the
    schedule could never visit it).
    """
    labels = dataset.train_labels
    if config.clients > len(labels):
        raise ConfigError(
            f"{config.clients} clients but only {len(labels)} training samples; use fewer clients"
        )
    client_indices = partition(
        labels, config.clients, config.partition, seed=config.seed, domains=dataset.domains_train
    )
    federation = Federation(client_indices, labels)
    held = labels[np.concatenate(client_indices)]
    unheld = sorted(set(labels.tolist()) - set(held.tolist()))
    if unheld:
        raise ConfigError(
            f"label(s) {', '.join(map(str, unheld))} are held by no client under "
            f"{config.partition} with {config.clients} clients; use more clients or "
            "another partition"
        )
    return federation
