"""`stratify reproduce GRID --out DIR`: a paper's comparison as a resumable grid of runs."""

from __future__ import annotations

import dataclasses
import signal
import sys
from collections.abc import Iterator, Sequence
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from pathlib import Path

import click
from rich.console import Console

from stratify.backend import DEVICES
from stratify.cli.board import RunBoard
from stratify.cli.common import DATA_DIR, DATASET_OPTION, VECTORIZE_OPTION, parse_options
from stratify.cli.console import table_console
from stratify.errors import ConfigError, StratifyError
from stratify.parallel import (
    RayBackend,
    RunsInterrupted,
    RunSpec,
    available_cores,
    folder_state,
    make_backend,
)
from stratify.reproduce.estimate import (
    CALIBRATION_EPOCHS,
    CALIBRATION_FILE,
    calibration_specs,
    cell_work,
    group_sizes,
    load_costs,
    measure,
    summary,
    tuning_work,
)
from stratify.reproduce.grids import GRIDS, Cell, Settings, grid_named, plan_cells
from stratify.reproduce.paired import pair_budgets
from stratify.reproduce.results import csv_runs
from stratify.reproduce.runner import (
    Display,
    Report,
    RunPlan,
    check_setups,
    grid_folder,
    plan_runs,
    reproduce,
)
from stratify.reproduce.sequential import extension
from stratify.reproduce.tuning import (
    DEFAULT_FACTORS,
    DEFAULT_VALIDATION,
    DEFAULT_WIDEN,
    Tuning,
)
from stratify.validation import check_int, check_positive, check_positive_int, check_seeds

GRID_LIST = "\n".join(f"  {name:<20} {grid.description}" for name, grid in GRIDS.items())


def board_display(console: Console) -> Display:
    """A :class:`RunBoard` for each phase of the grid."""

    @contextmanager
    def display(title: str, specs: Sequence[RunSpec]) -> Iterator[RunBoard]:
        board = RunBoard(console, title, [(spec.name, spec.config.epochs) for spec in specs])
        with board.live():
            yield board

    return display


def parse_list(value: str, flag: str) -> tuple[str, ...]:
    items = tuple(part.strip() for part in value.split(",") if part.strip())
    if not items:
        raise ConfigError(f"{flag} takes a comma-separated list, got {value!r}")
    return items


def print_plan(
    console: Console,
    specs_by_phase: list[tuple[str, list[RunSpec]]],
    keep_corrupt: bool,
    diverged: AbstractSet[str],
) -> None:
    """What a run of the command would do: runs and epochs left per phase, the runs
    ``diverged`` records as diverged in the same configuration (not run again), and the
    run folders that cannot be read back (run again from epoch 1, or left)."""
    for title, specs in specs_by_phase:
        states = [folder_state(spec.config) for spec in specs]
        finished = sum(state.kind == "finished" for state in states)
        ended = sum(spec.name in diverged for spec in specs)
        corrupt = [(spec, state) for spec, state in zip(specs, states) if state.kind == "corrupt"]
        left = len(specs) - finished - ended - (len(corrupt) if keep_corrupt else 0)
        epochs_left = sum(
            spec.config.epochs - state.epochs_kept
            for spec, state in zip(specs, states)
            if state.kind != "finished"
            and spec.name not in diverged
            and not (keep_corrupt and state.kind == "corrupt")
        )
        what = "left as they are" if keep_corrupt else "to run again from epoch 1"
        console.print(
            f"{title}: {len(specs)} runs, {finished} finished, "
            + (f"{ended} diverged (not run again), " if ended else "")
            + f"{left} to run, {epochs_left} epochs left"
            + (f", {len(corrupt)} corrupt ({what})" if corrupt else "")
        )
        for spec, state in corrupt:
            # one line each, as written: a reason may hold brackets rich would take as markup
            console.print(
                f"  corrupt: {spec.name}: {state.reason}",
                soft_wrap=True,
                markup=False,
                highlight=False,
            )


