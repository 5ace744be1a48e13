"""How a stream learner trains as events arrive: a policy with a few hooks.

:class:`SingleSampleUpdates` is Stratify online: after every arriving event the server
schedules single-sample updates along the SLS over the placeholders the buffers hold now
(:class:`~stratify.stream.schedule.StreamSchedule`) and the model travels to the clients
holding them. :class:`PeriodicFedAvg` is the baseline it is compared with: every few
events, one FedAvg round (the engine's ``fedavg`` strategy, unchanged) over what the same
buffers hold (docs/architecture.md, "Streaming").
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from stratify.config import TrainConfig
from stratify.data.datasets import Dataset
from stratify.errors import ConfigError
from stratify.experiment import build_experiment
from stratify.federation import Federation
from stratify.registry import PlainRegistry
from stratify.stratify import single_sample_sgd
from stratify.stream.schedule import StreamSchedule

if TYPE_CHECKING:  # the learner imports this module
    from stratify.stream.learner import StreamLearner


class StreamPolicy(ABC):
    """Training hooks a :class:`~stratify.stream.learner.StreamLearner` calls.

    ``optimizer`` is the policy's SGD optimizer over the model, if it keeps one; the
    learner replaces it when the classifier grows, carrying its state over.
    """

    name: str = "policy"
    optimizer: torch.optim.SGD | None = None

    def setup(self, learner: StreamLearner) -> None:
        """Called once the learner has its model and buffers."""

    @abstractmethod
    def after_arrival(self, learner: StreamLearner) -> None:
        """Train after an event was buffered (test-then-train: it was predicted first)."""

    def counters(self) -> dict[str, int]:
        """The policy's own counters for the metrics (e.g. transfers)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must carry."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (after :meth:`setup`)."""


class SingleSampleUpdates(StreamPolicy):
    """Stratify online: ``steps_per_event`` single-sample steps after every event.

    Each step takes the next placeholder of the SLS over the available placeholders,
    routes it to a client holding it (chunk size ``chunk``, ``selection``), and that
    client trains the travelling model on one of its buffered samples of that label
    (:meth:`~stratify.stream.buffers.ClientBuffers.pick`), one SGD step.

    Parameters
    ----------
    steps_per_event : int
        Single-sample steps after each arriving event.
    chunk : int
        Chunk size CS.
    selection : {"uniform", "weighted"}
        Client selection among the holders of a placeholder.
    lr : float
        Learning rate (constant: a stream has no epochs to decay over).
    momentum : float
        SGD momentum.
    seed : int
        Seeds the schedule's generator.
    """

    name = "stratify"

    def __init__(
        self,
        steps_per_event: int = 1,
        chunk: int = 5,
        selection: str = "uniform",
        lr: float = 0.01,
        momentum: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.steps_per_event = steps_per_event
        self.lr = lr
        self.momentum = momentum
        self.schedule = StreamSchedule(chunk, selection, np.random.default_rng([seed, 0x5C4ED]))

    def setup(self, learner: StreamLearner) -> None:
        self.optimizer = torch.optim.SGD(
            learner.model.parameters(), lr=self.lr, momentum=self.momentum, foreach=True
        )

    def after_arrival(self, learner: StreamLearner) -> None:
        assert self.optimizer is not None  # setup ran
        buffers = learner.buffers
        for _ in range(self.steps_per_event):
            placeholder, client = self.schedule.next_step(buffers.counts)
            if client < 0:
                return
            slot = buffers.pick(client, placeholder)
            learner.stats.pending_losses += single_sample_sgd(
                learner.model, self.optimizer, buffers.x, buffers.y, [slot], self.lr
            )
            learner.stats.steps += 1
            learner.stats.trained_samples += 1
            buffers.use(slot)

    def counters(self) -> dict[str, int]:
        return {"transfers": self.schedule.transfers, "skipped_entries": self.schedule.skipped}

    def state_dict(self) -> dict[str, Any]:
        assert self.optimizer is not None  # setup ran
        return {"optimizer": self.optimizer.state_dict(), "schedule": self.schedule.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        assert self.optimizer is not None  # setup ran
        self.optimizer.load_state_dict(state["optimizer"])
        self.schedule.load_state_dict(state["schedule"])


class PeriodicFedAvg(StreamPolicy):
    """The FedAvg-style baseline: every ``every`` events, one FedAvg round on the buffers.

    Each client holding samples trains a copy of the global model on its whole buffer
    (``local_epochs`` passes, mini-batches of ``local_batch_size``, local SGD momentum)
    and the server averages the copies weighted by buffer size: the engine's ``fedavg``
    strategy in batch mode, run on a federation made of the buffers' current contents.
    It stores exactly what :class:`SingleSampleUpdates` stores (the same buffers).

    Parameters
    ----------
    every : int
        Events between two rounds.
    local_epochs : int
        Passes over its buffer a client makes per round.
    local_batch_size : int
        Local mini-batch size.
    lr : float
        Local learning rate (constant).
    local_momentum : float
        Momentum of the clients' local SGD.
    seed : int
        Seeds the rounds (client order, shuffles).
    """

    name = "fedavg-periodic"

    def __init__(
        self,
        every: int = 500,
        local_epochs: int = 1,
        local_batch_size: int = 32,
        lr: float = 0.01,
        local_momentum: float = 0.9,
        seed: int = 0,
    ) -> None:
        self.every = every
        self.lr = lr
        self.seed = seed
        self.options = {
            "local_epochs": local_epochs,
            "local_batch_size": local_batch_size,
            "local_momentum": local_momentum,
        }
        self.since_round = 0
        self.rounds = 0
        self.transfers = 0

    def setup(self, learner: StreamLearner) -> None:
        if learner.buffers.max_uses is not None:
            raise ConfigError(
                "the periodic FedAvg baseline trains on every buffered sample each round; "
                "--max-uses applies to single-sample updates only"
            )

    def after_arrival(self, learner: StreamLearner) -> None:
        self.since_round += 1
        if self.since_round >= self.every:
            self.since_round = 0
            self.retrain(learner)

    def retrain(self, learner: StreamLearner) -> None:
        """One FedAvg round over every client that buffers samples."""
        buffers = learner.buffers
        held = [buffers.client_slots(client) for client in range(buffers.num_clients)]
        held = [slots for slots in held if len(slots)]
        if not held:
            return
        dataset = Dataset(
            name="stream-buffers",
            x_train=buffers.x,
            y_train=buffers.y,
            x_test=buffers.x[:0],
            y_test=buffers.y[:0],
            num_classes=learner.rows,
        )
        config = TrainConfig(
            dataset="stream-buffers",
            algorithm="fedavg",
            mode="batch",
            lr=self.lr,
            lr_schedule="constant",
            seed=self.seed,
            secure=False,
            options=self.options,
        )
        engine = build_experiment(
            config,
            dataset=dataset,
            federation=Federation(held, buffers.y.cpu().numpy()),
            registry=PlainRegistry(seed=self.seed),
            model=learner.model,
        ).engine
        self.rounds += 1
        stats = engine.run_epoch(self.rounds)
        learner.stats.steps += stats.steps
        learner.stats.trained_samples += stats.loss_count
        learner.stats.loss_sum += stats.loss_sum
        learner.stats.loss_count += stats.loss_count
        self.transfers += stats.transfers

    def counters(self) -> dict[str, int]:
        return {"transfers": self.transfers, "rounds": self.rounds}

    def state_dict(self) -> dict[str, Any]:
        return {"since_round": self.since_round, "rounds": self.rounds, "transfers": self.transfers}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in ("since_round", "rounds", "transfers"):
            setattr(self, name, int(state[name]))
