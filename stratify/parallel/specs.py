"""What a batch of runs is made of: :class:`RunSpec` (one run and its folder policy),
the :class:`RunEvent` and :class:`RunOutcome` a run reports, :class:`RunGroup` (runs
stepped together) and the :class:`Backend` protocol that runs them
(docs/architecture.md, "Many runs at once").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from stratify.config import TrainConfig
from stratify.errors import (
    ConfigError,
)
from stratify.vectorize import plan_groups

#: ``new``: the folder must hold no run; ``continue``: skip a finished run, resume one
#: with a checkpoint, start the rest afresh; ``overwrite``: start afresh in any case
POLICIES = ("new", "continue", "overwrite")
#: outcomes after which the run folder holds every epoch asked for
COMPLETE = ("finished", "skipped")


@dataclass(frozen=True)
class RunSpec:
    """One run to execute.

    Parameters
    ----------
    name : str
        Unique name, shown by the display (e.g. ``seed-3`` or a grid cell's key).
    config : TrainConfig
        The run's configuration; ``config.out`` is its run folder.
    policy : {"new", "continue", "overwrite"}
        What to do with a folder that already holds something (:data:`POLICIES`).
    keep_corrupt : bool
        Under ``continue``, leave a folder whose files cannot be read (outcome
        ``corrupt``) instead of running it again from its first epoch.
    """

    name: str
    config: TrainConfig
    policy: str = "continue"
    keep_corrupt: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"a run's name must be non-empty text, got {self.name!r:.60}")
        if not isinstance(self.config, TrainConfig):
            raise ConfigError(
                f"run {self.name}: config must be a TrainConfig, got {type(self.config).__name__}"
            )
        if self.policy not in POLICIES:
            raise ConfigError(f"unknown run policy {self.policy!r}; use {', '.join(POLICIES)}")
        if not self.config.out:
            raise ConfigError(f"run {self.name}: its configuration needs a run folder (out)")
        if not isinstance(self.keep_corrupt, bool):
            raise ConfigError(f"run {self.name}: keep_corrupt must be True or False")


@dataclass(frozen=True)
class RunEvent:
    """Progress of one run: ``start`` (``epoch`` = epochs already done), ``epoch`` (one more
    finished, with its test accuracy) or ``steps`` (``samples`` trained since the last)."""

    name: str
    kind: str
    epoch: int = 0
    epochs: int = 0
    accuracy: float | None = None
    samples: int = 0
    pid: int = 0
    message: str = ""


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended.

    ``status`` is ``finished``, ``skipped`` (the folder already held every epoch),
    ``diverged`` (a non-finite loss stopped it; its good epochs are kept), ``failed`` (an
    error, or its worker died: ``message`` says which), ``corrupt`` (its folder could not
    be read and was left, ``keep_corrupt``) or ``interrupted``. ``corrupt`` holds why a
    folder was found corrupt, also when the run was then started again.
    """

    name: str
    status: str
    message: str = ""
    epochs_done: int = 0
    best_accuracy: float | None = None
    best_epoch: int | None = None
    corrupt: str = ""


@dataclass(frozen=True)
class RunGroup:
    """Runs that a worker executes together: one spec alone, or specs stepped together
    (:mod:`stratify.vectorize`), spec ``i`` in lane ``lanes[i]`` of ``lane_count``.

    A vectorised group keeps the lane count it was planned with, even when some of its
    runs have finished meanwhile: a run's numbers depend on the lane count.
    """

    specs: tuple[RunSpec, ...]
    lanes: tuple[int, ...] = ()
    lane_count: int = 1

    @property
    def vectorised(self) -> bool:
        return bool(self.lanes)


def group_specs(
    specs: Sequence[RunSpec], vectorize: int | None
) -> tuple[list[RunGroup], str | None]:
    """``specs`` as groups: each alone without ``vectorize``; else groups of at most
    ``vectorize`` runs sharing a step (:func:`~stratify.vectorize.plan_groups`), with the
    one-line note on what runs alone."""
    if vectorize is None:
        return [RunGroup((spec,)) for spec in specs], None
    grouping = plan_groups([spec.config for spec in specs], vectorize)
    groups = []
    for indices in grouping.groups:
        members = tuple(specs[index] for index in indices)
        if len(indices) == 1:
            groups.append(RunGroup(members))
        else:
            groups.append(RunGroup(members, tuple(range(len(indices))), len(indices)))
    return groups, grouping.note(vectorize)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread while runs go on, so that the runs are stopped as
    Ctrl-C stops them (every ``except KeyboardInterrupt`` on the way handles it)."""


class RunsInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the runs; ``outcomes`` says which finished and which are
    resumable, ``signal`` which signal it was (``"SIGINT"`` or ``"SIGTERM"``)."""

    def __init__(self, outcomes: list[RunOutcome], signal: str = "SIGINT") -> None:
        super().__init__("interrupted")
        self.outcomes = outcomes
        self.signal = signal

    @staticmethod
    def signal_of(stop: KeyboardInterrupt) -> str:
        """The signal behind ``stop``: SIGTERM for :class:`Terminated`, else SIGINT."""
        if isinstance(stop, RunsInterrupted):
            return stop.signal
        return "SIGTERM" if isinstance(stop, Terminated) else "SIGINT"


EventHandler = Callable[[RunEvent | RunOutcome], None]


class Backend(Protocol):
    """Runs groups of specs whose folders have been checked, reporting to ``on_event``;
    returns every run's outcome."""

    def run(self, groups: Sequence[RunGroup], on_event: EventHandler) -> list[RunOutcome]: ...