def print_pairs(console: Console, cells: Sequence[Cell]) -> None:
    """Every method and its matched comparator, with their planned local work per round."""
    for budget in pair_budgets(cells):
        ours, theirs = budget.method_sample_gradients, budget.comparator_sample_gradients
        shown = "–" if ours is None else f"{ours:,.0f}"
        if budget.equal:
            check = f"{shown} sample-gradients per round each"
        else:
            other = "–" if theirs is None else f"{theirs:,.0f}"
            check = f"UNEQUAL: {shown} against {other} sample-gradients per round"
        console.print(
            f"{budget.row} · {budget.method} vs {budget.comparator}: {check}", soft_wrap=True
        )


def print_estimate(
    console: Console,
    cells: list[Cell],
    planned: RunPlan,
    tuning: Tuning | None,
    out: Path,
    vectorize: int | None,
    workers: int,
    upper_bound: bool = False,
) -> None:
    """The estimated hours here of what ``planned`` leaves to run, from per-epoch costs
    measured here (calibrated now on ``cells``, the grid's plan, where ``out`` holds none
    that fit; nothing is calibrated when nothing is left); ``upper_bound``: a run may stop
    before its epochs (a plateau budget)."""
    sizes = group_sizes(cells, vectorize)
    work = cell_work(planned.cells, sizes, planned.diverged)
    widening: list = []
    if tuning is not None and planned.tuning_open:
        tune_work, widening = tuning_work(cells, tuning, out, sizes, planned.diverged)
        work = tune_work + work
    if not work and not widening:
        console.print("nothing left to run")
        return
    specs = calibration_specs(cells, sizes, out)
    path = out / CALIBRATION_FILE

    def calibrate(kind: str) -> tuple[float, ...]:
        runs = len(specs[kind])
        console.print(
            f"calibrating {kind}: {runs} run(s) of {CALIBRATION_EPOCHS} epochs"
            + (" stepped together" if runs > 1 else "")
            + f" (stored in {path})"
        )
        return measure(specs[kind], vectorize)

    costs, _, unmeasured = load_costs(out, sizes, calibrate)
    for kind, why in unmeasured.items():
        # one line, as written: a run's message may hold brackets rich would take as markup
        console.print(
            f"note: {kind} left out of the estimate: its calibration did not finish ({why}); "
            "its runs at these settings may end as early",
            soft_wrap=True,
            markup=False,
            highlight=False,
        )
    work = [item for item in work if item.kind in costs]
    widening = [item for item in widening if item.kind in costs]
    if not work and not widening:
        console.print("no estimate: no kind left to run could be calibrated")
        return
    for kind, cost in costs.items():
        console.print(
            f"cost of {kind} here: "
            + ", ".join(f"{value:.2f}" for value in cost.epochs)
            + f" s per run for epochs 1..{len(cost.epochs)}, then {cost.epochs[-1]:.2f} s"
            + (f" (in groups of {sizes[kind]})" if sizes[kind] > 1 else "")
        )
    console.print(summary(work, widening, costs, workers, upper_bound))


