"""How long a grid takes on this machine, from per-epoch costs measured here.

A short calibration trains every kind of run of the grid (its method, mode and options:
a column) for :data:`CALIBRATION_EPOCHS` epochs on the grid's first row, the way the
grid will run it: a kind whose runs step together (``--vectorize``) as a group of as many
runs as its group in the grid will hold, the others alone. An epoch's cost is the wall
time from one epoch's end to the next over the runs that made it, evaluation and
checkpoint included; the first epochs keep their own costs (set-up, the compile,
FedDiverse's one-off estimation), later epochs cost as the last measured one. The costs
are stored in ``OUT/calibration.json`` and reused while the grid's kinds, group sizes and
this machine's CPU count stay the same (docs/architecture.md, "Reproducing the papers").
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from stratify.algorithms import build_strategy
from stratify.config import TrainConfig
from stratify.errors import CorruptRunError, OutputError, TrainingError
from stratify.files import file_kind
from stratify.parallel import (
    LocalBackend,
    RunEvent,
    RunOutcome,
    RunSpec,
    available_cores,
    folder_state,
    run_specs,
)
from stratify.reproduce.grids import Cell, slug
from stratify.reproduce.tuning import (
    Tuning,
    candidates,
    method_default_lr,
    rungs,
    tuning_cells,
    tuning_config,
    tuning_run_name,
)
from stratify.runfiles import is_count, is_metric, read_json_object
from stratify.runfolder import describe_os_error, write_atomically
from stratify.vectorize import plan_groups

CALIBRATION_FILE = "calibration.json"
#: epochs each kind is calibrated with: the first two may hold one-off costs
CALIBRATION_EPOCHS = 3


def kind_of(cell: Cell) -> str:
    """What decides the cost of a cell's epochs here: its column (method, mode, options)."""
    return cell.column.key


@dataclass(frozen=True)
class Cost:
    """Seconds of one run's epochs: ``epochs[i]`` for epoch ``i + 1``; every later
    epoch costs as the last."""

    epochs: tuple[float, ...]

    def between(self, done: int, target: int) -> float:
        """Seconds from ``done`` epochs to ``target``."""
        last = len(self.epochs) - 1
        return sum(self.epochs[min(epoch, last)] for epoch in range(done, target))


@dataclass(frozen=True)
class Work:
    """Runs of one kind still to train in a phase: ``count`` runs from ``done`` to
    ``target`` epochs; ``unit`` how many of them a worker takes at once (a group)."""

    phase: str
    kind: str
    count: int
    done: int
    target: int
    unit: int = 1


def group_sizes(cells: Sequence[Cell], vectorize: int | None) -> dict[str, int]:
    """Per kind, the size of the group its first cell steps in (1: alone)."""
    if vectorize is None:
        return {kind_of(cell): 1 for cell in cells}
    grouping = plan_groups([cell.config for cell in cells], vectorize)
    size_of = {index: len(group) for group in grouping.groups for index in group}
    sizes: dict[str, int] = {}
    for index, cell in enumerate(cells):
        sizes.setdefault(kind_of(cell), size_of[index])
    return sizes


def calibration_options(config: TrainConfig) -> dict:
    """A cell's options for its short calibration runs: a warm-up (FedBSS's, given or its
    default) cut to one round, so that the run is accepted and its later epochs time the
    method's main stage, which is most of a full run."""
    resolved = build_strategy(config.algorithm, config.options, config.mode).options
    if getattr(resolved, "warmup_rounds", 0) > 1:
        return {**config.options, "warmup_rounds": 1}
    return config.options


def calibration_specs(
    cells: Sequence[Cell], sizes: dict[str, int], out: Path
) -> dict[str, list[RunSpec]]:
    """Per kind, its calibration runs: the kind's first cell, seeds 0, 1, … for as many
    runs as its group holds, :data:`CALIBRATION_EPOCHS` epochs, in ``out/calibration``."""
    specs: dict[str, list[RunSpec]] = {}
    for cell in cells:
        kind = kind_of(cell)
        if kind in specs:
            continue
        specs[kind] = [
            RunSpec(
                f"calibration/{kind}/seed-{seed}",
                replace(
                    cell.config,
                    seed=seed,
                    epochs=CALIBRATION_EPOCHS,
                    # a calibration run times its epochs and never stops early
                    stop_on_plateau=None,
                    options=calibration_options(cell.config),
                    out=str(out / "calibration" / slug(kind) / f"seed-{seed}"),
                ),
                policy="overwrite",
            )
            for seed in range(sizes[kind])
        ]
    return specs


