"""A live display of many runs: how many are done, running and left, and a line per run."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from stratify.parallel import RunEvent, RunOutcome

STATUS_STYLES = {
    "waiting": "dim",
    "running": "bold cyan",
    "finished": "green",
    "skipped": "dim green",
    "diverged": "yellow",
    "failed": "bold red",
    "corrupt": "bold magenta",
    "interrupted": "yellow",
}


@dataclass
class RunLine:
    """What the board knows of one run."""

    name: str
    epochs: int
    status: str = "waiting"
    epoch: int = 0
    accuracy: float | None = None
    best: float | None = None
    samples: int = 0
    started: float | None = None
    ended: float | None = None
    message: str = ""


class RunBoard:
    """Counts of runs done / running / left and one line per run, updated by events.

    Call it with every :class:`~stratify.parallel.RunEvent` and
    :class:`~stratify.parallel.RunOutcome` (it is an ``on_event`` handler) inside
    :meth:`live`. With many runs it lists the running ones and the latest to end.

    Parameters
    ----------
    console : rich.console.Console
        Where the display goes.
    title : str
        First words of the header, e.g. the grid's name.
    runs : sequence of (str, int)
        Every run's name and the epochs it is to reach.
    rows : int
        At most this many run lines.
    """

    def __init__(
        self, console: Console, title: str, runs: Sequence[tuple[str, int]], rows: int = 14
    ) -> None:
        self.console = console
        self.title = title
        self.lines = {name: RunLine(name, epochs) for name, epochs in runs}
        self.rows = rows
        self.began = time.monotonic()

    def __call__(self, item: RunEvent | RunOutcome) -> None:
        line = self.lines.get(item.name)
        if line is None:
            return
        now = time.monotonic()
        if isinstance(item, RunOutcome):
            line.status = item.status
            line.ended = now
            line.message = item.message
            if item.corrupt and item.status != "corrupt":
                line.message = f"was corrupt ({item.corrupt}); run again. {item.message}"
            line.epoch = max(line.epoch, item.epochs_done)
            if item.best_accuracy is not None:
                line.best = item.best_accuracy
            return
        if item.kind == "start":
            line.status = "running"
            line.started = now
            line.epoch = item.epoch
            line.message = item.message
        elif item.kind == "epoch":
            line.epoch = item.epoch
            line.accuracy = item.accuracy
            if item.accuracy is not None:
                line.best = item.accuracy if line.best is None else max(line.best, item.accuracy)
        elif item.kind == "steps":
            line.samples += item.samples

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for line in self.lines.values():
            counts[line.status] = counts.get(line.status, 0) + 1
        return counts

    def header(self) -> Text:
        counts = self.counts()
        done = sum(counts.get(key, 0) for key in ("finished", "skipped"))
        parts = [
            (f"{self.title} · ", "bold"),
            (f"done {done}", "green"),
            (f" · running {counts.get('running', 0)}", "cyan"),
            (f" · left {counts.get('waiting', 0)}", ""),
        ]
        for status in ("skipped", "diverged", "failed", "corrupt", "interrupted"):
            if counts.get(status):
                parts.append((f" · {status} {counts[status]}", STATUS_STYLES[status]))
        elapsed = int(time.monotonic() - self.began)
        parts.append((f" · {elapsed // 60}:{elapsed % 60:02d}", "dim"))
        return Text.assemble(*parts)

    def shown(self) -> list[RunLine]:
        """The running runs, then the latest to end, then the next to start."""
        lines = list(self.lines.values())
        if len(lines) <= self.rows:
            return lines
        running = [line for line in lines if line.status == "running"]
        ended = sorted(
            (line for line in lines if line.ended is not None),
            key=lambda line: line.ended or 0.0,
            reverse=True,
        )
        waiting = [line for line in lines if line.status == "waiting"]
        chosen = (running + ended + waiting)[: self.rows]
        order = {line.name: index for index, line in enumerate(lines)}
        return sorted(chosen, key=lambda line: order[line.name])

    def table(self) -> Table:
        table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
        for column, justify in (
            ("run", "left"),
            ("status", "left"),
            ("epoch", "right"),
            ("acc", "right"),
            ("best", "right"),
            ("samples", "right"),
            ("", "left"),
        ):
            table.add_column(column, justify=justify)  # type: ignore[arg-type]
        for line in self.shown():
            table.add_row(
                line.name,
                Text(line.status, style=STATUS_STYLES.get(line.status, "")),
                f"{line.epoch}/{line.epochs}",
                "" if line.accuracy is None else f"{line.accuracy:.4f}",
                "" if line.best is None else f"{line.best:.4f}",
                f"{line.samples:,}" if line.samples else "",
                Text(line.message[:80], style="dim"),
            )
        hidden = len(self.lines) - len(self.shown())
        if hidden:
            table.add_row(f"… {hidden} more", "", "", "", "", "", "")
        return table

    def __rich__(self) -> RenderableType:
        return Group(self.header(), self.table())

    @contextmanager
    def live(self) -> Iterator[Live]:
        """The context in which the board redraws itself (four times a second)."""
        try:
            with Live(self, console=self.console, refresh_per_second=4, transient=False) as live:
                yield live
        finally:
            if not self.console.is_terminal:
                # rich ends the board's last line only on a terminal: an error line that
                # follows must start a line of its own
                self.console.line()
