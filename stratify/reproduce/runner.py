"""``stratify reproduce``: a grid's cells as runs, tuned or not, then its tables and plots.

The output folder holds ``grid.json`` (what the grid was asked with), ``cells/`` (one run
folder per row, column and seed), ``tune/`` (the tuning runs), ``results.csv``,
``results.md``, ``tuning.csv`` and the plots. Running the same command again skips the
finished runs and resumes the others, so a grid can be finished in several sittings
(docs/architecture.md, "Reproducing the papers").
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stratify.errors import ConfigError
from stratify.parallel import Backend, EventHandler, RunOutcome, RunSpec, run_specs
from stratify.reproduce.grids import Cell, Grid, Settings, grid_named, plan_cells
from stratify.reproduce.plots import PlotsUnavailable, grid_plots
from stratify.reproduce.results import CellResult, markdown, read_cell, write_csv
from stratify.reproduce.tuning import Choice, Tuning, tune, tuned_cells

GRID_FILE = "grid.json"
#: a display: given a phase's title and runs, the context in which it shows their events
Display = Callable[[str, Sequence[RunSpec]], AbstractContextManager[EventHandler | None]]


@dataclass
class Report:
    """What a grid run produced."""

    grid: Grid
    cells: list[Cell]
    results: list[CellResult]
    chosen: dict[str, Choice] | None
    notes: list[str]
    files: list[Path] = field(default_factory=list)
    plots_note: str | None = None
    #: how the phases ran (``--vectorize``: what stepped together, what ran alone)
    run_notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[CellResult]:
        return [result for result in self.results if result.status in ("failed", "incomplete")]


def identity(grid: Grid, settings: Settings, tuning: Tuning | None) -> dict[str, Any]:
    """The settings that decide what every cell is: they must not change within a folder.

    Seeds, methods and epochs may change: they add cells or extend them.
    """
    return {
        "grid": grid.name,
        "dataset": settings.dataset or grid.values["dataset"],
        "dataset_options": settings.dataset_options,
        "clients": settings.clients,
        "model": settings.model,
        "secure": settings.secure,
        "tuning": None if tuning is None else tuning.identity(),
    }


def check_out(out: Path, expected: dict[str, Any]) -> None:
    """Refuse a folder holding another grid (or the same with other fixed settings);
    record this one's settings in ``grid.json``."""
    path = out / GRID_FILE
    if path.exists():
        try:
            saved = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            raise ConfigError(
                f"{path} is unreadable; move {out} away or use another --out"
            ) from None
        expected_json = json.loads(json.dumps(expected))
        differing = [
            f"{key}: {saved.get(key)!r} there, {value!r} now"
            for key, value in expected_json.items()
            if saved.get(key) != value
        ]
        if differing:
            raise ConfigError(
                f"{out} holds a grid run with other settings ({'; '.join(differing)}); "
                "give the same settings to continue it, or use another --out"
            )
        return
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(expected, indent=2) + "\n")


def run_phase(
    title: str,
    specs: Sequence[RunSpec],
    backend: Backend | None,
    display: Display | None,
    vectorize: int | None = None,
    notes: list[str] | None = None,
) -> dict[str, RunOutcome]:
    """Run a phase's specs (``vectorize``: in groups stepped together); a grouping note,
    if any, is added to ``notes`` prefixed with the phase's title."""
    context = display(title, specs) if display is not None else nullcontext(None)
    phase_notes: list[str] = []
    with context as on_event:
        outcomes = run_specs(specs, backend, on_event, vectorize, phase_notes.append)
    if notes is not None:
        notes += [f"{title}: {note}" for note in phase_notes]
    return {outcome.name: outcome for outcome in outcomes}


def write_tuning_csv(chosen: dict[str, Choice], path: Path) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            [
                "group",
                "lr",
                "default_lr",
                "validation_accuracy",
                "best_epoch",
                "status",
                "chosen",
                "epochs",
            ]
        )
        for choice in chosen.values():
            for trial in choice.trials:
                writer.writerow(
                    [
                        choice.group,
                        trial.lr,
                        choice.default,
                        "" if trial.accuracy is None else trial.accuracy,
                        "" if trial.epoch is None else trial.epoch,
                        trial.status,
                        trial.lr == choice.lr,
                        "" if trial.epochs is None else trial.epochs,
                    ]
                )


def reproduce(
    grid_name: str,
    out: str | Path,
    settings: Settings,
    *,
    tuning: Tuning | None = None,
    backend: Backend | None = None,
    display: Display | None = None,
    vectorize: int | None = None,
) -> Report:
    """Run grid ``grid_name`` into ``out`` and write its tables and plots.

    Parameters
    ----------
    grid_name : str
        One of :data:`~stratify.reproduce.grids.GRIDS`.
    out : str or Path
        The grid's folder; finished runs in it are skipped.
    settings : Settings
        Dataset, epochs, seeds and the rest the command changes.
    tuning : Tuning, optional
        Tune each row and column's learning rate first (default: each method's default).
    backend : Backend, optional
        Where the runs execute (default: local workers, one per core).
    display : callable, optional
        ``display(title, specs)`` gives the context that shows a phase's progress.
    vectorize : int, optional
        Step runs that can share a step together, this many to a group
        (:mod:`stratify.vectorize`); the report's ``run_notes`` say what ran alone.
    """
    grid = grid_named(grid_name)
    out = Path(out)
    cells, notes = plan_cells(grid, settings, out)
    check_out(out, identity(grid, settings, tuning))
    files: list[Path] = []
    run_notes: list[str] = []
    chosen = None
    if tuning is not None:

        def run_tuning(title: str, specs: list[RunSpec]) -> dict[str, RunOutcome]:
            return run_phase(
                f"{grid.name} · {title}", specs, backend, display, vectorize, run_notes
            )

        chosen = tune(cells, tuning, out, run_tuning)
        write_tuning_csv(chosen, out / "tuning.csv")
        files.append(out / "tuning.csv")
        cells = tuned_cells(cells, chosen)
    specs = [RunSpec(cell.key, cell.config) for cell in cells]
    outcomes = run_phase(grid.name, specs, backend, display, vectorize, run_notes)
    results = [read_cell(cell, outcomes.get(cell.key)) for cell in cells]
    write_csv(grid, results, tuning is not None, out / "results.csv")
    (out / "results.md").write_text(
        markdown(grid, cells, results, settings.seeds, tuning, chosen, notes)
    )
    files += [out / "results.csv", out / "results.md"]
    report = Report(grid, cells, results, chosen, notes, files, run_notes=run_notes)
    try:
        report.files += grid_plots(grid, results, out)
    except PlotsUnavailable as error:
        report.plots_note = (
            f"{error}; then run the same command again to draw them (the finished runs are skipped)"
        )
    return report