def measure(
    specs: Sequence[RunSpec], vectorize: int | None, clock: Callable[[], float] = time.perf_counter
) -> tuple[float, ...]:
    """Per-run seconds of each epoch of ``specs`` run together in this process: the wall
    time between the moments the last run finished one epoch and the next, over the
    runs."""
    ends: dict[int, float] = {}
    count = len(specs)
    finished: dict[int, int] = {}

    def on_event(event: RunEvent | RunOutcome) -> None:
        if isinstance(event, RunEvent) and event.kind == "epoch":
            finished[event.epoch] = finished.get(event.epoch, 0) + 1
            if finished[event.epoch] == count:
                ends[event.epoch] = clock()

    start = clock()
    outcomes = run_specs(specs, LocalBackend(1), on_event, vectorize)
    failed = [outcome for outcome in outcomes if outcome.status != "finished"]
    if failed:
        raise CalibrationError(f"{failed[0].name} {failed[0].status}: {failed[0].message}")
    moments = [start] + [ends[epoch] for epoch in range(1, CALIBRATION_EPOCHS + 1)]
    return tuple((b - a) / count for a, b in zip(moments, moments[1:]))


class CalibrationError(TrainingError):
    """A calibration run did not finish (diverged, or failed)."""


def machine() -> dict[str, Any]:
    """What a calibration holds for: this machine's cores."""
    return {"cores": available_cores(), "cpu_count": os.cpu_count()}


#: the longest one epoch's stored cost may be (a week): more is a damaged file
LONGEST_EPOCH_SECONDS = 7 * 24 * 3600.0


def valid_entry(entry: object) -> bool:
    """A stored kind as :func:`load_costs` writes it: ``{"group": n >= 1, "epochs":
    [seconds, …]}``, every cost a positive finite number of at most a week."""
    if not isinstance(entry, dict) or not is_count(entry.get("group"), 1):
        return False
    epochs = entry.get("epochs")
    return (
        isinstance(epochs, list)
        and 0 < len(epochs) <= CALIBRATION_EPOCHS
        and all(is_metric(value) and 0 < value <= LONGEST_EPOCH_SECONDS for value in epochs)
    )


