"""``stratify reproduce``: a grid's cells as runs, tuned or not, then its tables and plots.

The output folder holds ``grid.json`` (what the grid was asked with), ``cells/`` (one run
folder per row, column and seed), ``tune/`` (the tuning runs), ``results.csv``,
``results.md``, ``tuning.csv`` and the plots. Running the same command again skips the
finished runs and resumes the others, so a grid can be finished in several sittings
(docs/architecture.md, "Reproducing the papers").
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from stratify.backend import cpu_backend
from stratify.data.holdout import holdout_validation
from stratify.errors import ConfigError, CorruptRunError, OutputError, StratifyError
from stratify.experiment import build_experiment, partition_clients
from stratify.files import guarded_as, read_file, release_input
from stratify.parallel import (
    Backend,
    DatasetCache,
    EventHandler,
    RunOutcome,
    RunSpec,
    run_specs,
)
from stratify.parallel.repeats import copy_run, repeated_runs
from stratify.reproduce.diverged import DIVERGED_FILE, DivergedRuns
from stratify.reproduce.grids import (
    DEFAULT_CLIENTS,
    Cell,
    Grid,
    Settings,
    grid_named,
    plan_cells,
    plateau_rounds,
)
from stratify.reproduce.plots import PlotsUnavailable, grid_plots
from stratify.reproduce.results import (
    UNFINISHED,
    CellResult,
    csv_runs,
    csv_text,
    markdown,
    read_cell,
)
from stratify.reproduce.tuning import (
    Choice,
    Tuning,
    TuningPlan,
    tune,
    tuned_cells,
    tuning_specs,
)
from stratify.reproduce.versus import versus_markdown
from stratify.runfiles import read_json_object, read_records
from stratify.runfolder import FolderLock, json_safe, write_output_file

GRID_FILE = "grid.json"
#: the files a grid writes into its folder besides the plots
OUTPUTS = (GRID_FILE, "tuning.csv", "results.csv", "results.md", DIVERGED_FILE)
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
    markdown: str = ""
    #: how the phases ran (``--vectorize``: what stepped together, what ran alone)
    run_notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[CellResult]:
        """The cells that did not finish: failed, incomplete, missing (never run: a report
        of a grid stopped part way), or corrupt and kept."""
        return [result for result in self.results if result.status in UNFINISHED]


def identity(grid: Grid, settings: Settings, tuning: Tuning | None) -> dict[str, Any]:
    """The settings that decide what every cell is: they must not change within a folder.

    Seeds, methods and epochs may change: they add cells or extend them.
    """
    return {
        "grid": grid.name,
        "dataset": settings.dataset or grid.values["dataset"],
        "dataset_options": settings.dataset_options,
        "clients": settings.clients or grid.values.get("clients", DEFAULT_CLIENTS),
        "model": settings.model,
        "secure": settings.secure,
        "tuning": None if tuning is None else tuning.identity(),
    }


def check_out(out: Path, expected: dict[str, Any]) -> bool:
    """Refuse a folder holding another grid (or the same with other fixed settings);
    whether ``grid.json`` is still to be written (a new grid)."""
    path = out / GRID_FILE
    try:
        saved = read_json_object(path)
    except FileNotFoundError:
        return True
    except (CorruptRunError, OSError) as error:
        reason = str(error) if isinstance(error, CorruptRunError) else error.strerror
        raise ConfigError(
            f"{path} is unreadable ({reason}); move {out} away or use another --out"
        ) from None
    expected_json = json.loads(json.dumps(expected))
    differing = [
        f"{key}: {saved.get(key)!r:.60} there, {value!r} now"
        for key, value in expected_json.items()
        if saved.get(key) != value
    ]
    if differing:
        raise ConfigError(
            f"{out} holds a grid run with other settings ({'; '.join(differing)}); "
            "give the same settings to continue it, or use another --out"
        )
    return False


def check_setups(specs: Sequence[RunSpec]) -> None:
    """Set up every run of ``specs`` as it would start, without training it, so a value
    that would fail in a cell is refused before anything is written or run.

    Each distinct configuration (seeds aside) is built whole (dataset, validation split,
    partition, method, model, engine; the plain registry, which accepts what CKKS does);
    every seed's partition is checked too, since a seed can leave a label with no
    client. Refused here: an unknown ``--model`` or one that does not fit the data, a
    missing or unreadable data file, ``--device cuda`` without a GPU, more clients than
    samples or a partition that leaves a label to no client, a validation share that
    leaves a label no sample, and dataset options out of range.

    Raises
    ------
    StratifyError
        One line naming the first run whose set-up fails and why.
    """
    datasets = DatasetCache(size=2)
    built: set[str] = set()
    # a single-sample set-up switches this process to one thread, oneDNN off: undone after
    with cpu_backend():
        for spec in specs:
            config = replace(spec.config, secure=False, out=None)
            try:
                dataset = datasets.load(config)
                setup = json.dumps(json_safe({**config.comparable(), "seed": None}), default=str)
                if setup not in built:
                    build_experiment(config, dataset=dataset)
                    built.add(setup)
                    continue
                if config.validation:
                    dataset, _ = holdout_validation(dataset, config.validation, seed=config.seed)
                partition_clients(dataset, config)
            except StratifyError as error:
                raise ConfigError(f"{spec.name}: {error}") from None


def run_phase(
    title: str,
    specs: Sequence[RunSpec],
    backend: Backend | None,
    display: Display | None,
    vectorize: int | None = None,
    notes: list[str] | None = None,
    diverged: DivergedRuns | None = None,
) -> dict[str, RunOutcome]:
    """Run a phase's specs (``vectorize``: in groups stepped together); a grouping note,
    if any, is added to ``notes`` prefixed with the phase's title.

    A spec that repeats another's run (:func:`~stratify.parallel.repeats.repeated_runs`)
    is not run: the other's files are copied into its folder once that run has ended,
    and a note says which. A spec that ``diverged`` records as stopped by a non-finite
    loss in the same configuration is not run again: its recorded outcome stands.
    """
    repeats = repeated_runs(specs)
    known = {
        spec.name: outcome
        for spec in specs
        if diverged is not None and (outcome := diverged.outcome(spec)) is not None
    }
    own = [spec for spec in specs if spec.name not in repeats and spec.name not in known]
    context = display(title, own) if display is not None else nullcontext(None)
    phase_notes: list[str] = []
    if known:
        phase_notes.append(
            f"not run again, diverged before in the same configuration ({DIVERGED_FILE}): "
            + ", ".join(sorted(known))
        )
    with context as on_event:
        outcomes = {
            outcome.name: outcome
            for outcome in run_specs(own, backend, on_event, vectorize, phase_notes.append)
        }
    outcomes |= known
    folders = {spec.name: str(spec.config.out) for spec in specs}
    for name, source in repeats.items():
        outcome = outcomes[source.name]
        if outcome.status in ("finished", "skipped", "diverged"):
            copy_run(folders[source.name], folders[name])
        outcomes[name] = replace(outcome, name=name)
    if repeats:
        phase_notes.append(
            "run once and copied, the same configuration: "
            + "; ".join(f"{name} from {source.name}" for name, source in repeats.items())
        )
    if diverged is not None:
        diverged.record(list(specs), outcomes)
    if notes is not None:
        notes += [f"{title}: {note}" for note in phase_notes]
    return outcomes


def write_tuning_csv(chosen: dict[str, Choice], path: Path) -> None:
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    writer.writerow(
        [
            "group",
            "lr",
            "default_lr",
            "last_rounds_validation_accuracy",
            "last_epoch",
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
    write_output_file(path, buffer.getvalue().encode())


def reproduce(
    grid_name: str,
    out: str | Path,
    settings: Settings,
    *,
    tuning: Tuning | None = None,
    backend: Backend | None = None,
    display: Display | None = None,
    keep_corrupt: bool = False,
    vectorize: int | None = None,
    report_only: bool = False,
    write: bool = True,
) -> Report:
    """Run grid ``grid_name`` into ``out`` and write its tables and plots.

    The folder is locked for the whole grid (a second ``reproduce`` on it is refused),
    and every run is set up once before anything is written (:func:`check_setups`), so a
    bad value leaves the folder as it was. Each output file is replaced atomically.

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
    keep_corrupt : bool
        Leave a run folder whose files cannot be read back (reported ``corrupt``)
        instead of running it again from its first epoch.
    vectorize : int, optional
        Step runs that can share a step together, this many to a group
        (:mod:`stratify.vectorize`); the report's ``run_notes`` say what ran alone.
    report_only : bool
        Run nothing: write the tables and plots from what the run folders hold (a grid
        stopped part way, or run on another machine); unfinished cells show as such.
    write : bool, default True
        Write the tables and plots; ``False``: only return the report (the first stage
        of ``--seeds-until-verdict``, whose tables the second stage writes).
    """
    grid = grid_named(grid_name)
    out = grid_folder(out)
    cells, notes = plan_cells(grid, settings, out, own_rates=tuning is not None)
    with FolderLock(out, holder="grid") as lock:
        new_grid = check_out(out, identity(grid, settings, tuning))
        for name in OUTPUTS:
            if (out / name).is_dir():
                raise OutputError(
                    f"{out / name} is a folder, where the grid writes its {name}; move it "
                    "away or use another --out"
                )
        tuning_runs = tuning_specs(cells, tuning, out) if tuning is not None else []
        if not report_only:  # a report builds no run (the runs may need another machine)
            check_setups(tuning_runs + cell_specs(cells))
        if new_grid:
            out.mkdir(parents=True, exist_ok=True)
            lock.lock_folder()
            write_output_file(
                out / GRID_FILE,
                (json.dumps(identity(grid, settings, tuning), indent=2) + "\n").encode(),
            )
        files: list[Path] = []
        run_notes: list[str] = []
        chosen = None
        diverged = DivergedRuns(out, vectorize)
        if tuning is not None:

            def run_tuning(title: str, specs: list[RunSpec]) -> dict[str, RunOutcome]:
                specs = [replace(spec, keep_corrupt=keep_corrupt) for spec in specs]
                return run_phase(
                    f"{grid.name} · {title}",
                    specs,
                    backend,
                    display,
                    vectorize,
                    run_notes,
                    diverged,
                )

            if report_only:
                chosen, _ = tuning_progress(TuningPlan(cells, tuning, out), diverged)
                if chosen is None:
                    notes.append("the learning-rate tuning is unfinished: no tuning table")
            else:
                chosen = tune(cells, tuning, out, run_tuning)
            if chosen is not None:
                cells = tuned_cells(cells, chosen)
        outcomes: dict[str, RunOutcome] = {}
        for title, phase in cell_phases(grid, cells, settings):
            specs = [replace(spec, keep_corrupt=keep_corrupt) for spec in cell_specs(phase)]
            title = grid.name if title == "cells" else f"{grid.name} · {title}"
            if report_only:
                outcomes |= {
                    spec.name: outcome
                    for spec in specs
                    if (outcome := diverged.outcome(spec)) is not None
                }
            else:
                outcomes |= run_phase(
                    title, specs, backend, display, vectorize, run_notes, diverged
                )
        cells = at_comparator_rounds(cells, settings)
        results = [read_cell(cell, outcomes.get(cell.key)) for cell in cells]
        if not write:
            return Report(grid, cells, results, chosen, notes, files, run_notes=run_notes)
        if report_only:
            check_report_keeps_runs(results, out / "results.csv")
        if chosen is not None:
            write_tuning_csv(chosen, out / "tuning.csv")
            files.append(out / "tuning.csv")
        write_output_file(out / "results.csv", csv_text(grid, results, tuning is not None))
        table = markdown(grid, cells, results, settings.seeds, tuning, chosen, notes)
        if grid.reference is not None:
            runs = csv_runs(grid, results, tuning is not None)
            table += "\n" + versus_markdown(runs, grid.reference, grid.paper)
        write_output_file(out / "results.md", table.encode())
        files += [out / "results.csv", out / "results.md"]
        report = Report(
            grid, cells, results, chosen, notes, files, markdown=table, run_notes=run_notes
        )
        try:
            report.files += grid_plots(grid, results, out)
        except PlotsUnavailable as error:
            report.plots_note = (
                f"{error}; then run the same command again to draw them (the finished runs "
                "are skipped)"
            )
    return report


def tuning_progress(
    plan: TuningPlan, diverged: DivergedRuns
) -> tuple[dict[str, Choice] | None, list[RunSpec]]:
    """The rates ``plan`` chooses from what the tuning folders hold, a tuning run that
    :class:`DivergedRuns` records as diverged counting as ended (diverged), as a run of
    the grid would count it; while a tuning run is still needed, ``None`` and the runs
    the next decision needs."""
    while specs := plan.next_specs():
        known = {
            spec.name: outcome for spec in specs if (outcome := diverged.outcome(spec)) is not None
        }
        if len(known) < len(specs):
            return None, specs
        plan.record(known)
    return plan.choices(), []


@dataclass
class RunPlan:
    """What running a grid's command now would do (``--dry-run``).

    Attributes
    ----------
    phases : list of (str, list of RunSpec)
        Each phase's title and runs: the tuning runs its next decision needs while the
        tuning is open, then the cells'.
    cells : list of Cell
        The cells as they would run: at their tuned rates once the tuning has chosen,
        a paired method at the rounds its comparator ran once that has run.
    diverged : frozenset of str
        The names of the runs the grid's record says diverged in the same configuration:
        not run again.
    tuning_open : bool
        Tuning runs are still needed (the rates, and so the cells' configurations, are
        not known yet).
    """

    phases: list[tuple[str, list[RunSpec]]]
    cells: list[Cell]
    diverged: frozenset[str]
    tuning_open: bool


def plan_runs(
    grid: Grid,
    cells: Sequence[Cell],
    settings: Settings,
    tuning: Tuning | None,
    out: str | Path,
    vectorize: int | None = None,
) -> RunPlan:
    """What :func:`reproduce` would run now in ``out``, read from its folders without
    running or writing anything: the tuning's choices and the comparators' rounds where
    they are recorded, and the divergences it would not run again."""
    record = DivergedRuns(Path(out), vectorize)
    phases: list[tuple[str, list[RunSpec]]] = []
    tuning_open = False
    cells = list(cells)
    if tuning is not None:
        chosen, needed = tuning_progress(TuningPlan(cells, tuning, out), record)
        if chosen is None:
            tuning_open = True
            phases.append(("tuning", needed))
        else:
            cells = tuned_cells(cells, chosen)
    phases += [(title, cell_specs(phase)) for title, phase in cell_phases(grid, cells, settings)]
    cells = at_comparator_rounds(cells, settings)
    diverged = frozenset(
        spec.name for _, specs in phases for spec in specs if record.outcome(spec) is not None
    )
    return RunPlan(phases, cells, diverged, tuning_open)


def ended_runs(path: Path) -> int | None:
    """The runs the grid's ``results.csv`` at ``path`` reports as ended (finished, or
    stopped by a non-finite loss); ``None`` when there is no such file or it cannot be
    read as one (nothing in it to lose)."""
    guarded = guarded_as(path) is not None
    try:
        text = read_file(path).decode("utf-8")
        rows = list(csv.DictReader(io.StringIO(text)))
    except (OSError, CorruptRunError, UnicodeDecodeError, csv.Error):
        return None
    finally:
        # read to compare, not as an input: the grid replaces it under its folder lock
        if not guarded:
            release_input(path)
    if not rows or "status" not in rows[0]:
        return None
    return sum(row["status"] not in (*UNFINISHED, None, "") for row in rows)


def check_report_keeps_runs(results: Sequence[CellResult], path: Path) -> None:
    """Refuse a ``--report-only`` report that ends fewer runs than the ``results.csv``
    at ``path`` it would replace (with its ``results.md``): a report read from partly
    moved or damaged run folders must not overwrite the record of the runs.

    Parameters
    ----------
    results : sequence of CellResult
        The new report's cells.
    path : Path
        The grid's ``results.csv``.

    Raises
    ------
    OutputError
        One line; nothing is written.
    """
    before = ended_runs(path)
    now = sum(result.status not in UNFINISHED for result in results)
    if before is not None and now < before:
        raise OutputError(
            f"--report-only: the run folders now show {now} ended run(s) of "
            f"{len(results)}, fewer than the {before} of {path}; results.csv and results.md "
            "are left as they are (run the grid without --report-only to finish the runs)"
        )


def cell_phases(
    grid: Grid, cells: Sequence[Cell], settings: Settings
) -> Iterator[tuple[str, list[Cell]]]:
    """The grid's cells in the order they run, a phase at a time: in one phase, or, under
    a plateau budget, the comparators first (their plateaus set the methods' rounds), then
    the methods at the rounds their comparators ran, read when that phase is reached (so
    after the comparators' phase has run)."""
    if settings.plateau is None:
        yield "cells", list(cells)
        return
    yield "comparators", [cell for cell in cells if cell.is_comparator]
    yield (
        "methods",
        [cell for cell in at_comparator_rounds(cells, settings) if not cell.is_comparator],
    )


def at_comparator_rounds(cells: Sequence[Cell], settings: Settings) -> list[Cell]:
    """Under a plateau budget, ``cells`` with each paired method at the rounds its
    comparator ran (:func:`~stratify.reproduce.grids.plateau_rounds`); else as they are."""
    if settings.plateau is None:
        return list(cells)
    return plateau_rounds(cells, comparator_rounds(cells))


def comparator_rounds(cells: Sequence[Cell]) -> dict[str, int]:
    """Comparator cell key -> the epochs its folder holds (0 where none)."""
    rounds = {}
    for cell in cells:
        if cell.is_comparator:
            try:
                rounds[cell.key] = len(read_records(str(cell.config.out)))
            except CorruptRunError:
                rounds[cell.key] = 0
    return rounds


def grid_folder(out: str | Path) -> Path:
    """``out`` as a Path; an empty name (which Path would read as the current folder) is
    refused."""
    if not str(out).strip():
        raise OutputError("--out needs a folder name, got an empty one")
    return Path(out)


def cell_specs(cells: Sequence[Cell]) -> list[RunSpec]:
    """One run per cell, named by its key."""
    return [RunSpec(cell.key, cell.config) for cell in cells]
