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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from stratify.client import LocalJob, LocalTrainer
from stratify.compiled import StepTerms
from stratify.data.datasets import dataset_family
from stratify.errors import ConfigError
from stratify.federation import Federation
from stratify.options import MODES, StrategyOptions
from stratify.registry.base import RegistryResult
from stratify.state import State

LR_SCHEDULES = ("inverse-epoch", "constant")


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


@dataclass(frozen=True)
class PaperSetting:
    """A setting of a method's own paper (or official code) that the ``seed-papers`` grid
    runs it in, beside its matched comparator (docs/architecture.md, "Reproducing the
    papers").

    Parameters
    ----------
    key : str
        The setting's row: settings of a method with the same key are variants of one run
        (the same ``label`` and ``values``) and share the row, and with it their matched
        comparator where it comes out the same.
    label : str
        What the setting is, in the grid's table (the method's label goes before it).
    values : mapping
        :class:`~stratify.config.TrainConfig` fields of the runs (dataset, partition,
        clients, epochs, dataset_options...), ``lr`` among them: a paper's setting runs at
        the rate it names, which a default chosen by a ``defaults`` grid does not move.
    options : mapping
        The method's options in this setting.
    variant : str
        What this variant changes, in its column's label (empty: the method as its paper
        gives it).
    comparator_options : mapping
        Where the paper's own baseline differs from the matched comparator (e.g. the
        official code's FedAvg with momentum 0.9 beside a method run without): options
        that replace the matched comparator's (the ``variant`` says which baseline).
    """

    key: str
    label: str
    values: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    variant: str = ""
    comparator_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.comparator_options and not self.variant:
            raise ValueError(
                f"paper setting {self.key!r}: another comparator than the matched one is a "
                "variant: name it"
            )
        if "lr" not in self.values:
            raise ValueError(
                f"paper setting {self.key!r}: name its learning rate (values['lr']): a "
                "method's default rate is chosen on other settings and can move"
            )


