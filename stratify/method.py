"""The method API: what a federated method implements and what it is given.

A :class:`Strategy` (Flower-style) has a few hooks, each returning what it produces:
``configure_rounds`` the rounds of an epoch (:class:`Round`), ``fit`` the clients'
:class:`ClientUpdate` objects, ``aggregate`` the new global state (or ``None`` when the
global model itself travelled between clients). The one loop that calls them is
:class:`stratify.engine.Engine`; strategies see a :class:`Context`, never the engine, and
report their work in :class:`RoundStats` (docs/architecture.md, "Strategy interface").
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from stratify.card import MethodCard
from stratify.client import LocalJob, LocalTrainer
from stratify.compiled import StepTerms
from stratify.errors import ConfigError
from stratify.federation import Federation
from stratify.options import StrategyOptions
from stratify.registry.base import RegistryResult
from stratify.state import State

LR_SCHEDULES = ("inverse-epoch", "constant")
#: class attributes a method used to set that its card now holds (docs/architecture.md,
#: "Strategy interface"): set on a class, one would be ignored, so it is refused
REPLACED_BY_CARD = frozenset(
    {
        "name", "label", "description", "modes", "comparator", "no_comparator",
        "effective_weighting", "grid_options", "grid_label", "paired_setting",
        "paper_settings", "requires_batch_norm", "own_lrs", "default_lr", "lr_note",
        "default_lr_schedule", "test_options", "benchmark_local", "step_size_options",
    }
)  # fmt: skip


@dataclass
class RoundStats:
    """Counters of some work: added up per round, per epoch.

    Parameters
    ----------
    steps : int
        Optimizer steps.
    transfers : int
        Model-sized payloads sent (downloads, uploads, hops).
    uploads : int
        Parameter-sized payloads that are not models: summed gradients, control variates.
    skipped : int
        Schedule entries dropped because no client had a sample of the label left.
    reused : int
        Schedule entries trained on a sample already used this epoch (refilled labels).
    loss_sum, loss_count : float, int
        Summed training loss and the number of samples it covers.
    extra_bytes : int
        Bytes of payloads that are neither a model nor parameter-sized, counted as they
        are: FedBR's projection head and pseudo-data, FedDiverse's triplets.
    sample_gradients : int
        Training samples whose loss gradient a step used (each local pass counted): the
        local work that a matched comparison holds equal (docs/architecture.md,
        "Traffic counting"). Gradients on other inputs (FedBR's pseudo-data) are not
        counted here.
    """

    steps: int = 0
    transfers: int = 0
    uploads: int = 0
    skipped: int = 0
    reused: int = 0
    loss_sum: float = 0.0
    loss_count: int = 0
    extra_bytes: int = 0
    sample_gradients: int = 0

    def add(self, other: RoundStats) -> None:
        self.steps += other.steps
        self.transfers += other.transfers
        self.uploads += other.uploads
        self.skipped += other.skipped
        self.reused += other.reused
        self.extra_bytes += other.extra_bytes
        self.loss_sum += other.loss_sum
        self.loss_count += other.loss_count
        self.sample_gradients += other.sample_gradients

    @property
    def train_loss(self) -> float:
        return self.loss_sum / max(self.loss_count, 1)


@dataclass
class EpochStats(RoundStats):
    """An epoch's counters, as written to ``metrics.jsonl``: ``bytes_sent`` from traffic,
    ``clients`` the ids of the clients that returned an update (sorted; empty when the
    work was spread over many clients, as Stratify's plans), ``info`` the method's own
    diagnostics (:meth:`Strategy.epoch_info`)."""

    bytes_sent: int = 0
    clients: list[int] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Round:
    """The work a strategy configures for one round.

    Parameters
    ----------
    clients : numpy.ndarray, optional
        The clients taking part, in order.
    payload : object, optional
        Strategy-specific work description (Stratify: the epoch's plan).
    stats : RoundStats
        Counters known when the round is configured (e.g. skipped schedule entries).
    """

    clients: np.ndarray | None = None
    payload: Any = None
    stats: RoundStats = field(default_factory=RoundStats)


@dataclass
class ClientUpdate:
    """What a client returns after its local work.

    Parameters
    ----------
    client : int
        Client id (-1 for work spread over many clients, e.g. a plan of hops).
    num_samples : int
        Samples the client holds (the aggregation weight).
    state : dict, optional
        The client's model state after local training; ``None`` when the global model
        itself travelled and was trained in place (model passing).
    stats : RoundStats
        Counters of the client's work.
    extra : dict
        Strategy-specific payload (e.g. SCAFFOLD's control-variate delta).
    """

    client: int
    num_samples: int
    state: State | None = None
    stats: RoundStats = field(default_factory=RoundStats)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class LocalWork:
    """A round's local training as :class:`~stratify.client.LocalJob` objects, so that
    many runs' rounds can step together (:mod:`stratify.vectorize`).

    Parameters
    ----------
    jobs : list of LocalJob
        Run in order (jobs on the same model continue one another, as SFL's hops do); a
        runner trains each job's model in place and fills its ``losses``.
    finish : callable
        Called once every job has run: the round's updates, as ``fit`` would return.
    """

    jobs: list[LocalJob]
    finish: Callable[[], list[ClientUpdate]]


@dataclass
class Context:
    """The narrow view of a run that a strategy's hooks receive.

    Parameters
    ----------
    model : torch.nn.Module
        The global model. Averaging strategies read it; model-passing strategies
        (Stratify, SFL) train it in place, since in those methods it is the model that
        travels from client to client.
    x_train, y_train : torch.Tensor
        Training tensors on the device; a client reads only its own indices.
    federation : Federation
        The clients and their samples.
    placeholders : RegistryResult
        What the label registry produced: the placeholders, each client's map from its
        labels to them, and their global counts.
    mode : {"single-sample", "batch"}
        Learning setting.
    trainer : LocalTrainer
        Clients' local training, for the strategies that train copies.
    lr : float
        The current epoch's learning rate (set by the engine each epoch).
    epoch : int
        The current epoch (1-based).
    total_epochs : int, optional
        The run's ``--epochs``, for a method whose schedule depends on the length of the
        run (FedBSS's warm-up, a quarter of it); ``None`` when the caller gives none. A
        resumed run sees the ``--epochs`` it was resumed with, so a method that resolves
        something from it keeps the resolved value in its ``state_dict``.
    on_steps : callable, optional
        Progress callback, called with a number of samples trained.
    domains_train : numpy.ndarray, optional
        Attribute (domain) id of every training sample where the dataset has one (a
        client reads only its own entries); ``None`` otherwise. FedDiverse's
        ``--dht known`` reads it.
    """

    model: nn.Module
    x_train: torch.Tensor
    y_train: torch.Tensor
    federation: Federation
    placeholders: RegistryResult
    mode: str
    trainer: LocalTrainer
    lr: float = 0.0
    epoch: int = 0
    total_epochs: int | None = None
    on_steps: Callable[[int], None] | None = None
    domains_train: np.ndarray | None = None

    @property
    def device(self) -> torch.device:
        return self.x_train.device

    def progress(self, samples: int) -> None:
        if self.on_steps is not None:
            self.on_steps(samples)


class Strategy(ABC):
    """A federated method as hooks called by :meth:`stratify.engine.Engine.run_epoch`.

    Subclasses set their :class:`~stratify.card.MethodCard` (``card``: name, label,
    modes, comparator, paper settings, rates, test and bench settings) and their
    ``options_class`` (a :class:`~stratify.options.StrategyOptions` dataclass). They are
    built from options (``Stratify(StratifyOptions(chunk=3))``) or from keyword values
    (``Stratify(chunk=3)``), validated either way.

    The surface is small (docs/architecture.md, "Strategy interface"): the core hooks
    :meth:`configure_rounds`, :meth:`fit`, :meth:`aggregate`, and :meth:`state_dict` /
    :meth:`load_state_dict` where the method keeps state between rounds; hooks with a
    default that opts out (:meth:`check_epochs`, :meth:`epoch_info`, :meth:`summarize`,
    :meth:`paper_lr`); and two named optional interfaces a method adds by inheriting them:
    :class:`Vectorizable` (vectorised runs) and :class:`Budgeted` (planned local work).
    """

    #: what the rest of Stratify reads about the method (:mod:`stratify.card`); a
    #: subclass that declares none is the same method by its card
    card: ClassVar[MethodCard]
    options_class: ClassVar[type[StrategyOptions]] = StrategyOptions

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        replaced = sorted(REPLACED_BY_CARD & set(vars(cls)))
        if replaced:
            raise TypeError(
                f"{cls.__name__} sets {', '.join(replaced)}: a method states these on its card "
                "(card = MethodCard(...), docs/architecture.md 'Strategy interface')"
            )

    def __init__(self, options: StrategyOptions | None = None, **values: Any) -> None:
        if options is not None and values:
            raise TypeError("give a strategy either an options object or keyword values")
        self.options = options if options is not None else self.options_class(**values)

    def setup(self, context: Context) -> None:
        """Called once before the first epoch; the options get their mode's defaults."""
        identity = self.card.identity
        if context.mode not in identity.modes:
            raise ConfigError(
                f"--algorithm {identity.name} runs in --mode {' or '.join(identity.modes)}, "
                f"not {context.mode}"
            )
        self.options = self.options.for_mode(context.mode)

    @abstractmethod
    def configure_rounds(
        self, context: Context, epoch: int, rng: np.random.Generator
    ) -> Iterable[Round]:
        """The rounds of one epoch: which clients take part and what they do."""

    @abstractmethod
    def fit(self, context: Context, round_: Round, rng: np.random.Generator) -> list[ClientUpdate]:
        """The clients' local work for one round."""

    def aggregate(
        self, context: Context, round_: Round, updates: list[ClientUpdate]
    ) -> State | None:
        """The new global state from the updates; ``None`` keeps the (travelled) model."""
        return None

    def lr_for(
        self, mode: str, *, family: str | None = None, dataset: str | None = None
    ) -> float | None:
        """The method's own base learning rate in ``mode``, or ``None`` to take the
        dataset's default, when the run gives no ``--lr``: the rate its card's
        :class:`~stratify.card.Rates` chose for the dataset's ``family`` and ``mode``,
        else its paper's (:meth:`paper_lr`).

        Parameters
        ----------
        mode : str
            The run's mode.
        family : str, optional
            The dataset's family, as the data layer names it
            (:func:`stratify.data.datasets.dataset_family`); ``None``: not known, no
            tuned rate applies.
        dataset : str, optional
            The run's dataset, for a paper whose rate depends on it (``None``: not known).
        """
        if family is not None:
            tuned = self.card.rates.tuned_for(family, mode)
            if tuned is not None:
                return tuned
        return self.paper_lr(mode, dataset)

    def paper_lr(self, mode: str, dataset: str | None = None) -> float | None:
        """The rate the method's paper fixes in ``mode`` on ``dataset`` (``None``: it
        fixes none): its card's ``rates.paper_lr``, unless a method's paper sets it by
        data set.

        Parameters
        ----------
        mode : str
            The run's mode.
        dataset : str, optional
            The run's dataset (``None``: not known).
        """
        return self.card.rates.paper_lr

    def check_epochs(self, epochs: int) -> None:
        """Refuse, with a :class:`~stratify.errors.ConfigError`, a run of ``epochs``
        epochs that these options cannot make (FedBSS: a warm-up longer than the run).
        Called when a configuration is made, before any data is read."""

    def epoch_info(self, context: Context) -> dict[str, Any]:
        """Diagnostics of the epoch just run, written into its ``metrics.jsonl`` line
        under ``info`` (FedBSS: the share of samples in the biased set). JSON values."""
        return {}

    def summarize(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """The method's entries of ``summary.json`` from the epochs' records (dicts as in
        ``metrics.jsonl``, ``info`` included). JSON values."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Strategy state a checkpoint must carry (e.g. control variates, momentum)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""


class Vectorizable(ABC):
    """The optional interface of a method whose rounds can be given as
    :class:`~stratify.client.LocalJob` objects, so that many runs step together
    (:mod:`stratify.vectorize`)."""

    @abstractmethod
    def step_terms(self, mode: str) -> StepTerms | None:
        """What the method's single-sample steps add to the gradient, when its rounds can
        be given as jobs (:meth:`local_work`) in ``mode``; ``None`` when they cannot (in
        this mode or with these options), and the run steps alone. Called on a strategy
        not yet set up: it reads the options as resolved for ``mode``."""

    @abstractmethod
    def local_work(
        self, context: Context, round_: Round, rng: np.random.Generator
    ) -> LocalWork | None:
        """The round's local training as jobs, drawing from ``rng`` what ``fit`` would
        draw, in the same order, so that a runner holding many runs' jobs gives the
        numbers of ``fit``; ``None`` runs the round through ``fit``."""


class Budgeted(ABC):
    """The optional interface of a method that plans its local work: a matched
    comparison holds the planned samples equal, and tuning runs long enough for the
    method's mechanism to act."""

    @abstractmethod
    def planned_sample_gradients(self, client_sizes: list[int]) -> float | None:
        """The local training samples (each local pass counted) one round is planned to
        take with clients of ``client_sizes`` samples, in expectation over uniformly drawn
        participants; ``None`` where these options plan no such budget. A matched
        comparison checks it is the same for a method and its comparator."""

    def informative_epochs(self) -> int:
        """The fewest epochs in which the method's own mechanism acts for at least two
        rounds (FedBSS: its warm-up + 2); a tuning run is at least this long, so that it
        tunes the method and not only its warm-up."""
        return 1


def step_terms(strategy: Strategy, mode: str) -> StepTerms | None:
    """``strategy``'s :meth:`Vectorizable.step_terms` in ``mode``; ``None`` for a method
    that is not :class:`Vectorizable`.

    Parameters
    ----------
    strategy : Strategy
        The method.
    mode : str
        The run's mode.
    """
    return strategy.step_terms(mode) if isinstance(strategy, Vectorizable) else None


def local_work(
    strategy: Strategy, context: Context, round_: Round, rng: np.random.Generator
) -> LocalWork | None:
    """``strategy``'s :meth:`Vectorizable.local_work`; ``None`` (run the round through
    ``fit``) for a method that is not :class:`Vectorizable`.

    Parameters
    ----------
    strategy : Strategy
        The method.
    context : Context
        The run's context.
    round_ : Round
        The round.
    rng : numpy.random.Generator
        The round's random numbers.
    """
    if isinstance(strategy, Vectorizable):
        return strategy.local_work(context, round_, rng)
    return None


def planned_sample_gradients(strategy: Strategy, client_sizes: list[int]) -> float | None:
    """``strategy``'s :meth:`Budgeted.planned_sample_gradients`; ``None`` for a method
    that plans no budget.

    Parameters
    ----------
    strategy : Strategy
        The method.
    client_sizes : list of int
        The clients' sample counts.
    """
    if isinstance(strategy, Budgeted):
        return strategy.planned_sample_gradients(client_sizes)
    return None


def informative_epochs(strategy: Strategy) -> int:
    """``strategy``'s :meth:`Budgeted.informative_epochs`; 1 for a method that plans no
    budget.

    Parameters
    ----------
    strategy : Strategy
        The method.
    """
    return strategy.informative_epochs() if isinstance(strategy, Budgeted) else 1


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
    raise ConfigError(
        f"unknown --lr-schedule {schedule!r}; choose one of {', '.join(LR_SCHEDULES)}"
    )