def read_calibration(path: Path) -> dict[str, Any]:
    """The kinds stored in ``path`` that hold for this machine; a damaged file (not
    UTF-8, not JSON, fields of the wrong type or out of range) holds none, so its kinds
    are calibrated again and the file replaced.

    Raises
    ------
    OutputError
        Something else than a regular file is in its place (a folder, a FIFO), or it
        cannot be read: refused before any calibration.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return {}
    except OSError as error:
        raise OutputError(f"cannot read {path}: {describe_os_error(error)}") from None
    if not stat.S_ISREG(mode):
        raise OutputError(
            f"{path} is {file_kind(mode)}, where the grid keeps its calibration; move it away"
        )
    try:
        saved = read_json_object(path)
    except CorruptRunError:
        return {}
    except OSError as error:
        raise OutputError(f"cannot read {path}: {describe_os_error(error)}") from None
    kinds = saved.get("kinds")
    if saved.get("machine") != machine() or not isinstance(kinds, dict):
        return {}
    return {kind: entry for kind, entry in kinds.items() if valid_entry(entry)}


def load_costs(
    out: Path, sizes: dict[str, int], calibrate: Callable[[str], tuple[float, ...]]
) -> tuple[dict[str, Cost], list[str], dict[str, str]]:
    """The stored costs of ``out/calibration.json`` where they fit (same machine, same
    group size, valid: :func:`read_calibration`), the others calibrated now with
    ``calibrate(kind)`` and stored (the file replaced atomically); the kinds calibrated
    now; and the kinds whose calibration did not finish (:class:`CalibrationError`), with
    why: they have no cost and nothing is stored for them."""
    path = out / CALIBRATION_FILE
    stored = read_calibration(path)
    costs, measured, unmeasured = {}, [], {}
    for kind, size in sizes.items():
        entry = stored.get(kind)
        if entry is None or entry["group"] != size:
            try:
                entry = {"group": size, "epochs": list(calibrate(kind))}
            except CalibrationError as error:
                unmeasured[kind] = str(error)
                continue
            stored[kind] = entry
            measured.append(kind)
        costs[kind] = Cost(tuple(float(value) for value in entry["epochs"]))
    if measured:
        text = json.dumps({"machine": machine(), "kinds": stored}, indent=2) + "\n"
        try:
            out.mkdir(parents=True, exist_ok=True)
            write_atomically(path, text.encode())
        except OSError as error:
            raise OutputError(f"cannot write {path}: {describe_os_error(error)}") from None
    return costs, measured, unmeasured


def cell_work(
    cells: Sequence[Cell], sizes: dict[str, int], ended: AbstractSet[str] = frozenset()
) -> list[Work]:
    """The cells' epochs left, per kind; a cell whose key is in ``ended`` (a recorded
    divergence, not run again) has none."""
    work = []
    for cell in cells:
        if cell.key in ended:
            continue
        state = folder_state(cell.config)
        done = cell.config.epochs if state.kind == "finished" else state.epochs_kept
        if done < cell.config.epochs:
            work.append(
                Work("cells", kind_of(cell), 1, done, cell.config.epochs, sizes[kind_of(cell)])
            )
    return work


def tuning_work(
    cells: Sequence[Cell],
    tuning: Tuning,
    out: Path,
    sizes: dict[str, int],
    ended: AbstractSet[str] = frozenset(),
) -> tuple[list[Work], list[Work]]:
    """The tuning's epochs left per kind, and what widening could add: every row and
    column trying ``widen`` more rates for the full tuning epochs. A tuning run named in
    ``ended`` (a recorded divergence) has none left.

    With halving, rung ``i`` trains its racing count from the rung before's epochs to its
    own (which candidates race is known only once the rung before has run, so its runs'
    folders are not read).
    """
    work, widening = [], []
    for cell in tuning_cells(cells).values():
        kind, size = kind_of(cell), sizes[kind_of(cell)]
        epochs = tuning.epochs or cell.config.epochs
        rates = candidates(method_default_lr(cell.config), tuning.factors)
        if tuning.halving:
            previous = 0
            for count, budget in rungs(len(rates), epochs):
                work.append(Work("tuning", kind, count, previous, budget, size))
                previous = budget
        else:
            for lr in rates:
                if tuning_run_name(cell, lr) in ended:
                    continue
                state = folder_state(tuning_config(cell, lr, tuning, epochs, out))
                done = epochs if state.kind == "finished" else state.epochs_kept
                if done < epochs:
                    work.append(Work("tuning", kind, 1, done, epochs, size))
        if tuning.widen:
            widening.append(Work("widening", kind, tuning.widen, 0, epochs, 1))
    return work, widening


def seconds(work: Sequence[Work], costs: dict[str, Cost], workers: int) -> float:
    """Wall seconds of ``work`` on ``workers`` processes, each phase packed evenly but
    never shorter than its longest unit (a group or a run)."""
    total = 0.0
    for phase in dict.fromkeys(item.phase for item in work):
        items = [item for item in work if item.phase == phase]
        run_seconds = sum(
            item.count * costs[item.kind].between(item.done, item.target) for item in items
        )
        longest = max(
            min(item.unit, item.count) * costs[item.kind].between(item.done, item.target)
            for item in items
        )
        total += max(run_seconds / workers, longest)
    return total


def summary(
    work: Sequence[Work],
    widening: Sequence[Work],
    costs: dict[str, Cost],
    workers: int,
    upper_bound: bool = False,
) -> str:
    """One line: the estimated hours, and what widening could add; ``upper_bound``:
    the runs may stop sooner (a plateau), the hours are the most they take."""
    base = seconds(work, costs, workers)
    bound = "at most " if upper_bound else ""
    text = f"estimated {bound}{base / 3600:.1f} h on {workers} worker(s) here"
    if upper_bound:
        text += " (a run that plateaus stops sooner)"
    if widening:
        extra = seconds(list(widening), costs, workers)
        text += f" (+ up to {extra / 3600:.1f} h if every tuned rate lands at an edge and widens)"
    return text
