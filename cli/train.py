"""`stratify train`: one federated training run of any method.

Its flags are generated from :class:`~stratify.config.TrainConfig` and from every
method's options dataclass, so each default and help text is written once, in the
library. ``--help`` lists the common options and names the methods' own; ``--method NAME
--help`` lists NAME's options with their help and defaults. Values reach the library as
typed on the command line and are checked there, so a bad value reads the same from the
CLI and from Python.
"""

from __future__ import annotations

import dataclasses
import secrets
import signal
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from stratify.algorithms import ALGORITHMS, strategy_class
from stratify.cli.board import RunBoard
from stratify.cli.common import DATASET_OPTION, VECTORIZE_OPTION, parse_options
from stratify.cli.console import table_console
from stratify.cli.flags import FLAG_NAMES, config_option, metavar
from stratify.cli.methods import option_rows
from stratify.config import TrainConfig, dp_settings
from stratify.errors import ConfigError, CorruptRunError, StratifyError
from stratify.files import guard_input, release_input
from stratify.measures import accuracy_summary
from stratify.options import flag
from stratify.parallel import (
    COMPLETE,
    LocalBackend,
    RunOutcome,
    RunsInterrupted,
    RunSpec,
    check_specs,
    run_specs,
)
from stratify.reproduce.results import mean_std
from stratify.run import EpochRecord, Run, read_secrets
from stratify.runfiles import read_records
from stratify.validation import check_positive_int, check_seeds


def method_options() -> dict[str, list[tuple[str, dataclasses.Field]]]:
    """Option name -> ``(method, field)`` of every method that takes it."""
    found: dict[str, list[tuple[str, dataclasses.Field]]] = {}
    for method in ALGORITHMS:
        cls = strategy_class(method)
        for entry in cls.options_class.option_fields():
            if set(entry.metadata["modes"]) & set(cls.card.identity.modes):  # else it never applies
                found.setdefault(entry.name, []).append((method, entry))
    return found


def method_option(name: str, takers: list[tuple[str, dataclasses.Field]]) -> Callable:
    """A method option's click flag, with its first method's help; ``--help`` shows it only
    under ``--method NAME --help``, with NAME's own help and default
    (:class:`TrainCommand`)."""
    first = takers[0][1]
    return click.option(
        flag(name), default=None, metavar=metavar(first), help=first.metadata["help"]
    )


def with_flags(function: Callable) -> Callable:
    options = [config_option(entry) for entry in TrainConfig.flag_fields()]
    options += [method_option(name, takers) for name, takers in method_options().items()]
    for decorator in reversed(options):
        function = decorator(function)
    return function


def named_method(args: list[str]) -> str | None:
    """The method named on a command line (``--method X``, ``--method=X`` or the alias
    ``--algorithm``), before click parses it: ``--help`` runs as soon as it is parsed."""
    flags = FLAG_NAMES["algorithm"]
    for position, argument in enumerate(args):
        name, equals, value = argument.partition("=")
        if name in flags:
            if equals:
                return value
            if position + 1 < len(args):
                return args[position + 1]
    return None


class TrainCommand(click.Command):
    """``train``, whose help lists the common options and, for the methods' own, only
    those of the method named on the command line (or where to find them)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["stratify.method"] = named_method(args)
        return super().parse_args(ctx, args)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        own = set(method_options())
        records = [
            record
            for parameter in self.get_params(ctx)
            if parameter.name not in own and (record := parameter.get_help_record(ctx))
        ]
        with formatter.section("Options"):
            formatter.write_dl(records)
        name = ctx.meta.get("stratify.method")
        if name in ALGORITHMS:
            with formatter.section(f"Options of --method {name}"):
                formatter.write_dl(
                    [
                        (option, f"{text} [default: {default}]")
                        for option, default, text in option_rows(name)
                    ]
                )
            return
        with formatter.section("Method options"):
            formatter.write_text(
                "Each method takes its own options (--chunk, --mu, --local-epochs, …): "
                "stratify train --method NAME --help lists NAME's, as does stratify methods "
                f"NAME. Methods: {', '.join(ALGORITHMS)}."
            )


def default_out(config: TrainConfig) -> str:
    """``runs/<time to the microsecond>-<random>-<method>-<dataset>-<mode>``: unique even
    for runs started in the same second (a seed sweep)."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    suffix = secrets.token_hex(2)
    name = f"{stamp}-{suffix}-{config.algorithm}-{config.dataset}-{config.mode}"
    return str(Path("runs") / name)


