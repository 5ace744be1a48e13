"""Fair tuning: every method's learning rate picked the same way, never on the test set.

For each row and column of a grid, the first seed's cell is run once per candidate rate
(the method's default times each factor) on a validation split held out of the training
samples (``TrainConfig.validation``); the rate with the best validation accuracy over its
last rounds (:func:`validation_score`) is then used by that row and column's cells of
every seed. Only the validation accuracy is read:
a tuning run also records its test accuracy, like every run, but the choice never looks
at it. A tuning run is at least as long as the method needs for its own mechanism to act
(:meth:`~stratify.method.Budgeted.informative_epochs`: FedBSS's warm-up + 2), and runs
with the final runs' options, so FedBSS tunes with the warm-up it is then run with
(docs/architecture.md, "Reproducing the papers").

With ``halving``, the candidates race in rungs (successive halving): every candidate
trains a few epochs, the better half by the same rule trains on, and so on, the last two
being compared after the full tuning epochs; a rung whose best is within 5 points of
chance drops none (a rate that starts slowly is not worse). A chosen rate at the edge
of the rates tried widens the grid: the next rate beyond it (by the grid's outermost
ratio) is tried at the full tuning epochs, up to ``widen`` times on each side. When even
the best finalist ends within 5 points of chance, the tuning epochs could not tell the
rates apart (each is as good as an untrained model): the finalists train on to the
cell's epochs and are compared there. Every decision is read back from the tuning runs'
folders, so a stopped tuning resumes to the same choices.

A matched comparator's candidates are multiples of its base's default rate and of its
methods' (when they differ): it runs with their optimizer and local work, where its
base's own rate may not fit (FedDiverse's FedAvgM with momentum 0.9 on both sides stays
at chance at FedAvgM's 0.1 and its neighbours on `digits`, and learns at 0.01), but
with its base's loss, where the method's rate may not fit either (LfD's cosine head).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from stratify.algorithms import build_strategy
from stratify.config import TrainConfig, resolve_lr
from stratify.errors import ConfigError, CorruptRunError
from stratify.measures import NEAR_CHANCE_POINTS, last_rounds
from stratify.method import informative_epochs as method_epochs
from stratify.parallel import COMPLETE, RunOutcome, RunSpec
from stratify.parallel.folders import saved_classes
from stratify.reproduce.grids import Cell
from stratify.runfiles import read_json_object, read_records
from stratify.validation import check_int, check_positive, check_positive_int, check_share

#: the candidate rates, as multiples of each method's default
DEFAULT_FACTORS = (0.3, 1.0, 3.0)
DEFAULT_VALIDATION = 0.1
#: rates added beyond a chosen edge rate, at most, on each side
DEFAULT_WIDEN = 2


@dataclass(frozen=True)
class Tuning:
    """How learning rates are tuned.

    Parameters
    ----------
    factors : tuple of float
        Candidate rates as multiples of each method's default rate.
    validation : float
        Share of every label's training samples held out to score the candidates.
    epochs : int, optional
        Epochs of a tuning run (default: the cell's).
    halving : bool
        Race the candidates by successive halving (:func:`rungs`) instead of training
        every one for all the epochs.
    widen : int
        Rates tried beyond a chosen edge rate, at most, on each side (0: the grid as given).
    """

    factors: tuple[float, ...] = DEFAULT_FACTORS
    validation: float = DEFAULT_VALIDATION
    epochs: int | None = None
    halving: bool = False
    widen: int = DEFAULT_WIDEN

    def identity(self) -> dict[str, object]:
        """What a grid folder records of its tuning; the settings at the values tuning had
        before they existed (no halving, no widening) are left out, so folders tuned then
        continue."""
        values: dict[str, object] = asdict(self)
        if not self.halving:
            del values["halving"]
        if self.widen == 0:
            del values["widen"]
        return values

    def __post_init__(self) -> None:
        if not isinstance(self.factors, (list, tuple)):
            raise ConfigError(f"--tune-factors takes a list of factors, got {self.factors!r:.60}")
        if not self.factors:
            raise ConfigError("--tune-factors: give at least one factor")
        object.__setattr__(
            self, "factors", tuple(check_positive(f, "--tune-factors") for f in self.factors)
        )
        check_share(self.validation, "--validation")
        if self.validation == 0:
            check_positive(self.validation, "--validation")
        if self.epochs is not None:
            check_positive_int(self.epochs, "--tune-epochs")
        object.__setattr__(self, "widen", check_int(self.widen, "--tune-widen", minimum=0))


@dataclass(frozen=True)
class Trial:
    """One candidate rate's validation result after ``epochs`` epochs (``None``: those
    of the tuning run)."""

    lr: float
    accuracy: float | None
    epoch: int | None
    status: str
    epochs: int | None = None


@dataclass(frozen=True)
class Choice:
    """The rate chosen for a row and column, and the trials it was chosen from."""

    group: str
    default: float
    lr: float
    trials: tuple[Trial, ...]


def validation_score(records: Sequence[dict]) -> tuple[float | None, int | None]:
    """A tuning run's score: its mean validation accuracy over its last rounds (the
    window of :func:`~stratify.measures.last_rounds`, the measure the tables lead with),
    and the last epoch scored. Not the best epoch's: a rate whose accuracy swings from
    round to round would win on a lucky round and then end its runs low. Records written
    before runs kept their test set measured the validation split as ``test_accuracy``
    and have no ``validation_accuracy``: that value is read then."""
    scored = [
        (record.get("validation_accuracy", record.get("test_accuracy")), record["epoch"])
        for record in records
    ]
    kept = [(float(accuracy), epoch) for accuracy, epoch in scored if accuracy is not None]
    window = last_rounds([accuracy for accuracy, _ in kept])
    if window is None:
        return None, None
    return window.mean, kept[-1][1]


def informative_epochs(config: TrainConfig) -> int:
    """The fewest epochs in which ``config``'s method's mechanism acts
    (:meth:`~stratify.method.Budgeted.informative_epochs`)."""
    return method_epochs(build_strategy(config.algorithm, config.options, config.mode))


def tuning_epochs(config: TrainConfig, requested: int | None) -> int:
    """A tuning run's epochs: ``requested`` (default: the cell's), but never fewer than the
    method's :meth:`~stratify.method.Budgeted.informative_epochs`."""
    strategy = build_strategy(config.algorithm, config.options, config.mode)
    return max(requested or config.epochs, method_epochs(strategy))


