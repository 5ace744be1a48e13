"""Tiny engines for the method tests: hand-made clients and data, every part passed to
``build_experiment``, so a test knows exactly which client holds which sample.

``tiny_engine(strategy, model, sizes)`` gives client ``k`` ``sizes[k]`` samples whose
labels cycle through ``client_labels[k]`` (by default the one label ``k % 3``); a sample of
label ``l`` is standard normal noise shifted by ``l`` in each of its 4 features. A test
with its own data passes ``dataset`` and ``federation`` instead, or only ``dataset`` and
the run's settings (partition, clients, model) for ``build_experiment`` to build the rest.

The small models of that data (``linear``, ``mlp``, ``bn_mlp``) and the hand math of the
baseline tests (``ce_gradient``, ``numpy_params``, ``client_arrays``, ``bn_input``) are here
too, shared by ``tests/test_fedavg.py`` and the files of the methods built on FedAvg.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from stratify.client import LocalTrainer
from stratify.config import TrainConfig
from stratify.data.datasets import Dataset
from stratify.engine import Engine
from stratify.experiment import build_experiment
from stratify.federation import Federation
from stratify.method import Strategy
from stratify.registry import PlainRegistry

FEATURES, CLASSES = 4, 3


def client_data(
    sizes: Sequence[int],
    client_labels: Sequence[Sequence[int]] | None = None,
    *,
    features: int = FEATURES,
    classes: int = CLASSES,
    test_samples: int = 4,
    seed: int = 0,
) -> tuple[Dataset, Federation]:
    """Clients holding consecutive samples, ``sizes[k]`` of them for client ``k``, whose
    labels cycle through ``client_labels[k]`` (default: ``[k % classes]``); the test set is
    a copy of the first ``test_samples`` training samples."""
    if client_labels is None:
        client_labels = [[k % classes] for k in range(len(sizes))]
    generator = torch.Generator().manual_seed(seed)
    labels = np.concatenate(
        [np.resize(np.asarray(held), size) for held, size in zip(client_labels, sizes)]
    ).astype(np.int64)
    x = torch.randn(len(labels), features, generator=generator) + torch.as_tensor(labels)[:, None]
    y = torch.as_tensor(labels)
    dataset = Dataset("tiny", x, y, x[:test_samples].clone(), y[:test_samples].clone(), classes)
    offsets = np.cumsum([0, *sizes])
    federation = Federation(
        [np.arange(offsets[k], offsets[k + 1]) for k in range(len(sizes))], labels
    )
    return dataset, federation


def tiny_engine(
    strategy: Strategy | None,
    model: nn.Module | None = None,
    sizes: Sequence[int] = (3, 5),
    *,
    client_labels: Sequence[Sequence[int]] | None = None,
    dataset: Dataset | None = None,
    federation: Federation | None = None,
    data_seed: int = 0,
    test_samples: int = 4,
    mode: str = "batch",
    lr: float = 0.1,
    seed: int = 0,
    epochs: int | None = None,
    trainer: LocalTrainer | None = None,
    settings: dict[str, Any] | None = None,
) -> Engine:
    """An engine running ``strategy`` on ``model`` over :func:`client_data` of ``sizes``
    and ``client_labels``, or over the ``dataset`` (and ``federation``) given.

    ``settings`` are further :class:`~stratify.config.TrainConfig` values. Without a
    ``strategy`` the run's ``algorithm`` is built from their ``options``; without a
    ``federation``, ``build_experiment`` partitions ``dataset`` by their ``partition`` and
    ``clients``, and without a ``model`` it builds theirs. A hand-made federation is
    registered with the plain registry (seed 0).
    """
    if dataset is None:
        dataset, federation = client_data(
            sizes, client_labels, test_samples=test_samples, seed=data_seed
        )
    values = dict(settings or {})
    if strategy is not None:
        values.setdefault("algorithm", strategy.card.name)
    if epochs is not None:
        values["epochs"] = epochs
    config = TrainConfig(mode=mode, lr=lr, seed=seed, secure=False, **values)
    return build_experiment(
        config,
        dataset=dataset,
        federation=federation,
        registry=PlainRegistry(seed=0) if federation is not None else None,
        model=model,
        strategy=strategy,
        trainer=trainer,
    ).engine


# -- small models and the hand math of the baseline tests ------------------------------------


def linear(seed: int = 0) -> nn.Linear:
    """A linear classifier of the tiny data, initialised from ``seed``."""
    torch.manual_seed(seed)
    return nn.Linear(FEATURES, CLASSES)


def mlp(seed: int = 0) -> nn.Sequential:
    """A two-layer perceptron (6 hidden units, no normalisation) of the tiny data."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, 6), nn.ReLU(), nn.Linear(6, CLASSES))


def bn_mlp(seed: int = 0, norm: nn.Module | None = None) -> nn.Sequential:
    """:func:`mlp` with a normalisation layer (``model[1]``) after the first linear one:
    ``nn.BatchNorm1d(6)`` unless ``norm`` is given."""
    torch.manual_seed(seed)
    layer = nn.BatchNorm1d(6) if norm is None else norm
    return nn.Sequential(nn.Linear(FEATURES, 6), layer, nn.ReLU(), nn.Linear(6, CLASSES))


def bn_input(model: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """What the normalisation layer of a :func:`bn_mlp` receives for ``x`` (float64)."""
    return model[0](x).detach().double()


def ce_gradient(weight, bias, x, y):
    """Gradient of the mean cross-entropy of a linear model, by hand (numpy, float64)."""
    logits = x @ weight.T + bias
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    return p.T @ x / len(y), p.mean(0)


def numpy_params(model: nn.Linear) -> tuple[np.ndarray, np.ndarray]:
    """A linear model's weight and bias as float64 numpy arrays."""
    return model.weight.detach().double().numpy(), model.bias.detach().double().numpy()


def client_arrays(
    engine: Engine, client: int, order: Sequence[int] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The samples of ``client`` (or those at the indices ``order``) of an engine's data:
    features in float64 and labels, as numpy arrays for :func:`ce_gradient`."""
    indices = engine.federation.client_indices[client] if order is None else order
    x = engine.dataset.x_train[indices].double().numpy()
    return x, engine.dataset.y_train[indices].numpy()