@click.command("train", cls=TrainCommand)
@with_flags
@DATASET_OPTION
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    help="Run folder [default: runs/<time>-<method>-<dataset>-<mode>].",
)
@click.option("--resume", is_flag=True, help="Continue the run in --out from its checkpoint.")
@click.option("--overwrite", is_flag=True, help="Replace a run already in --out.")
@click.option(
    "--seeds",
    metavar="LIST",
    help="One run per seed (e.g. 0,1,2,3 or 0..15), each in --out/seed-N, on --workers processes; "
    "the same numbers as running the seeds one by one. With --resume, finished seeds are "
    "skipped and the others continue.",
)
@click.option(
    "--workers",
    metavar="INTEGER",
    help="Single-thread worker processes for --seeds [default: the number of cores].",
)
@click.option(
    "--client-secrets",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A secure run's client_secrets.json: register with the secrets that run drew, "
    "so this run repeats its placeholders and numbers exactly (a secure run draws fresh "
    "secrets otherwise).",
)
@VECTORIZE_OPTION
def train(
    dataset_options: tuple[str, ...],
    out: str | None,
    resume: bool,
    overwrite: bool,
    seeds: str | None,
    workers: str | None,
    vectorize: str | None,
    client_secrets: Path | None,
    **values: Any,
) -> None:
    """Train the global model federatedly and write config, metrics, summary and checkpoint."""
    if seeds is not None:
        source = click.get_current_context().get_parameter_source("seed")
        if source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
            raise ConfigError("give --seed for one run or --seeds for several, not both")
    elif workers is not None:
        raise ConfigError("--workers applies to --seeds (several runs at once)")
    elif vectorize is not None:
        raise ConfigError("--vectorize applies to --seeds (several runs at once)")
    if client_secrets is not None and (resume or seeds is not None):
        raise ConfigError(
            "--client-secrets starts one new run; --resume reads the run's own secrets"
            if resume
            else "--client-secrets applies to one run, not to --seeds"
        )
    config_keys = {entry.name for entry in TrainConfig.flag_fields()}
    config = TrainConfig(
        **{key: value for key, value in values.items() if key in config_keys},
        options={key: value for key, value in values.items() if key not in config_keys},
        dataset_options=parse_options(dataset_options),
        out=out,
    )
    if config.out is None:
        config.out = default_out(config)
    if vectorize is not None and dp_settings(config) is not None:
        raise ConfigError(
            "--vectorize steps runs together in a compiled step, which does not clip: with "
            "DP give --seeds without it"
        )
    if seeds is not None:
        count = None if workers is None else check_positive_int(workers, "--workers")
        group = None if vectorize is None else check_positive_int(vectorize, "--vectorize")
        train_seeds(config, check_seeds(seeds), count, resume, overwrite, group)
        return
    if client_secrets is not None:
        # a named input: the run folder refuses to hold it or, with --overwrite, to
        # delete it (RunFolder.open), before anything is deleted
        guard_input(client_secrets, "the --client-secrets file of this run")
    try:
        console = Console(stderr=True)
        title = f"{config.algorithm} on {config.dataset}"
        display = TrainingProgress(console, title, config.epochs)
        with console.status(f"loading {config.dataset}, partitioning, registering labels…"):
            run = Run(
                config,
                resume=resume,
                overwrite=overwrite,
                secrets=None
                if client_secrets is None
                else read_secrets(client_secrets, "--client-secrets"),
                on_epoch=display.epoch_done,
                on_steps=display.samples_done,
            )
        with display.live(run.start_epoch):
            summary = run.train()
        print_results(table_console(), run, summary)
    finally:
        if client_secrets is not None:
            release_input(client_secrets)


