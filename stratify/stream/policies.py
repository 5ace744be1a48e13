"""How a stream learner trains as events arrive: a policy with a few hooks.

:class:`SingleSampleUpdates` is Stratify online: after every arriving event the server
schedules single-sample updates along the SLS over the placeholders the buffers hold now
(:class:`~stratify.stream.schedule.StreamSchedule`) and the model travels to the clients
holding them. :class:`PeriodicFedAvg` is the baseline it is compared with: every few
events, one FedAvg round (the engine's ``fedavg`` strategy, unchanged) over what the same
buffers hold (docs/architecture.md, "Streaming").

As a :class:`~stratify.method.Strategy` does, a policy sees a narrow
:class:`StreamContext` (the model, the buffers, the features as the model sees them)
and returns what it did (:class:`Training`); the learner keeps the counters. The policy
owns its optimizer state (Stratify's: a :class:`~stratify.stream.step.SingleSampleStep`):
when parameters are replaced (a grown classifier, a widened input),
:meth:`StreamPolicy.classifier_grown` tells it which. A policy says on its class whether
it can train the stream's NumPy MLP (:attr:`StreamPolicy.numpy_models`); the engine and
torch are imported only by a policy that needs them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from stratify.errors import ConfigError, TrainingError
from stratify.stream.buffers import ClientBuffers
from stratify.stream.schedule import StreamSchedule
from stratify.stream.step import SingleSampleStep

if TYPE_CHECKING:
    import torch

    from stratify.stream.model import StreamModel

#: what ``--algorithm`` of ``stratify stream`` may be
STREAM_ALGORITHMS = ("stratify", "fedavg-periodic")


class DivergenceError(TrainingError):
    """The loss or the weights became non-finite; learning stopped (``--on-diverge stop``)."""


@dataclass
class StreamContext:
    """What a policy sees: the model it trains and the buffers it trains on.

    Attributes
    ----------
    model : StreamModel
        The global model (the policy trains it in place,
        :class:`~stratify.stream.model.StreamModel`): its ``network`` is the stream's
        NumPy MLP (:class:`~stratify.stream.mlp.NumpyMLP`) only for a policy whose
        :attr:`~StreamPolicy.numpy_models` is true, else a torch module.
    buffers : ClientBuffers
        The clients' buffers (read-only for the policy, except :meth:`ClientBuffers.use`).
    rows : int
        Rows of the classifier now.
    transform : callable
        Features as the model sees them (the running standardisation, or identity).
    """

    model: StreamModel
    buffers: ClientBuffers
    rows: int
    transform: Callable[[torch.Tensor], torch.Tensor]


@dataclass
class Training:
    """What a policy did after one arrival.

    Attributes
    ----------
    steps : int
        Optimizer steps taken.
    trained_samples : int
        Per-sample gradients computed.
    losses : list of torch.Tensor
        The loss of every single-sample step, still on the device.
    loss_sum, loss_count : float, int
        Losses already summed (a FedAvg round's), and the samples they cover.
    transfers : int
        Model transfers these steps made.
    """

    steps: int = 0
    trained_samples: int = 0
    losses: list[torch.Tensor] = field(default_factory=list)
    loss_sum: float = 0.0
    loss_count: int = 0
    transfers: int = 0


class StreamPolicy(ABC):
    """Training hooks a :class:`~stratify.stream.learner.StreamLearner` calls."""

    name: str = "policy"
    #: whether it trains a :class:`~stratify.stream.mlp.NumpyMLP` (else the learner
    #: builds torch models for it)
    numpy_models: bool = False

    def setup(self, context: StreamContext) -> None:
        """Called once the learner has its model and buffers."""

    @abstractmethod
    def after_arrival(self, context: StreamContext) -> Training:
        """Train after an event was buffered (test-then-train: it was predicted first);
        returns what was done."""

    def classifier_grown(self, context: StreamContext, replaced: dict[int, Any]) -> None:
        """The classifier got new rows: ``replaced`` maps the ``id`` of every replaced
        parameter to its successor (carry any state kept over the old ones)."""

    def save_point(self) -> Any:
        """The policy's training state, to be put back by :meth:`restore_point` when the
        updates that follow are undone (``--on-diverge skip``)."""
        return None

    def restore_point(self, point: Any) -> None:
        """Put back the state :meth:`save_point` returned."""

    def counters(self) -> dict[str, int]:
        """The policy's own counters for the metrics (e.g. transfers)."""
        return {}

    def step_flags(self) -> str:
        """The flags that set the step size, with their values, for a divergence message."""
        return ""

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
    dp_clip : float, optional
        Differential privacy: each step's gradient clipped to this norm and noised
        (:class:`~stratify.stream.step.SingleSampleStep`); ``None``: plain steps.
    dp_noise : float
        The noise multiplier σ (with ``dp_clip``).
    dp_seed : int, optional
        Seeds the noise; ``None``: the operating system's entropy.
    """

    name = "stratify"
    numpy_models = True

    def __init__(
        self,
        steps_per_event: int = 1,
        chunk: int = 5,
        selection: str = "uniform",
        lr: float = 0.01,
        momentum: float = 0.0,
        seed: int = 0,
        dp_clip: float | None = None,
        dp_noise: float = 0.0,
        dp_seed: int | None = None,
    ) -> None:
        self.steps_per_event = steps_per_event
        self.lr = lr
        self.momentum = momentum
        self.dp = (dp_clip, dp_noise, dp_seed)
        self.schedule = StreamSchedule(chunk, selection, np.random.default_rng([seed, 0x5C4ED]))
        self.step: SingleSampleStep | None = None

    def setup(self, context: StreamContext) -> None:
        self.step = SingleSampleStep(context.model.network, self.lr, self.momentum, *self.dp)

    def after_arrival(self, context: StreamContext) -> Training:
        assert self.step is not None  # setup ran
        buffers = context.buffers
        done = Training()
        transfers = self.schedule.transfers
        for _ in range(self.steps_per_event):
            placeholder, client = self.schedule.next_step(buffers.counts)
            if client < 0:
                break
            slot = buffers.pick(client, placeholder)
            loss = context.model.learn(self.step, buffers, slot)
            if isinstance(loss, float):
                done.loss_sum += loss
                done.loss_count += 1
            else:
                done.losses.append(loss)
            done.steps += 1
            done.trained_samples += 1
            buffers.use(slot)
        done.transfers = self.schedule.transfers - transfers
        return done

    def classifier_grown(self, context: StreamContext, replaced: dict[int, Any]) -> None:
        assert self.step is not None  # setup ran
        self.step.follow(context.model.network, replaced)

    def save_point(self) -> Any:
        assert self.step is not None  # setup ran
        return self.step.save_point()

    def restore_point(self, point: Any) -> None:
        assert self.step is not None  # setup ran
        self.step.restore_point(point)

    def counters(self) -> dict[str, int]:
        return {"transfers": self.schedule.transfers, "skipped_entries": self.schedule.skipped}

    def step_flags(self) -> str:
        return (
            f"--lr {self.lr:g} --momentum {self.momentum:g} "
            f"--steps-per-event {self.steps_per_event}"
        )

    def state_dict(self) -> dict[str, Any]:
        assert self.step is not None  # setup ran
        return {"optimizer": self.step.state_dict(), "schedule": self.schedule.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        assert self.step is not None  # setup ran
        self.step.load_state_dict(state["optimizer"])
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

    def setup(self, context: StreamContext) -> None:
        if context.buffers.max_uses is not None:
            raise ConfigError(
                "the periodic FedAvg baseline trains on every buffered sample each round; "
                "--max-uses applies to single-sample updates only"
            )

    def after_arrival(self, context: StreamContext) -> Training:
        self.since_round += 1
        if self.since_round < self.every:
            return Training()
        self.since_round = 0
        return self.retrain(context)

    def retrain(self, context: StreamContext) -> Training:
        """One FedAvg round over every client that buffers samples."""
        buffers = context.buffers
        held = [buffers.client_slots(client) for client in range(buffers.num_clients)]
        held = [slots for slots in held if len(slots)]
        if not held:
            return Training()
        from stratify.config import TrainConfig
        from stratify.data.datasets import Dataset
        from stratify.experiment import build_experiment
        from stratify.federation import Federation
        from stratify.registry import PlainRegistry

        x = context.transform(buffers.x)
        dataset = Dataset(
            name="stream-buffers",
            x_train=x,
            y_train=buffers.y,
            x_test=x[:0],
            y_test=buffers.y[:0],
            num_classes=context.rows,
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
            federation=Federation(held, buffers.targets()),
            registry=PlainRegistry(seed=self.seed),
            model=context.model.network,
        ).engine
        self.rounds += 1
        stats = engine.run_epoch(self.rounds)
        self.transfers += stats.transfers
        return Training(
            steps=stats.steps,
            trained_samples=stats.loss_count,
            loss_sum=stats.loss_sum,
            loss_count=stats.loss_count,
            transfers=stats.transfers,
        )

    def counters(self) -> dict[str, int]:
        return {"transfers": self.transfers, "rounds": self.rounds}

    def step_flags(self) -> str:
        return (
            f"--lr {self.lr:g} --local-momentum {self.options['local_momentum']:g} "
            f"--local-epochs {self.options['local_epochs']}"
        )

    def state_dict(self) -> dict[str, Any]:
        return {"since_round": self.since_round, "rounds": self.rounds, "transfers": self.transfers}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in ("since_round", "rounds", "transfers"):
            setattr(self, name, int(state[name]))


def divergence_message(policy: StreamPolicy, where: str, scaled: bool) -> str:
    """What a stream that diverged at ``where`` (an event, its line) says: the step
    flags of ``policy`` and the ways out (``scaled``: ``--scale running``)."""
    return (
        f"training diverged at {where}: the loss or the weights became non-finite "
        f"with {policy.step_flags()}{'' if scaled else ' --scale none'}; lower --lr"
        f"{'' if scaled else ', use --scale running'}, or give "
        "--on-diverge skip to undo such updates and go on"
    )
