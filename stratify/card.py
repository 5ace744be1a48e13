"""A method's card: everything other parts know about a method besides its hooks.

Grids, paired comparisons, tuning, the conformance kit, benches, docs tables and
``stratify methods`` read a method's :class:`MethodCard`; none keeps a table naming
methods. The card is frozen and grouped, as scikit-learn's estimator tags are: each group
is a frozen dataclass whose defaults opt out, so a method states only what it has
(docs/architecture.md, "Strategy interface"). The module imports no data, model or torch
code: a card is read before any run is built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stratify.options import MODES


@dataclass(frozen=True)
class Identity:
    """Who the method is.

    Parameters
    ----------
    name : str
        Its registered name (``--algorithm``).
    label : str
        How the papers write it, in tables, grids and plots; no two methods share one.
    description : str
        One line on what it does (``stratify methods``).
    modes : tuple of str
        The learning settings it runs in.
    """

    name: str
    label: str
    description: str = ""
    modes: tuple[str, ...] = MODES

    def __post_init__(self) -> None:
        if not self.name or not self.label:
            raise ValueError("a method's card names it and gives its label")
        unknown = sorted(set(self.modes) - set(MODES))
        if not self.modes or unknown:
            raise ValueError(f"{self.name}: modes {unknown or '()'}; choose from {MODES}")


@dataclass(frozen=True)
class Comparison:
    """How the method is compared with the others (docs/architecture.md, "Paired grids").

    Parameters
    ----------
    comparator : str, optional
        The registered method it modifies, whose matched run isolates its mechanism;
        ``None`` when it has none, and ``no_comparator`` says why.
    no_comparator : str
        Why it has no matched comparator (required when ``comparator`` is ``None``).
    effective_weighting : str, optional
        How it weights the clients' models in practice where its ``weighting`` option
        does not say (SCAFFOLD averages Δy uniformly: ``"equal"``); ``None``: as the
        option says.
    grid_options : mapping
        What the Stratify paper's comparison grids (``table1``, ``seed-methods``: every
        method trains every client each round for their 30 rounds) set for it, where its
        defaults would not fit them (FedBSS: all clients, a quarter warm-up).
    grid_label : str
        What its label carries there after its own.
    paired_setting : mapping
        What the ``paired`` grid (20 rounds, each method beside its comparator) sets for
        it: a key of :class:`~stratify.config.TrainConfig` (``dataset``: data its
        mechanism needs) or one of its options.
    """

    comparator: str | None = None
    no_comparator: str = ""
    effective_weighting: str | None = None
    grid_options: Mapping[str, Any] = field(default_factory=dict)
    grid_label: str = ""
    paired_setting: Mapping[str, Any] = field(default_factory=lambda: {"local_epochs": 1})

    def __post_init__(self) -> None:
        if self.comparator is None and not self.no_comparator:
            raise ValueError("a method without a comparator says why (no_comparator)")


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


@dataclass(frozen=True)
class Paper:
    """The method's own paper.

    Parameters
    ----------
    settings : tuple of PaperSetting
        The settings the ``seed-papers`` grid runs it in, each beside its matched
        comparator; none: the grid leaves it out.
    requires_batch_norm : bool
        Whether it needs BatchNorm layers in the model (FedTAN); a grid leaves it out,
        with a note, where its model has none.
    """

    settings: tuple[PaperSetting, ...] = ()
    requires_batch_norm: bool = False


#: What ``stratify methods`` prints for a method no ``defaults`` grid chose a rate for.
UNTUNED = "untuned"


@dataclass(frozen=True)
class Rates:
    """The method's learning rates, used when a run gives no ``--lr``.

    A card is declared whole on its method's class, so its rates belong to that method:
    a variant that declares its own card states its own rates (untuned unless it does),
    and a subclass that declares none is the same method by its card, rates included.

    Parameters
    ----------
    tuned : mapping, optional
        The method's own base rate per (dataset family, mode), each chosen on a
        validation split by the committed ``defaults`` grids
        (:mod:`stratify.reproduce.defaults`, docs/results/defaults-*.csv). ``None``
        says, explicitly, that no grid chose one: the method is *untuned*, and takes its
        paper's rate, else the dataset's default.
    paper_lr : float, optional
        The base rate its paper fixes (``None``: it fixes none).
    note : str, optional
        How the paper's rate depends on the data set, where it does (shown by
        ``stratify methods``).
    schedule : {"constant", "inverse-epoch"}
        The learning-rate schedule of its paper, used when a run gives none.
    mode_schedules : mapping, optional
        Mode -> the schedule used there instead of ``schedule``, where one was chosen on
        evidence (Stratify's single-sample runs: the decay, docs/results.md).
    """

    tuned: Mapping[tuple[str, str], float] | None = None
    paper_lr: float | None = None
    note: str | None = None
    schedule: str = "constant"
    mode_schedules: Mapping[str, str] = field(default_factory=dict)

    def schedule_for(self, mode: str) -> str:
        """The schedule a run in ``mode`` uses when it gives no ``--lr-schedule``.

        Parameters
        ----------
        mode : str
            The run's mode.
        """
        return self.mode_schedules.get(mode, self.schedule)

    def tuned_for(self, family: str, mode: str) -> float | None:
        """The rate a ``defaults`` grid chose for the dataset ``family`` in ``mode``
        (``None``: none was chosen there).

        Parameters
        ----------
        family : str
            The dataset's family (:func:`stratify.data.datasets.dataset_family`).
        mode : str
            The run's mode.
        """
        return None if self.tuned is None else self.tuned.get((family, mode))

    def describe(self, modes: tuple[str, ...] = MODES) -> str:
        """The tuned rates of ``modes`` as ``stratify methods`` shows them (``"0.1 on
        digits (batch), ..."``, in the order declared), or :data:`UNTUNED` where none is.

        Parameters
        ----------
        modes : tuple of str
            The modes to show (the method's).
        """
        shown = [
            f"{lr} on {family} ({mode})"
            for (family, mode), lr in (self.tuned or {}).items()
            if mode in modes
        ]
        return ", ".join(shown) if shown else UNTUNED


@dataclass(frozen=True)
class Testing:
    """How the conformance kit (:mod:`stratify.testing`) runs the method.

    Parameters
    ----------
    options : mapping
        Options its short runs use where its defaults do not fit them.
    """

    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Bench:
    """What benches and a run's advice read.

    Parameters
    ----------
    benchmark_local : bool
        Whether ``stratify bench local`` times its single-sample local jobs.
    step_size_options : tuple of str
        Its options that set step sizes (besides ``--lr``), named when a loss diverges.
    """

    benchmark_local: bool = False
    step_size_options: tuple[str, ...] = ()


@dataclass(frozen=True)
class MethodCard:
    """Everything other parts of Stratify read about a method, grouped.

    Parameters
    ----------
    identity : Identity
        Name, label, description and modes.
    comparison : Comparison
        Matched comparator and comparison grids' settings.
    paper : Paper
        Its paper's settings and model needs.
    rates : Rates
        Learning rates: tuned per family and mode, or untuned.
    testing : Testing
        Conformance runs' options.
    bench : Bench
        Benches and divergence advice.
    flower : bool
        Whether all its local work goes through the trainer seam, so that it runs on
        Flower (docs/flower.md); the conformance kit checks the claim.
    """

    identity: Identity
    comparison: Comparison
    paper: Paper = field(default_factory=Paper)
    rates: Rates = field(default_factory=Rates)
    testing: Testing = field(default_factory=Testing)
    bench: Bench = field(default_factory=Bench)
    flower: bool = False

    def derive(self, identity: Identity, **groups: Any) -> MethodCard:
        """The card of a variant of this method: its own ``identity``, the same comparison,
        test and bench settings and paper rate, but none of the parent's *tuned* rates (a
        rate chosen for one method is not another's: the variant is untuned until a
        ``defaults`` grid chooses its own), none of its paper settings (the ``seed-papers``
        grid would run the parent's paper as the variant's) and no Flower claim (the
        variant's local work may leave the trainer seam) unless ``groups`` give them.

        Parameters
        ----------
        identity : Identity
            The variant's name, label, description and modes.
        **groups
            Groups (``comparison``, ``paper``, ``rates``, ``testing``, ``bench``) or
            ``flower`` to set instead.
        """
        inherited = MethodCard(
            identity,
            self.comparison,
            Paper(requires_batch_norm=self.paper.requires_batch_norm),
            dataclasses.replace(self.rates, tuned=None),
            self.testing,
            self.bench,
        )
        return dataclasses.replace(inherited, **groups)

    @property
    def name(self) -> str:
        """The method's registered name."""
        return self.identity.name

    @property
    def label(self) -> str:
        """How the papers write the method."""
        return self.identity.label