class TrainingProgress:
    """Rich progress: an epoch bar with the live accuracy, and a running sample count."""

    def __init__(self, console: Console, title: str, epochs: int) -> None:
        self.title = title
        self.epochs = epochs
        self.samples = 0
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[count]}"),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=console,
        )

    def live(self, start_epoch: int) -> Progress:
        self.epoch_task = self.progress.add_task(
            self.title,
            total=self.epochs,
            completed=start_epoch,
            count=f"{start_epoch}/{self.epochs} epochs",
            status="",
        )
        self.sample_task = self.progress.add_task("samples", total=None, count="0", status="")
        return self.progress

    def epoch_done(self, record: EpochRecord) -> None:
        self.progress.update(
            self.epoch_task,
            completed=record.epoch,
            count=f"{record.epoch}/{self.epochs} epochs",
            status=f"acc {record.test_accuracy:.4f} · train loss {record.train_loss:.4f}"
            + (
                ""
                if record.validation_accuracy is None
                else f" · validation {record.validation_accuracy:.4f}"
            ),
        )

    def samples_done(self, count: int) -> None:
        self.samples += count
        self.progress.update(self.sample_task, advance=count, count=f"{self.samples} trained")


def accuracy_cell(value: float | None) -> str:
    """A table cell for an accuracy that an older record may lack."""
    return "–" if value is None else f"{value:.4f}"


def print_results(console: Console, run: Run, summary: dict) -> None:
    table = Table(title=f"{summary['algorithm']} · {summary['dataset']} · {summary['partition']}")
    # datasets with attributes (colored-mnist, …) also show the worst (label, attribute) group
    groups = summary["final_worst_group_accuracy"] is not None
    for column in (
        "epoch",
        "test acc",
        *(("worst group",) if groups else ()),
        "test loss",
        "train loss",
        "steps",
        "transfers",
        "skipped",
        "reused",
        "seconds",
    ):
        table.add_column(column, justify="right")
    for record in run.records:
        table.add_row(
            str(record.epoch),
            f"{record.test_accuracy:.4f}",
            *((accuracy_cell(record.worst_group_accuracy),) if groups else ()),
            f"{record.test_loss:.4f}",
            f"{record.train_loss:.4f}",
            str(record.steps),
            str(record.transfers),
            str(record.skipped),
            str(record.reused),
            f"{record.wall_seconds:.1f}",
        )
    console.print(table)
    worst = (
        f"worst-group accuracy best {summary['best_worst_group_accuracy']:.4f}, "
        f"final {summary['final_worst_group_accuracy']:.4f}, "
        if groups
        else ""
    )
    chosen = (
        f"epoch {summary['best_val_epoch']} chosen on validation: test "
        f"{summary['test_accuracy_at_best_val']:.4f}, "
        if summary["best_val_epoch"] is not None
        else ""
    )
    if summary["stopped_on_plateau"] is not None:
        console.print(
            f"stopped after epoch {summary['stopped_on_plateau']} of {run.config.epochs}: the "
            f"validation accuracy plateaued (--stop-on-plateau {run.config.stop_on_plateau})"
        )
    console.print(
        f"final accuracy {summary['final_accuracy']:.4f}, mean of the last "
        f"{summary['last_rounds']} epochs {summary['last_mean_accuracy']:.4f} ± "
        f"{summary['last_std_accuracy']:.4f}, {chosen}best accuracy {summary['best_accuracy']:.4f} "
        f"at epoch {summary['best_epoch']} (chosen on test), {worst}"
        f"{summary['total_transfers']} transfers, {summary['total_wall_seconds']:.1f} s · "
        f"run folder: {run.out}"
    )
    privacy = summary.get("privacy")
    if privacy is not None:
        console.print(
            f"differential privacy: (ε = {privacy['epsilon']:.3f}, δ = {privacy['delta']:g}) "
            f"spent (Opacus RDP accountant; σ = {privacy['noise_multiplier']:.4f}, clip "
            f"{privacy['clip']:g}, {privacy['uses']} noised uses of a sample, no subsampling)"
        )