def method_default_lr(config: TrainConfig) -> float:
    """The rate ``config``'s method uses when none is given: its paper's, else the
    dataset's default."""
    return resolve_lr(replace(config, lr=None))


def centre_lrs(setter: Cell, cells: Sequence[Cell]) -> tuple[float, ...]:
    """The rates ``setter``'s row and column tries multiples of: its method's default
    (:func:`method_default_lr`); for a matched comparator, also that of the methods it
    is matched with, when they agree on one (it runs with their optimizer and local
    work, but their loss may not be its: LfD's cosine head takes rates 30 times smaller
    than the linear head of its FedAvg)."""
    own = method_default_lr(setter.config)
    served = {
        method_default_lr(cell.config)
        for cell in cells
        if cell.comparator is not None and cell.rate_group == setter.group
    }
    return tuple(sorted({own} | served)) if len(served) == 1 else (own,)


def candidates(default: float, factors: Sequence[float], *others: float) -> tuple[float, ...]:
    """``default`` (and each of ``others``) times each factor, to 6 significant digits,
    ascending, without repeats."""
    return tuple(
        sorted(
            {float(f"{centre * factor:.6g}") for centre in (default, *others) for factor in factors}
        )
    )


def ranked(trials: Sequence[Trial], default: float) -> list[Trial]:
    """``trials`` best first: those that finished every epoch, then the diverged ones
    with their best epoch before diverging, then those without a score; within each, by
    validation accuracy, ties to the rate nearest the default (on a log scale), then to
    the smaller."""

    def key(trial: Trial) -> tuple:
        tier = 0 if trial.status in COMPLETE else 1
        if trial.accuracy is None:
            tier = 2
        return (tier, -(trial.accuracy or 0.0), abs(math.log(trial.lr / default)), trial.lr)

    return sorted(trials, key=key)


def choose(trials: Sequence[Trial], default: float) -> float:
    """The rate of the best validation score (the first of :func:`ranked`).

    Trials that finished every epoch come first; only when none did, the diverged ones
    count with their best epoch before diverging. Ties go to the rate nearest the
    default (on a log scale), then the smaller. Without any score: the default.
    """
    order = ranked(trials, default)
    if not order or order[0].accuracy is None:
        return default
    return order[0].lr


def rungs(candidates: int, epochs: int) -> list[tuple[int, int]]:
    """Successive halving's rungs: ``(candidates racing, epochs they have trained)``.

    The better half (rounded up) of a rung goes on to the next, until one is left; the
    last rung, of two, is decided after all ``epochs``, each earlier one after half the
    epochs of the next (rounded up, at least one). Three candidates over 30 epochs: all
    three 15 epochs, the better two 30 (75 run-epochs instead of 90).
    """
    counts = [candidates]
    while counts[-1] > 1:
        counts.append(math.ceil(counts[-1] / 2))
    racing = counts[:-1] or counts
    budgets = [epochs]
    for _ in racing[1:]:
        budgets.insert(0, max(1, math.ceil(budgets[0] / 2)))
    return list(zip(racing, budgets))