class Strategy(ABC):
    """A federated method as hooks called by :meth:`stratify.engine.Engine.run_epoch`.

    Subclasses set ``name``, ``description``, the ``modes`` they run in and their
    ``options_class`` (a :class:`~stratify.options.StrategyOptions` dataclass). They are
    built from options (``Stratify(StratifyOptions(chunk=3))``) or from keyword values
    (``Stratify(chunk=3)``), validated either way.

    The surface comes in tiers (docs/architecture.md, "Strategy interface"):

    * **core**, what every method implements: :meth:`configure_rounds`, :meth:`fit`,
      :meth:`aggregate`, and :meth:`state_dict` / :meth:`load_state_dict` where it keeps
      state between rounds;
    * **declarations**, the decisions every method states on its class, so that no table
      elsewhere names it (:func:`stratify.testing.check_declarations` refuses a method
      that leaves one unstated; a subclass inherits its parent's): ``label`` (display),
      ``comparator`` or ``no_comparator`` and ``effective_weighting`` (matched
      comparisons), ``test_options`` (the conformance cases), ``benchmark_local`` and
      ``step_size_options`` (benches and the run's advice on a diverging loss);
    * optional groups, each with a default that opts out:

      - *learning rate*: ``own_lrs``, ``default_lr``, ``lr_note``, :meth:`lr_for`,
        :meth:`paper_lr`,
        ``default_lr_schedule``, :meth:`lr_schedule_for`;
      - *vectorised runs* (:mod:`stratify.vectorize`): :meth:`step_terms`,
        :meth:`local_work`;
      - *matched comparisons*: :meth:`planned_sample_gradients`,
        :meth:`informative_epochs`;
      - *run checks and display*: :meth:`check_epochs`, ``requires_batch_norm``,
        :meth:`epoch_info`, :meth:`summarize`;
      - *its paper's settings*: ``paper_settings``, the ``seed-papers`` grid's rows;
        *comparison grids*: ``grid_options``, ``grid_label``, ``paired_setting``.
    """

    name: ClassVar[str] = "strategy"
    description: ClassVar[str] = ""
    modes: ClassVar[tuple[str, ...]] = MODES
    options_class: ClassVar[type[StrategyOptions]] = StrategyOptions

    # -- declarations: every method states these (on its class or a parent's) ----------
    #: how the papers write the method, in tables, grids and plots
    label: ClassVar[str] = ""
    #: the registered method this one modifies, whose matched run isolates its mechanism;
    #: ``None`` when it has none, and ``no_comparator`` says why
    comparator: ClassVar[str | None] = None
    #: why the method has no matched comparator (read when ``comparator`` is ``None``)
    no_comparator: ClassVar[str] = ""
    #: how the method weights the clients' models in practice, where its ``weighting``
    #: option does not say (SCAFFOLD averages Δy uniformly: ``"equal"``); ``None``: as the
    #: option says
    effective_weighting: ClassVar[str | None] = None
    #: options the conformance cases (:mod:`stratify.testing`) run the method with, where
    #: its defaults do not fit their short runs (river's ``_unit_test_params``)
    test_options: ClassVar[dict[str, Any]] = {}
    #: whether ``stratify bench local`` times its single-sample local jobs
    benchmark_local: ClassVar[bool] = False
    #: its options that set step sizes (besides ``--lr``), named when a loss diverges
    step_size_options: ClassVar[tuple[str, ...]] = ()
    #: the learning-rate schedule of the method's paper, used when none is given
    default_lr_schedule: ClassVar[str] = "constant"
    #: the base learning rate of the method's paper (:meth:`paper_lr`), used when ``--lr``
    #: is not given and :attr:`own_lrs` has no rate for the run; ``None`` leaves it to the
    #: dataset's default (:func:`stratify.config.default_lr`)
    default_lr: ClassVar[float | None] = None
    #: how :meth:`paper_lr` chooses the rate when it depends on the data set (shown by
    #: ``stratify methods``); ``None`` when it does not
    lr_note: ClassVar[str | None] = None
    #: the method's own base rate per (dataset family, mode), each chosen on a validation
    #: split by the committed ``defaults`` grids (:mod:`stratify.reproduce.defaults`,
    #: docs/results/defaults-*.csv); read from the method's own class only (:meth:`own_rates`)
    own_lrs: ClassVar[Mapping[tuple[str, str], float]] = {}
    #: whether the method needs BatchNorm layers in the model (FedTAN); a grid leaves such
    #: a method out, with a note, where its model has none
    requires_batch_norm: ClassVar[bool] = False
    #: the settings of its own paper that the ``seed-papers`` grid runs it in, each beside
    #: its matched comparator (:class:`PaperSetting`); none: the grid leaves it out
    paper_settings: ClassVar[tuple[PaperSetting, ...]] = ()
    #: what the Stratify paper's comparison grids (``table1``, ``seed-methods``: every
    #: method trains every client each round for their 30 rounds) set for the method,
    #: where its defaults would not fit them (FedBSS: all clients, a quarter warm-up);
    #: its label there carries ``grid_label`` after its own
    grid_options: ClassVar[dict[str, Any]] = {}
    grid_label: ClassVar[str] = ""
    #: what the ``paired`` grid (20 rounds of one local epoch, each method beside its
    #: comparator) sets for the method: a key of :class:`~stratify.config.TrainConfig`
    #: (``dataset``: data its mechanism needs) or one of its options
    paired_setting: ClassVar[dict[str, Any]] = {"local_epochs": 1}

    def __init__(self, options: StrategyOptions | None = None, **values: Any) -> None:
        if options is not None and values:
            raise TypeError("give a strategy either an options object or keyword values")
        self.options = options if options is not None else self.options_class(**values)

    def setup(self, context: Context) -> None:
        """Called once before the first epoch; the options get their mode's defaults."""
        if context.mode not in self.modes:
            raise ConfigError(
                f"--algorithm {self.name} runs in --mode {' or '.join(self.modes)}, "
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

    def step_terms(self, mode: str) -> StepTerms | None:
        """What the method's single-sample steps add to the gradient, when its rounds can
        be given as jobs (:meth:`local_work`) in ``mode``; ``None`` (the default) when they
        cannot, and the run steps alone. Called on a strategy not yet set up: it reads
        the options as resolved for ``mode``."""
        return None

    def local_work(
        self, context: Context, round_: Round, rng: np.random.Generator
    ) -> LocalWork | None:
        """The round's local training as jobs, drawing from ``rng`` what :meth:`fit`
        would draw, in the same order, so that a runner holding many runs' jobs gives the
        numbers of :meth:`fit`; ``None`` runs the round through :meth:`fit`. A method
        whose :meth:`step_terms` is not ``None`` implements it."""
        return None

    def lr_schedule_for(self, mode: str) -> str:
        """The learning-rate schedule used in ``mode`` when the run gives none."""
        return self.default_lr_schedule

    def lr_for(self, mode: str, dataset: str | None = None) -> float | None:
        """The method's own base learning rate in ``mode`` on ``dataset``, or ``None`` to
        take the dataset's default, when the run gives no ``--lr``: the rate its class
        chose for the dataset's family and ``mode`` (:meth:`own_rates`), else its
        paper's (:meth:`paper_lr`).

        Parameters
        ----------
        mode : str
            The run's mode.
        dataset : str, optional
            The run's dataset (``None``: not known, only the paper's rate applies).
        """
        if dataset is not None:
            own = self.own_rates().get((dataset_family(dataset), mode))
            if own is not None:
                return own
        return self.paper_lr(mode, dataset)

    @classmethod
    def own_rates(cls) -> Mapping[tuple[str, str], float]:
        """:attr:`own_lrs` as the method's own class declares it: a rate chosen for one
        method is not another's, so a subclass does not inherit its parent's (it
        declares its own, or takes its paper's and the dataset's)."""
        return cls.__dict__.get("own_lrs", {})

    def paper_lr(self, mode: str, dataset: str | None = None) -> float | None:
        """The rate the method's paper fixes in ``mode`` on ``dataset`` (``None``: it
        fixes none): :attr:`default_lr`, unless a method's paper sets it by data set.

        Parameters
        ----------
        mode : str
            The run's mode.
        dataset : str, optional
            The run's dataset (``None``: not known).
        """
        return self.default_lr

    def check_epochs(self, epochs: int) -> None:
        """Refuse, with a :class:`~stratify.errors.ConfigError`, a run of ``epochs``
        epochs that these options cannot make (FedBSS: a warm-up longer than the run).
        Called when a configuration is made, before any data is read."""

    def planned_sample_gradients(self, client_sizes: list[int]) -> float | None:
        """The local training samples (each local pass counted) one round is planned to
        take with clients of ``client_sizes`` samples, in expectation over uniformly drawn
        participants; ``None`` where the method plans no such budget. A matched
        comparison checks it is the same for a method and its comparator."""
        return None

    def informative_epochs(self) -> int:
        """The fewest epochs in which the method's own mechanism acts for at least two
        rounds (FedBSS: its warm-up + 2); a tuning run is at least this long, so that it
        tunes the method and not only its warm-up."""
        return 1

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