# "\b": click keeps the grid list's lines as they are
@click.command("reproduce", epilog="Grids:\n\n\b\n" + GRID_LIST)
@click.argument("grid", metavar="GRID")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="The grid's folder.")
@click.option("--dataset", help="Another dataset than the grid's (e.g. digits for a quick look).")
@DATA_DIR
@DATASET_OPTION
@click.option("--epochs", metavar="INTEGER", help="Epochs of every run [default: the grid's].")
@click.option(
    "--seeds", default="0,1,2", show_default=True, metavar="LIST", help="One run per seed and cell."
)
@click.option(
    "--seeds-until-verdict",
    metavar="MAX",
    help="Two-stage design: after --seeds, each pair inconclusive for want of seeds gets the "
    "seeds its first-stage spread calls for (at most MAX in all), once; its interval is then "
    "Stein's [default: --seeds only].",
)
@click.option(
    "--clients", metavar="INTEGER", help="Clients of every run [default: the grid's, else 10]."
)
@click.option(
    "--methods", metavar="LIST", help="Only these methods' columns, e.g. fedavg,stratify."
)
@click.option("--model", help="Another model (a ResNet takes BN in batch mode, GN otherwise).")
@click.option("--device", default="auto", show_default=True, type=click.Choice(DEVICES))
@click.option(
    "--secure/--no-secure",
    default=False,
    show_default=True,
    help="CKKS registry (the same numbers as the plain one, slower).",
)
@click.option(
    "--plateau",
    metavar="R_MIN",
    help="Paired grids: each comparator runs until its validation accuracy plateaus (at "
    "least R_MIN rounds; --epochs is the cap; 10% of the training samples held out) and "
    "its methods run the rounds it ran, seed by seed [default: every run the grid's epochs].",
)
@click.option(
    "--tune",
    is_flag=True,
    help="Tune each method's lr on a validation split first (a paired grid: each "
    "comparator's, which its methods then use).",
)
@click.option(
    "--tune-factors",
    default=",".join(f"{factor:g}" for factor in DEFAULT_FACTORS),
    show_default=True,
    metavar="LIST",
    help="Candidate lrs as multiples of each method's default.",
)
@click.option(
    "--tune-epochs", metavar="INTEGER", help="Epochs of a tuning run [default: --epochs]."
)
@click.option(
    "--tune-halving",
    is_flag=True,
    help="Race the candidate lrs by successive halving: all a few epochs, the better half "
    "on, the last two compared after --tune-epochs (fewer tuning epochs, same choice rule).",
)
@click.option(
    "--tune-widen",
    default=str(DEFAULT_WIDEN),
    show_default=True,
    metavar="INTEGER",
    help="Lrs tried beyond a chosen lr at the edge of the candidates, at most, on each side "
    "(by the candidates' outermost ratio; 0: the candidates only).",
)
@click.option(
    "--validation",
    default=str(DEFAULT_VALIDATION),
    show_default=True,
    metavar="NUMBER",
    help="Share of the training samples held out (per label) to score the candidate lrs.",
)
@click.option(
    "--backend",
    default="local",
    show_default=True,
    type=click.Choice(["local", "ray"]),
    help="Worker processes here, or Ray tasks (pip install -e '.[ray]').",
)
@click.option("--workers", metavar="INTEGER", help="Local worker processes [default: cores].")
@click.option("--address", help="Ray cluster to join (e.g. auto) [default: a local Ray].")
@VECTORIZE_OPTION
@click.option(
    "--dry-run",
    is_flag=True,
    help="Check every value, count the runs and epochs left and estimate the hours; run no "
    "cell (the first estimate calibrates on a few short runs, kept in DIR/calibration.json).",
)
@click.option(
    "--report-only",
    is_flag=True,
    help="Run nothing: write the tables and plots from what the run folders hold (a grid "
    "stopped part way, or run on another machine with the same options).",
)
@click.option(
    "--keep-corrupt",
    is_flag=True,
    help="Leave a run folder whose files cannot be read back (reported corrupt) instead of "
    "running it again from its first epoch.",
)
def reproduce_command(
    grid: str,
    out: str,
    dataset: str | None,
    data_dir: str | None,
    dataset_options: tuple[str, ...],
    epochs: str | None,
    seeds: str,
    seeds_until_verdict: str | None,
    clients: str | None,
    methods: str | None,
    model: str | None,
    device: str,
    secure: bool,
    plateau: str | None,
    report_only: bool,
    tune: bool,
    tune_factors: str,
    tune_epochs: str | None,
    tune_halving: bool,
    tune_widen: str,
    validation: str,
    backend: str,
    workers: str | None,
    address: str | None,
    vectorize: str | None,
    dry_run: bool,
    keep_corrupt: bool,
) -> None:
    """Run GRID (a comparison of the papers) into --out: one run folder per cell, finished
    cells skipped, then results.csv, results.md (the paper's table format) and plots."""
    chosen_grid = grid_named(grid)
    grid_folder(out)
    settings = Settings(
        dataset=dataset,
        data_dir=data_dir,
        dataset_options=parse_options(dataset_options),
        epochs=None if epochs is None else check_positive_int(epochs, "--epochs"),
        seeds=check_seeds(seeds),
        clients=None if clients is None else check_positive_int(clients, "--clients"),
        methods=None if methods is None else parse_list(methods, "--methods"),
        model=model,
        secure=secure,
        device=device,
        plateau=None if plateau is None else check_positive_int(plateau, "--plateau"),
    )
    tuning = None
    if tune:
        tuning = Tuning(
            factors=tuple(check_positive(f, "--tune-factors") for f in tune_factors.split(",")),
            validation=check_positive(validation, "--validation"),
            epochs=None
            if tune_epochs is None
            else check_positive_int(tune_epochs, "--tune-epochs"),
            halving=tune_halving,
            widen=check_int(tune_widen, "--tune-widen", minimum=0),
        )
    elif tune_epochs is not None or tune_halving:
        flag = "--tune-epochs" if tune_epochs is not None else "--tune-halving"
        raise ConfigError(f"{flag} applies with --tune")
    count = None if workers is None else check_positive_int(workers, "--workers")
    group = None if vectorize is None else check_positive_int(vectorize, "--vectorize")
    runner = make_backend(backend, count, address)
    console = table_console(stderr=True)
    cap = None
    if seeds_until_verdict is not None:
        cap = check_positive_int(seeds_until_verdict, "--seeds-until-verdict")
        if cap <= len(settings.seeds):
            raise ConfigError(
                f"--seeds-until-verdict {cap}: more seeds in all than the {len(settings.seeds)} "
                "of --seeds"
            )
        if not (chosen_grid.paired or chosen_grid.reference):
            raise ConfigError(
                f"--seeds-until-verdict: grid {grid} has no pairs (a paired grid, or one "
                "compared against a reference column: table1)"
            )
    if isinstance(runner, RayBackend) and not dry_run:
        runner.check()  # a dead address: one line now, before anything is written
    if dry_run:
        cells, notes = plan_cells(chosen_grid, settings, out, own_rates=tuning is not None)
        planned = plan_runs(chosen_grid, cells, settings, tuning, out, group)
        check_setups([spec for _, specs in planned.phases for spec in specs])
        for note in notes:
            console.print(f"note: {note}")
        if chosen_grid.paired:
            print_pairs(console, planned.cells)
        if tuning is not None and not planned.tuning_open:
            console.print("tuning: finished, every rate chosen (the cells below run at them)")
        print_plan(console, planned.phases, keep_corrupt, planned.diverged)
        print_estimate(
            console,
            cells,
            planned,
            tuning,
            Path(out),
            group,
            count or available_cores(),
            upper_bound=settings.plateau is not None,
        )
        if cap is not None:
            console.print(
                f"--seeds-until-verdict {cap}: the second stage may add seeds, up to {cap} "
                "in all, to each pair still inconclusive for want of seeds (not counted above: "
                "how many depends on the first stage's spread)"
            )
        return

    def run(settings: Settings, write: bool = True) -> Report:
        return reproduce(
            grid,
            out,
            settings,
            tuning=tuning,
            backend=runner,
            display=board_display(console),
            keep_corrupt=keep_corrupt,
            vectorize=group,
            report_only=report_only,
            write=write,
        )

    try:
        # with the two-stage design the second stage writes the tables (of both stages)
        report = run(settings, write=cap is None)
        if cap is not None:
            runs = csv_runs(report.grid, report.results, tuning is not None)
            plan = extension(runs, cap, chosen_grid.reference)
            console.print(
                f"two-stage design: {len(plan)} group(s) get more seeds"
                + "".join(f"\n  {group}: {total} in all" for group, total in sorted(plan.items()))
            )
            report = run(dataclasses.replace(settings, extended=plan))
    except RunsInterrupted as stop:
        # one line (rich would wrap it at 80 columns on a pipe), and the shell's exit code
        # of a process ended by that signal
        click.echo(
            f"stopped by {stop.signal}: every run keeps its last finished epoch; run the same "
            "command again to continue (finished runs are skipped)",
            err=True,
        )
        sys.exit(128 + signal.Signals[stop.signal].value)
    click.echo(report.markdown)
    for note in report.notes + report.run_notes:
        console.print(f"note: {note}")
    console.print("written: " + ", ".join(str(path) for path in report.files))
    if report.plots_note:
        console.print(f"no plots: {report.plots_note}")
    if report.failed and report_only:
        console.print(f"note: {len(report.failed)} of {len(report.results)} runs unfinished")
    elif report.failed:
        first = report.failed[0]
        advice = (
            "run the same command again without --keep-corrupt to run the corrupt ones again"
            if keep_corrupt and any(result.status == "corrupt" for result in report.failed)
            else "run the same command again to retry them"
        )
        raise StratifyError(
            f"{len(report.failed)} of {len(report.results)} runs did not finish "
            f"({first.cell.key}: {first.status}: {first.message or 'no epoch'}); {advice}"
        )
