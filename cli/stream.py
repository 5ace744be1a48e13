"""`stratify stream`: learn online from JSON Lines events read from a file or a pipe.

Its flags are generated from :class:`~stratify.stream.config.StreamConfig`, as ``train``'s
are from :class:`~stratify.config.TrainConfig`. A skipped event is one warning line on
stderr with its line number; the stream goes on. SIGINT and SIGTERM stop it after the
current event with a checkpoint (exit 130 and 143, one line saying how to resume); a
diverging model stops it with one line and exit code 1, the last checkpoint kept.
"""

from __future__ import annotations

import secrets
import shlex
import signal
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from stratify.cli.console import table_console
from stratify.cli.flags import config_option
from stratify.stream.config import StreamConfig
from stratify.stream.learner import DivergenceError
from stratify.stream.run import SOURCE_POSITIONS, STOP_GRACE_SECONDS, StreamRun

#: exit code of a diverged stream (the run's failure, not the user's input)
DIVERGED = 1
#: seconds between two progress lines when stderr is not a terminal
PLAIN_PROGRESS_SECONDS = 10.0


def default_out() -> str:
    """``runs/<time to the microsecond>-<random>-stream``: unique per process."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    return str(Path("runs") / f"{stamp}-{secrets.token_hex(2)}-stream")


def with_stream_flags(function: Any) -> Any:
    for entry in reversed(StreamConfig.flag_fields()):
        function = config_option(entry)(function)
    return function


@click.command("stream")
@with_stream_flags
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    help="Run folder [default: runs/<time>-stream].",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Continue the stream in --out from its checkpoint.",
)
@click.option(
    "--source-position",
    type=click.Choice(SOURCE_POSITIONS),
    default="detect",
    show_default=True,
    help="With --resume: the source replays the stream from its first line (its consumed "
    "lines are skipped), or continues it after the last consumed line; detect tells "
    "from the source's first lines.",
)
@click.option(
    "--overwrite", is_flag=True, help="Replace a run already in --out (and --predictions)."
)
def stream(
    out: str | None, resume: bool, source_position: str, overwrite: bool, **values: Any
) -> None:
    """Learn online from events: one JSON object per line, {"client": ..., "label": ...,
    "x": [...]} ("x" may be an object of named features, or give "path": a .npy file with
    an optional "row"), from --source FILE or --source - (standard input). An event
    without "label" is predicted (--predictions); {"id": ..., "label": ...} labels an
    earlier one."""
    config = StreamConfig(**values, out=out)
    if config.out is None:
        config.out = default_out()
    errors = Console(stderr=True)
    display = StreamProgress(errors)
    with errors.status("reading the test set, building the learner…"):
        run = StreamRun(
            config,
            resume=resume,
            overwrite=overwrite,
            source_position=source_position,
            on_reject=display.reject,
            on_progress=display.progress_update,
            on_message=display.message,
            handle_signals=True,
        )
    if run.lines:
        errors.print(
            f"resuming after line {run.lines} of the stream ({run.learner.stats.events} events)",
            markup=False,
            highlight=False,
        )
    try:
        with display.live():
            summary = run.run()
    except DivergenceError as error:
        folder = Path(config.out)
        if (folder / "checkpoint.pt").exists():
            kept = f"the last checkpoint is kept in {run.folder_path('checkpoint.pt')}"
        elif (folder / "metrics.jsonl").exists():
            kept = f"its metrics so far are in {run.folder_path('')} (no checkpoint yet)"
        else:
            kept = "it stopped before its first metrics line, so nothing was kept"
        click.echo(f"error: {error}; {kept}", err=True)
        sys.exit(DIVERGED)
    if run.abandoned:
        assert run.stopped_by is not None  # only a stop signal abandons an event
        number = signal.Signals[run.stopped_by].value
        kept = (
            f"the checkpoint after line {run.checkpointed_lines} is kept; resume with: "
            f"{resume_command(config)}"
            if run.checkpointed_lines
            else "no checkpoint had been written yet, so start it again"
        )
        click.echo(
            f"stopped by {run.stopped_by}: the event being learned was still running "
            f"{STOP_GRACE_SECONDS:g} s later and was abandoned; {kept}",
            err=True,
        )
        sys.exit(128 + number)
    if run.stopped_by is not None:
        number = signal.Signals[run.stopped_by].value
        click.echo(
            f"stopped by {run.stopped_by} after line {run.lines} of the stream "
            f"({summary['events']} events); checkpoint written; resume with: "
            f"{resume_command(config)}",
            err=True,
        )
        sys.exit(128 + number)
    print_results(table_console(), run, summary)


def resume_command(config: StreamConfig) -> str:
    """The command that continues ``config``'s stream (a replaying source is detected)."""
    parts = ["stratify", "stream", "--source", config.source or "-", "--out", config.out or ""]
    return shlex.join([*parts, "--resume"])