def tuning_config(
    cell: Cell, lr: float, tuning: Tuning, epochs: int, out: str | Path
) -> TrainConfig:
    """The tuning run of ``cell``'s row and column at rate ``lr``, trained ``epochs``."""
    return replace(
        cell.config,
        lr=lr,
        validation=tuning.validation,
        stop_on_plateau=None,
        epochs=epochs,
        out=str(tuning_folder(cell, lr, out)),
    )


def tuning_run_name(cell: Cell, lr: float) -> str:
    """The name of the tuning run of ``cell``'s row and column at rate ``lr``."""
    return f"tune/{cell.group}/lr-{lr:g}"


def tuning_folder(cell: Cell, lr: float, out: str | Path) -> Path:
    """Where the tuning run of ``cell``'s row and column at rate ``lr`` lives."""
    return Path(out) / "tune" / cell.group / f"lr-{lr:g}"


def tuning_cells(cells: Sequence[Cell]) -> dict[str, Cell]:
    """Per row and column whose rate is tuned (all but a paired grid's methods, which
    step at their comparator's), the cell tuning runs for: that of the first seed given."""
    first: dict[str, Cell] = {}
    for cell in cells:
        if cell.comparator is None:
            first.setdefault(cell.group, cell)
    return first


def tuning_specs(cells: Sequence[Cell], tuning: Tuning, out: str | Path) -> list[RunSpec]:
    """The first tuning runs: per row and column, every candidate rate for the tuning
    epochs (with ``halving``, its first rung's), on the validation split, in
    ``out/tune/<row>/<column>/lr-<rate>``."""
    return TuningPlan(cells, tuning, out).next_specs()