def seed_specs(config: TrainConfig, seeds: tuple[int, ...], policy: str) -> list[RunSpec]:
    """One run per seed, in ``config.out/seed-N``."""
    return [
        RunSpec(
            f"seed-{seed}",
            dataclasses.replace(config, seed=seed, out=str(Path(str(config.out)) / f"seed-{seed}")),
            policy,
        )
        for seed in seeds
    ]


def train_seeds(
    config: TrainConfig,
    seeds: tuple[int, ...],
    workers: int | None,
    resume: bool,
    overwrite: bool,
    vectorize: int | None = None,
) -> None:
    """The runs of ``seeds`` on ``workers`` processes, with a live board and a summary;
    with ``vectorize``, in groups of that many stepped together."""
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite contradict each other; give one")
    policy = "continue" if resume else "overwrite" if overwrite else "new"
    specs = seed_specs(config, seeds, policy)
    check_specs(specs)  # before the display: a refused folder is one line
    console = table_console(stderr=True)
    title = f"{config.algorithm} on {config.dataset} · {len(seeds)} seeds"
    board = RunBoard(console, title, [(spec.name, config.epochs) for spec in specs])
    notes: list[str] = []
    try:
        with board.live():
            outcomes = run_specs(specs, LocalBackend(workers), board, vectorize, notes.append)
    except RunsInterrupted as stop:
        stopped = [outcome.name for outcome in stop.outcomes if outcome.status == "interrupted"]
        # one line (rich would wrap it at 80 columns on a pipe), and the shell's exit code
        # of a process ended by that signal
        click.echo(
            f"stopped by {stop.signal}: {', '.join(stopped) or 'nothing'}; each keeps its "
            f"last finished epoch: continue with the same command and --resume "
            f"(--out {config.out})",
            err=True,
        )
        sys.exit(128 + signal.Signals[stop.signal].value)
    for note in notes:
        console.print(f"note: {note}")
    print_seed_results(table_console(), specs, outcomes)
    unfinished = [outcome for outcome in outcomes if outcome.status not in COMPLETE]
    if unfinished:
        raise StratifyError(
            f"{len(unfinished)} of {len(outcomes)} runs did not finish: "
            + "; ".join(
                f"{outcome.name} {outcome.status}: {outcome.message}" for outcome in unfinished
            )
        )


def print_seed_results(console: Console, specs: list[RunSpec], outcomes: list[RunOutcome]) -> None:
    """One line per seed from its run folder, and the mean ± std of the best accuracies."""
    first = specs[0].config
    table = Table(title=f"{first.algorithm} · {first.dataset} · {first.partition}")
    columns = ("seed", "status", "last-rounds acc", "final acc", "best acc", "epoch")
    for column in (*columns, "transfers", "seconds"):
        table.add_column(column, justify="right")
    bests, lasts = [], []
    for spec, outcome in zip(specs, outcomes):
        try:
            records = read_records(str(spec.config.out))[: spec.config.epochs]
        except CorruptRunError:
            records = []  # its outcome says what happened
        if not records:
            table.add_row(str(spec.config.seed), outcome.status, *[""] * len(columns))
            continue
        best = max(records, key=lambda record: record["test_accuracy"])
        bests.append(best["test_accuracy"])
        last = accuracy_summary(records)["last_mean_accuracy"]
        lasts.append(last)
        table.add_row(
            str(spec.config.seed),
            outcome.status,
            f"{last:.4f}",
            f"{records[-1]['test_accuracy']:.4f}",
            f"{best['test_accuracy']:.4f}",
            str(best["epoch"]),
            str(sum(record["transfers"] for record in records)),
            f"{sum(record['wall_seconds'] for record in records):.1f}",
        )
    console.print(table)
    if bests:
        mean, std = mean_std(lasts)
        best_mean, best_std = mean_std(bests)
        console.print(
            f"last-rounds accuracy {mean:.4f} ± {std:.4f}, best accuracy {best_mean:.4f} ± "
            f"{best_std:.4f} (chosen on test; mean ± std over {len(bests)} seeds) · "
            f"run folders: {Path(str(first.out)).parent}"
        )