class StreamProgress:
    """Live line: events, events/s, buffer fill, window accuracy, classes and clients; a
    plain line every 10 seconds when stderr is not a terminal.

    Its events/s is the current pace (between two updates, evaluations included); the
    metrics and the summary give the rate of ingestion alone.
    """

    def __init__(self, console: Console) -> None:
        self.console = console
        self.terminal = console.is_terminal
        self.last: tuple[float, int] | None = None
        self.last_plain = time.monotonic()
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]stream"),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=console,
            disable=not self.terminal,
        )
        self.task = self.progress.add_task("stream", total=None, status="waiting for events")

    def live(self) -> Progress:
        return self.progress

    def progress_update(self, status: dict[str, Any]) -> None:
        now, events = time.perf_counter(), status["events"]
        pace = None
        if self.last is not None and now > self.last[0]:
            pace = (events - self.last[1]) / (now - self.last[0])
        if self.terminal:
            self.last = (now, events)
            text = status_text({**status, "events_per_second": pace})
            self.progress.update(self.task, status=text)
            return
        if self.last is None:
            self.last = (now, events)
        elif time.monotonic() - self.last_plain >= PLAIN_PROGRESS_SECONDS:
            self.last = (now, events)
            self.last_plain = time.monotonic()
            self.echo(f"stream: {status_text({**status, 'events_per_second': pace})}")

    def echo(self, text: str) -> None:
        if self.terminal:
            self.progress.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            click.echo(text, err=True)

    def reject(self, line: int, reason: str) -> None:
        self.echo(f"warning: line {line}: {reason}; event skipped")

    def message(self, text: str) -> None:
        self.echo(text)


def percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def status_text(status: dict[str, Any]) -> str:
    speed = status.get("events_per_second")
    return (
        f"{status['events']} events · {'–' if speed is None else f'{speed:,.0f}'}/s · "
        f"buffers {percent(status['buffer_fill'])} full · "
        f"window acc {percent(status['window_accuracy'])} · "
        f"{status['classes']} classes · {status['clients']} clients · "
        f"{status.get('rejected', 0)} skipped"
    )


def print_results(console: Console, run: StreamRun, summary: dict[str, Any]) -> None:
    table = Table(title="stream")
    columns = (
        "events",
        "window acc",
        "prequential acc",
        "majority acc",
        "macro-F1",
        "test acc",
        "classes",
        "buffered",
    )
    for column in columns:
        table.add_column(column, justify="right")
    for record in run.records:
        table.add_row(
            str(record["events"]),
            percent(record["window_accuracy"]),
            percent(record["prequential_accuracy"]),
            percent(record["majority_accuracy"]),
            "–" if record["macro_f1"] is None else f"{record['macro_f1']:.3f}",
            percent(record["test_accuracy"]),
            str(record["classes"]),
            str(record["buffered"]),
        )
    console.print(table)
    speed = summary["events_per_second"]
    undone = summary["undone_updates"]
    console.print(
        f"{summary['events']} events from {summary['lines']} lines ({summary['rejected']} "
        f"skipped{f', {undone} diverging updates undone' if undone else ''}), "
        f"{'–' if speed is None else f'{speed:,.0f}'} events/s, prequential "
        f"accuracy {percent(summary['prequential_accuracy'])} (majority class "
        f"{percent(summary['majority_accuracy'])}), final test accuracy "
        f"{percent(summary['final_test_accuracy'])} · run folder: {run.folder_path('')}"
    )
