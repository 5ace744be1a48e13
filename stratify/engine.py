"""The engine: the one loop that owns the global model and runs any method's hooks.

:meth:`Engine.run_epoch` asks the strategy (:mod:`stratify.method`) for the epoch's
rounds, lets it fit and aggregate them, applies the state it returns, adds up the
counters and turns them into traffic (docs/architecture.md, "Data flow").
"""

from __future__ import annotations

from collections.abc import Callable, Generator

import numpy as np
from torch import nn

from stratify.client import LocalTrainer
from stratify.data.datasets import Dataset
from stratify.data.holdout import EvaluationSet
from stratify.errors import TrainingError
from stratify.evaluation import TestMetrics, test_metrics
from stratify.federation import Federation
from stratify.method import (
    LR_SCHEDULES,
    Context,
    EpochStats,
    LocalWork,
    Strategy,
    learning_rate,
    local_work,
)
from stratify.nn.models import model_bytes, parameter_bytes
from stratify.options import MODES
from stratify.registry.base import RegistryResult
from stratify.state import load_into
from stratify.validation import check_choice, check_positive


class Engine:
    """Owns the global model and executes a strategy's rounds, counting traffic.

    Build it with :func:`stratify.experiment.build_experiment`, which holds the defaults.

    Parameters
    ----------
    model : torch.nn.Module
        The global model, already on ``dataset``'s device.
    dataset : Dataset
        Train and test tensors, resident on the device.
    federation : Federation
        The clients and their samples.
    placeholders : RegistryResult
        What the label registry produced (placeholders, client maps, global counts).
    strategy : Strategy
        The method to run.
    mode : {"single-sample", "batch"}
        Learning setting.
    lr : float
        Base learning rate.
    lr_schedule : {"inverse-epoch", "constant"}
        How the rate changes from epoch to epoch (:func:`learning_rate`).
    seed : int
        Base seed; epoch ``e`` draws from ``numpy.random.default_rng([seed, e])``.
    trainer : LocalTrainer, optional
        Local training of the clients (default: plain SGD on ``dataset``).
    total_epochs : int, optional
        The run's number of epochs, passed to the strategy (:class:`Context`).
    validation : EvaluationSet, optional
        Training samples held out to choose on (:meth:`validation_metrics`).
    """

    def __init__(
        self,
        model: nn.Module,
        dataset: Dataset,
        federation: Federation,
        placeholders: RegistryResult,
        strategy: Strategy,
        *,
        mode: str,
        lr: float,
        lr_schedule: str,
        seed: int,
        trainer: LocalTrainer | None = None,
        total_epochs: int | None = None,
        validation: EvaluationSet | None = None,
    ) -> None:
        check_choice(mode, "--mode", MODES)
        check_choice(lr_schedule, "--lr-schedule", LR_SCHEDULES)
        self.base_lr = check_positive(lr, "--lr")
        self.model = model
        self.dataset = dataset
        self.federation = federation
        self.placeholders = placeholders
        self.strategy = strategy
        self.mode = mode
        self.lr_schedule = lr_schedule
        self.seed = seed
        self.validation = validation
        self.device = dataset.x_train.device
        self.context = Context(
            model=model,
            x_train=dataset.x_train,
            y_train=dataset.y_train,
            federation=federation,
            placeholders=placeholders,
            mode=mode,
            trainer=trainer or LocalTrainer(dataset.x_train, dataset.y_train),
            lr=learning_rate(self.base_lr, 1, lr_schedule),
            total_epochs=total_epochs,
            domains_train=dataset.domains_train,
        )
        strategy.setup(self.context)
        # after setup: a method may change what travels (LfD replaces the model's head)
        self.model_bytes = model_bytes(model)
        self.gradient_bytes = parameter_bytes(model)

    @property
    def on_steps(self) -> Callable[[int], None] | None:
        return self.context.on_steps

    @on_steps.setter
    def on_steps(self, callback: Callable[[int], None] | None) -> None:
        self.context.on_steps = callback

    def epoch_rng(self, epoch: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, epoch])

    def run_epoch(self, epoch: int) -> EpochStats:
        """Run one epoch of the strategy; returns its counters."""
        program = self.epoch_program(epoch)
        try:
            next(program)
        except StopIteration as done:
            return done.value
        raise AssertionError("an epoch run alone hands out no jobs")

    def epoch_program(
        self, epoch: int, jobs: bool = False
    ) -> Generator[LocalWork, None, EpochStats]:
        """One epoch, as a generator: with ``jobs``, every round the strategy can give as
        :class:`~stratify.method.LocalWork` is handed out (yielded), and continues once
        the caller has run its jobs (``send(None)``); the others run through ``fit``.
        Returns the epoch's counters. :mod:`stratify.vectorize` drives many runs' programs
        together; :meth:`run_epoch` drives one without jobs."""
        stats = EpochStats()
        clients: set[int] = set()
        self.context.epoch = epoch
        self.context.lr = learning_rate(self.base_lr, epoch, self.lr_schedule)
        rng = self.epoch_rng(epoch)
        self.model.train()
        for round_ in self.strategy.configure_rounds(self.context, epoch, rng):
            stats.add(round_.stats)
            work = local_work(self.strategy, self.context, round_, rng) if jobs else None
            if work is None:
                updates = self.strategy.fit(self.context, round_, rng)
            else:
                yield work
                updates = work.finish()
            for update in updates:
                stats.add(update.stats)
                if update.client >= 0:
                    clients.add(update.client)
            new_state = self.strategy.aggregate(self.context, round_, updates)
            if new_state is not None:
                load_into(self.model, new_state)
        stats.bytes_sent = (
            stats.transfers * self.model_bytes
            + stats.uploads * self.gradient_bytes
            + stats.extra_bytes
        )
        stats.clients = sorted(clients)
        stats.info = self.strategy.epoch_info(self.context)
        if not np.isfinite(stats.loss_sum):
            raise TrainingError(f"the training loss became non-finite in epoch {epoch}")
        return stats

    def evaluate(self, batch_size: int = 1000) -> tuple[float, float]:
        """Test accuracy and mean cross-entropy of the global model."""
        result = self.test_metrics(batch_size)
        return result.accuracy, result.loss

    def test_metrics(self, batch_size: int = 1000) -> TestMetrics:
        """The global model on the test set (:func:`stratify.evaluation.test_metrics`)."""
        return test_metrics(
            self.model,
            self.dataset.x_test,
            self.dataset.y_test,
            self.dataset.domains_test,
            batch_size,
        )

    def validation_metrics(self, batch_size: int = 1000) -> TestMetrics | None:
        """The global model on the held-out validation split; ``None`` without one."""
        if self.validation is None:
            return None
        return test_metrics(
            self.model, self.validation.x, self.validation.y, self.validation.domains, batch_size
        )
