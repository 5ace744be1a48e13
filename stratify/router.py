"""The router: one loop that owns the global model and runs every method as a strategy.

A :class:`Strategy` (Flower-style) has a few hooks: which work a round does
(``configure_rounds``), the clients' local work (``fit``) and how updates come back
together (``aggregate``). :meth:`Router.run_epoch` is the one concrete loop. Stratify's
strategy executes a precomputed plan of hops; the averaging baselines broadcast, train
locally and aggregate; SFL passes the model sequentially.
"""

from __future__ import annotations

import copy
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from stratify.data.datasets import Dataset
from stratify.errors import ConfigError, TrainingError
from stratify.federation import Federation
from stratify.nn.models import model_bytes, parameter_bytes
from stratify.nn.norm import SumBatchNorm, client_split
from stratify.registry.base import RegistryResult
from stratify.selection import Plan

MODES = ("single-sample", "batch")
LR_SCHEDULES = ("inverse-epoch", "constant")
PROGRESS_EVERY = 1000


@dataclass
class Round:
    """The work a strategy configures for one round.

    Parameters
    ----------
    index : int
        Round number within the epoch.
    plan : Plan, optional
        Stratify: the hops or global batches to execute.
    clients : numpy.ndarray, optional
        Averaging baselines: the clients taking part, in order.
    """

    index: int
    plan: Plan | None = None
    clients: np.ndarray | None = None


@dataclass
class ClientUpdate:
    """What a client returns after its local work.

    Parameters
    ----------
    client : int
        Client id.
    num_samples : int
        Samples the client trained on (aggregation weight).
    state : dict
        The client's model state after local training (parameters and buffers).
    extra : dict
        Strategy-specific payload (e.g. SCAFFOLD's control-variate delta).
    """

    client: int
    num_samples: int
    state: dict[str, torch.Tensor]
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class EpochStats:
    """Counters of one epoch, as written to ``metrics.jsonl``."""

    steps: int = 0
    transfers: int = 0
    bytes_sent: int = 0
    skipped: int = 0
    loss_sum: float = 0.0
    loss_count: int = 0

    @property
    def train_loss(self) -> float:
        return self.loss_sum / max(self.loss_count, 1)


