"""The client side: local training of a copy of the global model on a client's samples.

Every method whose clients train their own copy one client at a time (the averaging
baselines, SFL's sequential passes) uses :class:`LocalTrainer`; what differs between them
enters through a gradient hook (FedProx's proximal gradient, SCAFFOLD's correction) or a
loss function (LfD, FedBR). The one exception is FedTAN's first local step, where the
clients step together and exchange BatchNorm statistics: it runs its own lockstep loop
(docs/architecture.md, "Client side").
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from stratify.nn.norm import has_batch_norm

#: devices where ``torch.optim.SGD(fused=True)`` runs
FUSED_DEVICES = ("cpu", "cuda")

#: ``hook(model)`` runs after ``backward`` and before the step: it may change ``.grad``.
GradientHook = Callable[[nn.Module], None]

#: ``loss(model, x, y)``: the mean training loss of a mini-batch (default: cross-entropy of
#: ``model(x)``); a method with its own local objective (LfD's drift regulariser) passes one.
LossFunction = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The default local objective: mean cross-entropy of ``model(x)`` against ``y``."""
    return F.cross_entropy(model(x), y)


def batch_bounds(num_samples: int, batch_size: int, merge_singleton: bool) -> list[tuple[int, int]]:
    """``[start, stop)`` of each mini-batch of one pass over ``num_samples`` samples.

    With ``merge_singleton`` a last batch of a single sample joins the one before it
    (``batch_size + 1`` samples): batch-statistics norms cannot normalise one sample, and
    merging keeps the sample where dropping it would never train on it.
    """
    bounds = [
        (start, min(start + batch_size, num_samples)) for start in range(0, num_samples, batch_size)
    ]
    if merge_singleton and len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] == 1:
        bounds[-2:] = [(bounds[-2][0], num_samples)]
    return bounds


def local_optimizer(
    model: nn.Module, lr: float, momentum: float = 0.0, weight_decay: float = 0.0
) -> torch.optim.SGD:
    """A client's SGD, with torch's fused update where it has one for the parameters.

    The fused step updates every parameter (momentum and weight decay included) in one
    kernel instead of a few per tensor: the same arithmetic, rounded once where the
    per-tensor loop rounds twice (docs/architecture.md, "Performance").

    Parameters
    ----------
    model : torch.nn.Module
        The client's model.
    lr, momentum, weight_decay : float
        Of the SGD update.
    """
    parameters = list(model.parameters())
    fused = all(p.is_floating_point() and p.device.type in FUSED_DEVICES for p in parameters)
    return torch.optim.SGD(
        parameters, lr=lr, momentum=momentum, weight_decay=weight_decay, fused=fused or None
    )


class LocalResult:
    """Counters of one client's local training.

    Parameters
    ----------
    steps : int
        Local optimizer steps.
    loss_sum : float
        Sum over the trained samples of their local loss (before the step).
    samples : int
        Samples trained on, passes counted (``epochs × n_k`` when every epoch trains on
        all ``n_k``).
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
        indices: np.ndarray | Sequence[np.ndarray],
        *,
        epochs: int,
        batch_size: int,
        lr: float,
        rng: np.random.Generator,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        before_step: GradientHook | None = None,
        loss_fn: LossFunction = cross_entropy_loss,
    ) -> LocalResult:
        """Train ``model`` in place on the samples ``indices``.

        Parameters
        ----------
        model : torch.nn.Module
            The client's model (its copy of the global one, or the travelling model).
        indices : numpy.ndarray or sequence of numpy.ndarray
            The client's training-sample indices, the same in every local epoch; or one
            array per local epoch (``epochs`` of them) for a method whose samples change
            from epoch to epoch (FedBSS's paced subsets).
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
        loss_fn : callable
            ``loss_fn(model, x, y)``: the mini-batch's mean loss (default cross-entropy);
            the reported ``loss_sum`` adds up what it returns.
        """
        optimizer = local_optimizer(model, lr, momentum, weight_decay)
        x_train, y_train = self.x_train, self.y_train
        per_epoch = [indices] * epochs if isinstance(indices, np.ndarray) else list(indices)
        if len(per_epoch) != epochs:
            raise ValueError(f"{len(per_epoch)} arrays of indices for {epochs} local epochs")
        model.train()
        steps = 0
        losses = torch.zeros((), device=x_train.device)
        merge_singleton = has_batch_norm(model)
        for epoch_indices in per_epoch:
            order = torch.as_tensor(rng.permutation(epoch_indices), device=x_train.device)
            for start, stop in batch_bounds(len(epoch_indices), batch_size, merge_singleton):
                batch = order[start:stop]
                loss = loss_fn(model, x_train[batch], y_train[batch])
                losses += loss.detach() * len(batch)
                optimizer.zero_grad(set_to_none=False)
                loss.backward()
                if before_step is not None:
                    before_step(model)
                optimizer.step()
                steps += 1
        return LocalResult(steps, float(losses), sum(len(part) for part in per_epoch))
