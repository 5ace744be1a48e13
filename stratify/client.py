"""The client side: local training of a copy of the global model on a client's samples.

Every method whose clients train their own copy (the averaging baselines, SFL's sequential
passes) uses :class:`LocalTrainer`; what differs between methods enters through a
gradient hook (FedProx's proximal gradient, SCAFFOLD's correction), never through a
second training loop (docs/architecture.md, "Client side").
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

#: ``hook(model)`` runs after ``backward`` and before the step: it may change ``.grad``.
GradientHook = Callable[[nn.Module], None]


class LocalResult:
    """Counters of one client's local training.

    Parameters
    ----------
    steps : int
        Local optimizer steps.
    loss_sum : float
        Sum over the trained samples of their cross-entropy (before the step).
    samples : int
        Samples trained on, passes counted (``epochs × n_k``).
    """

    __slots__ = ("steps", "loss_sum", "samples")

    def __init__(self, steps: int, loss_sum: float, samples: int) -> None:
        self.steps = steps
        self.loss_sum = loss_sum
        self.samples = samples


class LocalTrainer:
    """Mini-batch SGD of a client on its own samples.

    Parameters
    ----------
    x_train, y_train : torch.Tensor
        Training tensors on the device; a client reads only its own indices.
    """

    def __init__(self, x_train: torch.Tensor, y_train: torch.Tensor) -> None:
        self.x_train = x_train
        self.y_train = y_train

    @staticmethod
    def receive(global_model: nn.Module) -> nn.Module:
        """A fresh copy of the global model, as a client receives it."""
        return copy.deepcopy(global_model)

    def train(
        self,
        model: nn.Module,
        indices: np.ndarray,
        *,
        epochs: int,
        batch_size: int,
        lr: float,
        rng: np.random.Generator,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        before_step: GradientHook | None = None,
    ) -> LocalResult:
        """Train ``model`` in place on the samples ``indices``.

        Parameters
        ----------
        model : torch.nn.Module
            The client's model (its copy of the global one, or the travelling model).
        indices : numpy.ndarray
            The client's training-sample indices.
        epochs, batch_size : int
            Local epochs and mini-batch size (1 in the single-sample setting).
        lr : float
            Local learning rate.
        rng : numpy.random.Generator
            Shuffles the client's samples every local epoch.
        momentum, weight_decay : float
            Of the local SGD optimizer, made afresh for every call: clients keep no
            optimizer state between rounds.
        before_step : callable, optional
            Gradient hook called after ``backward`` and before the step.
        """
        optimizer = torch.optim.SGD(
            model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay
        )
        x_train, y_train = self.x_train, self.y_train
        model.train()
        steps = 0
        losses = torch.zeros((), device=x_train.device)
        for _ in range(epochs):
            order = torch.as_tensor(rng.permutation(indices), device=x_train.device)
            for start in range(0, len(order), batch_size):
                batch = order[start : start + batch_size]
                loss = F.cross_entropy(model(x_train[batch]), y_train[batch])
                losses += loss.detach() * len(batch)
                optimizer.zero_grad(set_to_none=False)
                loss.backward()
                if before_step is not None:
                    before_step(model)
                optimizer.step()
                steps += 1
        return LocalResult(steps, float(losses), epochs * len(indices))