class Strategy(ABC):
    """A federated method as a set of hooks called by :meth:`Router.run_epoch`.

    Subclasses set ``name`` and ``description`` and take their options as explicit
    constructor arguments (the CLI rejects options a strategy's constructor lacks).
    """

    name: ClassVar[str] = "strategy"
    description: ClassVar[str] = ""
    modes: ClassVar[tuple[str, ...]] = MODES

    def setup(self, router: Router) -> None:
        """Called once before the first epoch (and again after a resume)."""

    @abstractmethod
    def configure_rounds(
        self, router: Router, epoch: int, rng: np.random.Generator
    ) -> Iterable[Round]:
        """The rounds of one epoch: which clients take part and what they do."""

    @abstractmethod
    def fit(self, router: Router, round_: Round, rng: np.random.Generator) -> list[ClientUpdate]:
        """The clients' local work for one round."""

    def aggregate(self, router: Router, round_: Round, updates: list[ClientUpdate]) -> None:
        """Fold the clients' updates into the global model (nothing for model passing)."""

    def state_dict(self) -> dict[str, Any]:
        """Strategy state a checkpoint must carry (e.g. control variates, momentum)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""


def learning_rate(base_lr: float, epoch: int, schedule: str = "inverse-epoch") -> float:
    """Learning rate of epoch ``epoch`` (1-based).

    ``inverse-epoch``: ``base_lr / epoch``, the classic decay for SGD with noisy (here
    batch-of-one) gradients; it depends on the epoch only, so a resumed run follows the
    same rates as an uninterrupted one. ``constant``: ``base_lr``.
    """
    if schedule == "inverse-epoch":
        return base_lr / epoch
    if schedule == "constant":
        return base_lr
    raise ConfigError(f"unknown --lr-schedule {schedule!r}; choose {' or '.join(LR_SCHEDULES)}")


def configure_cpu_for_single_sample() -> None:
    """Backend settings that make batch-of-one steps fastest on CPU (DESIGN §10)."""
    torch.set_num_threads(1)
    torch.backends.mkldnn.enabled = False


class Router:
    """Owns the global model and executes a strategy's rounds, counting traffic.

    Parameters
    ----------
    model : torch.nn.Module
        The global model, already on ``dataset``'s device.
    dataset : Dataset
        Train and test tensors, resident on the device.
    federation : Federation
        The clients and their samples.
    registry : RegistryResult
        Placeholders and global counts from the label registry.
    strategy : Strategy
        The method to run.
    mode : {"single-sample", "batch"}
        Learning setting.
    lr : float
        Base learning rate of the global (or local) SGD steps; :attr:`lr` holds the
        current epoch's rate.
    lr_schedule : {"inverse-epoch", "constant"}
        How the rate changes from epoch to epoch (:func:`learning_rate`).
    momentum : float
        SGD momentum of the global optimizer.
    seed : int
        Base seed; epoch ``e`` draws from ``numpy.random.default_rng([seed, e])``.
    """

    def __init__(
        self,
        model: nn.Module,
        dataset: Dataset,
        federation: Federation,
        registry: RegistryResult,
        strategy: Strategy,
        mode: str = "single-sample",
        lr: float = 0.01,
        lr_schedule: str = "constant",
        momentum: float = 0.0,
        seed: int = 0,
    ) -> None:
        if mode not in MODES:
            raise ConfigError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        if mode not in strategy.modes:
            raise ConfigError(f"{strategy.name} does not run in --mode {mode}")
        if not lr > 0:
            raise ConfigError(f"--lr must be positive, got {lr}")
        self.model = model
        self.dataset = dataset
        self.federation = federation
        self.registry = registry
        self.strategy = strategy
        self.mode = mode
        learning_rate(lr, 1, lr_schedule)  # validates the schedule name
        self.base_lr = lr
        self.lr_schedule = lr_schedule
        self.lr = lr
        self.momentum = momentum
        self.seed = seed
        self.device = dataset.x_train.device
        self.optimizer = self.make_optimizer(model)
        self.model_bytes = model_bytes(model)
        self.gradient_bytes = parameter_bytes(model)
        self.stats = EpochStats()
        # progress callback: called with steps done, every PROGRESS_EVERY steps at most
        self.on_steps: Callable[[int], None] | None = None
        strategy.setup(self)

    def make_optimizer(self, model: nn.Module, lr: float | None = None) -> torch.optim.Optimizer:
        return torch.optim.SGD(
            model.parameters(),
            lr=self.lr if lr is None else lr,
            momentum=self.momentum,
            foreach=True,
        )

    # -- the one loop -------------------------------------------------------------------

    def epoch_rng(self, epoch: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, epoch])

    def run_epoch(self, epoch: int) -> EpochStats:
        """Run one epoch of the strategy; returns its counters."""
        self.stats = EpochStats()
        self.lr = learning_rate(self.base_lr, epoch, self.lr_schedule)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr
        rng = self.epoch_rng(epoch)
        self.model.train()
        for round_ in self.strategy.configure_rounds(self, epoch, rng):
            updates = self.strategy.fit(self, round_, rng)
            self.strategy.aggregate(self, round_, updates)
        if not np.isfinite(self.stats.loss_sum):
            raise TrainingError(f"the training loss became non-finite in epoch {epoch}")
        return self.stats

    # -- traffic ------------------------------------------------------------------------

    def count_transfers(self, models: int, gradients: int = 0) -> None:
        """Record ``models`` model sends and ``gradients`` gradient uploads."""
        self.stats.transfers += models
        self.stats.bytes_sent += models * self.model_bytes + gradients * self.gradient_bytes

    # -- Stratify plans -----------------------------------------------------------------

    def execute_plan(self, plan: Plan, fused: bool = True) -> None:
        """Run a Stratify plan on the global model and count its traffic."""
        self.stats.skipped += plan.skipped
        if plan.batch_starts is None:
            self.count_transfers(plan.transfers)
            self.execute_single_sample(plan.samples)
        else:
            # each participant downloads the model and uploads its summed gradient
            transfers = plan.transfers
            self.count_transfers(transfers, gradients=transfers)
            self.execute_global_batches(plan, fused=fused)

    def execute_single_sample(self, samples: np.ndarray) -> None:
        """One SGD step per sample, batch of one: the latency-bound hot loop.

        Inputs are sliced from the device-resident training tensors by precomputed
        indices. Without momentum the step is ``torch.autograd.grad`` plus one fused
        ``_foreach_add_`` (no ``.grad`` zeroing, no optimizer bookkeeping: measured ~20%
        more steps/s on CPU than ``zero_grad``/``backward``/``step``); with momentum the
        optimizer steps. Losses stay on the device and are summed once at the end.
        """
        model, optimizer, lr = self.model, self.optimizer, self.lr
        parameters = [p for p in model.parameters() if p.requires_grad]
        plain_sgd = self.momentum == 0
        x_train, y_train = self.dataset.x_train, self.dataset.y_train
        losses: list[torch.Tensor] = []
        indices = samples.tolist()
        for block_start in range(0, len(indices), PROGRESS_EVERY):
            block = indices[block_start : block_start + PROGRESS_EVERY]
            for index in block:
                loss = F.cross_entropy(
                    model(x_train[index : index + 1]), y_train[index : index + 1]
                )
                gradients = torch.autograd.grad(loss, parameters)
                if plain_sgd:
                    with torch.no_grad():
                        torch._foreach_add_(parameters, gradients, alpha=-lr)
                else:
                    for parameter, gradient in zip(parameters, gradients):
                        parameter.grad = gradient
                    optimizer.step()
                losses.append(loss.detach())
            if self.on_steps is not None:
                self.on_steps(len(block))
        self.stats.steps += len(samples)
        if losses:
            self.stats.loss_sum += float(torch.stack(losses).sum())
        self.stats.loss_count += len(samples)

    def execute_global_batches(self, plan: Plan, fused: bool = True) -> None:
        """One optimizer step per global batch: sum of client gradients divided by B."""
        starts = plan.batch_starts
        for start, stop in zip(starts[:-1].tolist(), starts[1:].tolist()):
            samples = plan.samples[start:stop]
            clients = plan.clients[start:stop]
            self.optimizer.zero_grad(set_to_none=False)
            loss_sum = self.accumulate_batch_gradient(samples, clients, fused=fused)
            self.optimizer.step()
            self.stats.steps += 1
            self.stats.loss_sum += loss_sum
            self.stats.loss_count += len(samples)
            if self.on_steps is not None:
                self.on_steps(len(samples))

    def accumulate_batch_gradient(
        self, samples: np.ndarray, clients: np.ndarray, fused: bool = True
    ) -> float:
        """Add ``(1/B) Σ_clients ∇ Σ_{i ∈ client} loss_i`` to the parameters' ``.grad``.

        ``samples`` are grouped by client in contiguous segments. The fused path runs the
        global batch as one tensor; the explicit path runs each client separately and sums
        the client gradients. Both give the same gradient, because the gradient of a sum
        is the sum of gradients. Sum-based BatchNorm layers couple the clients through
        their per-client partial sums; in both paths they receive the client segments
        (the explicit path runs the union once per BN synchronisation point, which is
        the whole forward here), so models with BN always take the segmented union.
        Returns the summed loss.
        """
        batch_size = len(samples)
        boundaries = np.flatnonzero(np.diff(clients)) + 1
        segments = np.split(np.arange(batch_size), boundaries)
        client_sizes = [len(segment) for segment in segments]
        index = torch.as_tensor(samples, device=self.device)
        if fused or self.has_batch_statistics():
            with client_split(self.model, client_sizes):
                logits = self.model(self.dataset.x_train[index])
                loss = F.cross_entropy(logits, self.dataset.y_train[index], reduction="sum")
            (loss / batch_size).backward()
            return float(loss.detach())
        total = 0.0
        for segment in segments:
            client_index = index[segment[0] : segment[-1] + 1]
            loss = F.cross_entropy(
                self.model(self.dataset.x_train[client_index]),
                self.dataset.y_train[client_index],
                reduction="sum",
            )
            (loss / batch_size).backward()
            total += float(loss.detach())
        return total

    def has_batch_statistics(self) -> bool:
        """Whether a layer normalises over the batch, coupling the clients of a batch."""
        return any(
            isinstance(module, (nn.modules.batchnorm._NormBase, SumBatchNorm))
            for module in self.model.modules()
        )

    # -- local work for the baselines ---------------------------------------------------

    def local_sgd(
        self,
        model: nn.Module,
        indices: np.ndarray,
        epochs: int,
        batch_size: int,
        rng: np.random.Generator,
        lr: float | None = None,
        penalty: Callable[[nn.Module], torch.Tensor] | None = None,
        before_step: Callable[[nn.Module], None] | None = None,
    ) -> int:
        """Train ``model`` on a client's samples with plain mini-batch SGD.

        Parameters
        ----------
        model : torch.nn.Module
            The client's copy of the model; trained in place.
        indices : numpy.ndarray
            The client's training-sample indices.
        epochs, batch_size : int
            Local epochs and mini-batch size (1 in the single-sample setting).
        rng : numpy.random.Generator
            Shuffles the client's samples every local epoch.
        lr : float, optional
            Local learning rate (default: the router's).
        penalty : callable, optional
            Extra loss term ``penalty(model)`` added to every mini-batch (FedProx).
        before_step : callable, optional
            Called after ``backward`` and before the step, e.g. to correct gradients
            (SCAFFOLD).

        Returns
        -------
        int
            Local optimizer steps taken.
        """
        optimizer = torch.optim.SGD(model.parameters(), lr=self.lr if lr is None else lr)
        x_train, y_train = self.dataset.x_train, self.dataset.y_train
        model.train()
        steps = 0
        losses = torch.zeros((), device=self.device)
        for _ in range(epochs):
            order = torch.as_tensor(rng.permutation(indices), device=self.device)
            for start in range(0, len(order), batch_size):
                batch = order[start : start + batch_size]
                loss = F.cross_entropy(model(x_train[batch]), y_train[batch])
                losses += loss.detach() * len(batch)
                if penalty is not None:
                    loss = loss + penalty(model)
                optimizer.zero_grad(set_to_none=False)
                loss.backward()
                if before_step is not None:
                    before_step(model)
                optimizer.step()
                steps += 1
        self.stats.steps += steps
        self.stats.loss_sum += float(losses)
        self.stats.loss_count += epochs * len(indices)
        return steps

    def client_copy(self) -> nn.Module:
        """A fresh copy of the global model, as a client receives it."""
        return copy.deepcopy(self.model)

    # -- evaluation ---------------------------------------------------------------------

    @torch.no_grad()
    def evaluate(self, batch_size: int = 1000) -> tuple[float, float]:
        """Test accuracy and mean cross-entropy of the global model."""
        self.model.eval()
        x_test, y_test = self.dataset.x_test, self.dataset.y_test
        correct = 0
        loss_sum = 0.0
        for start in range(0, len(x_test), batch_size):
            logits = self.model(x_test[start : start + batch_size])
            targets = y_test[start : start + batch_size]
            loss_sum += float(F.cross_entropy(logits, targets, reduction="sum"))
            correct += int((logits.argmax(dim=1) == targets).sum())
        self.model.train()
        return correct / len(x_test), loss_sum / len(x_test)


class Timer:
    """Wall-clock seconds of a block, synchronising CUDA so GPU work is counted."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds = 0.0

    def __enter__(self) -> Timer:
        self._sync()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self._sync()
        self.seconds = time.perf_counter() - self._start

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