class TuningPlan:
    """The tuning of a grid: which runs its next decisions need, read from the tuning
    runs' folders (so a stopped tuning resumes to the same choices), and its choices.

    Use: ``while specs := plan.next_specs(): plan.record(run(specs))``, then
    :meth:`choices`. Each row and column goes through its rungs (or the plain grid) and
    then widens (see the module's notes), independently of the others.

    Parameters
    ----------
    cells : sequence of Cell
        The grid's cells; each row and column is tuned on its first seed's (a paired
        method's is its comparator's, whose candidates centre on the method's rate).
    tuning : Tuning
        How.
    out : str or Path
        The grid's folder.
    """

    def __init__(self, cells: Sequence[Cell], tuning: Tuning, out: str | Path) -> None:
        self.tuning = tuning
        self.out = out
        self.cells = tuning_cells(cells)
        self.defaults = {
            group: method_default_lr(cell.config) for group, cell in self.cells.items()
        }
        self.centres = {group: centre_lrs(cell, cells) for group, cell in self.cells.items()}
        #: how each tuning run ended in this session (a diverged run stays diverged)
        self.statuses: dict[str, str] = {}
        self.decided: dict[str, Choice] = {}

    def trial(self, cell: Cell, lr: float, epochs: int) -> tuple[Trial, RunSpec | None]:
        """Rate ``lr``'s result after ``epochs`` epochs, and the run still needed for it."""
        config = tuning_config(cell, lr, self.tuning, epochs, self.out)
        name = tuning_run_name(cell, lr)
        status = self.statuses.get(name, "missing")
        try:
            records = read_records(str(config.out))[:epochs]
        except CorruptRunError:
            records = []  # run again from epoch 1, unless kept (its outcome says corrupt)
        accuracy, epoch = validation_score(records)
        if len(records) >= epochs:
            status = "finished"
        elif status not in ("diverged", "failed", "corrupt"):  # ran this session and stopped
            return Trial(lr, accuracy, epoch, status, epochs), RunSpec(name, config)
        return Trial(lr, accuracy, epoch, status, epochs), None

    def group_state(self, group: str) -> tuple[list[RunSpec], Choice | None]:
        """The runs ``group``'s next decision needs, or its choice once made."""
        cell, default = self.cells[group], self.defaults[group]
        epochs = tuning_epochs(cell.config, self.tuning.epochs)
        racing = list(candidates(default, self.tuning.factors, *self.centres[group]))
        schedule = rungs(len(racing), epochs) if self.tuning.halving else [(len(racing), epochs)]
        # no rung shorter than the method needs for its own mechanism to act
        shortest = informative_epochs(cell.config)
        schedule = [(count, max(budget, min(shortest, epochs))) for count, budget in schedule]
        trials: dict[float, Trial] = {}
        for count, budget in schedule:
            if trials:  # the better part of the rung before goes on
                order = ranked([trials[lr] for lr in racing], default)
                if not self.near_chance(cell, order[0]):  # else none can be told worse
                    racing = [trial.lr for trial in order[:count]]
            needed = []
            for lr in racing:
                trials[lr], spec = self.trial(cell, lr, budget)
                if spec is not None:
                    needed.append(spec)
            if needed:
                return needed, None
        finalists = [trials[lr] for lr in racing]
        widened = {"up": 0, "down": 0}
        while True:
            tried = sorted(trials)
            best = choose(finalists, default)
            side = edge_side(best, tried)
            if side is None or widened[side] >= self.tuning.widen:
                break
            widened[side] += 1
            ratio = tried[-1] / tried[-2] if side == "up" else tried[0] / tried[1]
            lr = float(f"{best * ratio:.6g}")
            trials[lr], spec = self.trial(cell, lr, epochs)
            if spec is not None:
                return [spec], None
            finalists.append(trials[lr])
        leader = ranked(finalists, default)[0]
        cap = cell.config.epochs
        if epochs < cap and self.near_chance(cell, leader):
            # the rates could not be told apart in the tuning epochs: on to the cell's
            needed = []
            for index, finalist in enumerate(finalists):
                trials[finalist.lr], spec = self.trial(cell, finalist.lr, cap)
                finalists[index] = trials[finalist.lr]
                if spec is not None:
                    needed.append(spec)
            if needed:
                return needed, None
        every = tuple(sorted(trials.values(), key=lambda trial: trial.lr))
        return [], Choice(group, default, choose(finalists, default), every)

    def near_chance(self, cell: Cell, trial: Trial) -> bool:
        """Whether ``trial``'s score is within 5 points of chance (``1 / classes``, the
        classes its tuning run of ``cell`` recorded); not a trial without a score."""
        if trial.accuracy is None:
            return False
        folder = tuning_folder(cell, trial.lr, self.out)
        try:
            classes = saved_classes(read_json_object(folder / "config.json"))
        except (CorruptRunError, OSError):
            classes = None
        if classes is None:
            return False
        return 100 * (trial.accuracy - 1.0 / classes) <= NEAR_CHANCE_POINTS

    def next_specs(self) -> list[RunSpec]:
        """The runs the next decisions need (none: every choice is made)."""
        specs = []
        for group in self.cells:
            if group in self.decided:
                continue
            needed, choice = self.group_state(group)
            if choice is not None:
                self.decided[group] = choice
            specs += needed
        return specs

    def record(self, outcomes: dict[str, RunOutcome]) -> None:
        """How this session's tuning runs ended."""
        for name, outcome in outcomes.items():
            self.statuses[name] = outcome.status

    def choices(self) -> dict[str, Choice]:
        """The rate chosen per row and column (once :meth:`next_specs` asks for nothing)."""
        assert len(self.decided) == len(self.cells), "tuning runs are still needed"
        return {group: self.decided[group] for group in self.cells}


def edge_side(lr: float, tried: Sequence[float]) -> str | None:
    """``up`` when ``lr`` is the largest of two or more rates tried, ``down`` the
    smallest, else ``None``."""
    if len(tried) < 2:
        return None
    if lr == tried[-1]:
        return "up"
    if lr == tried[0]:
        return "down"
    return None


def tune(
    cells: Sequence[Cell],
    tuning: Tuning,
    out: str | Path,
    run: Callable[[str, list[RunSpec]], dict[str, RunOutcome]],
) -> dict[str, Choice]:
    """Tune every row and column: ``run(title, specs)`` runs each phase's tuning runs
    (the first, then each rung's survivors, then each widening) and returns their
    outcomes by name."""
    plan = TuningPlan(cells, tuning, out)
    phase = 0
    while specs := plan.next_specs():
        phase += 1
        plan.record(run("tuning lr" if phase == 1 else f"tuning lr, step {phase}", specs))
    return plan.choices()


def tuned_cells(cells: Sequence[Cell], chosen: dict[str, Choice]) -> list[Cell]:
    """``cells`` with the rate chosen for their rate group (their row and column's; a
    paired method's comparator's); a paired method's column at its own rate keeps it."""
    return [
        cell
        if cell.column.own_rate
        else replace(cell, config=replace(cell.config, lr=chosen[cell.rate_group].lr))
        for cell in cells
    ]
