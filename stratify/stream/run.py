"""A stream run: events from a source into a :class:`StreamLearner`, and its run folder.

Files written to ``--out`` (docs/architecture.md, "Streaming"): ``config.json``,
``metrics.jsonl`` (one line appended every ``eval_every`` events), ``summary.json`` (at
every checkpoint and when the stream ends) and ``checkpoint.pt`` every
``checkpoint_every`` events or ``checkpoint_seconds`` seconds, when the stream is
stopped by SIGINT/SIGTERM, and at the end. The folder is held, locked and written as
``train``'s is (:class:`~stratify.runfolder.RunFolder`); it is kept from its first
metrics line on, so a folder holding metrics is never deleted.

A checkpoint records how many source lines it has consumed and a fingerprint of the
first and last of them. ``--resume`` restores it and then reads a source that either
replays the stream from its first line (the consumed lines are skipped and checked
against the fingerprint) or continues it (every line is new); by default the first
lines of the source tell which, and a source that could be either is refused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import signal
import sys
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np

from stratify.errors import ConfigError
from stratify.files import guard_input, release_input
from stratify.privacy.accounting import dp_settings_of, epsilon_spent
from stratify.registry.client_secrets import SECRETS_MODE
from stratify.runfiles import RUN_FILES
from stratify.runfolder import (
    RunFolder,
    array_checkpoint_bytes,
    check_same_settings,
    fresh_start_advice,
    json_safe,
    read_checkpoint,
    software_versions,
)
from stratify.stream.config import RESUMABLE_STREAM_CHANGES, StreamConfig
from stratify.stream.events import (
    Event,
    EventError,
    Identifier,
    LateLabel,
    RawLine,
    as_numpy,
    check_identifier,
    check_source,
    is_regular_file,
    load_test_set,
    open_source,
    parse_line,
    read_lines,
    stdin_reader,
)
from stratify.stream.learner import Prediction, StreamLearner
from stratify.stream.outputs import JsonLinesAppender, check_predictions_target

#: checkpoint layout version: 3 is an array checkpoint (NumPy arrays, no torch); 2, a
#: torch.save file of tensors, is still read (its tensors become arrays)
CHECKPOINT_FORMAT = 3
READABLE_FORMATS = (2, 3)
#: seconds between two progress callbacks (the live display)
PROGRESS_SECONDS = 0.25
#: consumed lines whose fingerprint a checkpoint keeps, at the start and at the end
FINGERPRINT_LINES = 16
#: what ``--source-position`` may be
SOURCE_POSITIONS = ("detect", "replay", "continue")
#: exit codes of a stream stopped by a signal (128 + its number)
STOP_SIGNALS = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}


#: seconds an event may go on learning after a stop signal before it is abandoned
STOP_GRACE_SECONDS = 3.0


class StopReading(Exception):
    """Raised by the signal handler while the stream waits for input."""


class AbandonEvent(BaseException):
    """Raised (by an alarm) in an event still being learned :data:`STOP_GRACE_SECONDS`
    after a stop signal; a ``BaseException`` so no handler on the way swallows it."""


def line_hash(raw: RawLine) -> str:
    """The fingerprint of one source line (an over-long line: by its length)."""
    data = raw.data if raw.data is not None else f"\0too long:{raw.length}".encode()
    return hashlib.blake2b(data, digest_size=8).hexdigest()


class StreamRun:
    """Feeds the events of ``config.source`` to a learner and writes the run folder.

    Parameters
    ----------
    config : StreamConfig
        The stream's configuration; ``source`` is required.
    resume : bool
        Continue from ``config.out``'s checkpoint.
    overwrite : bool
        Replace a run already in ``config.out`` (and the ``--predictions`` file).
    source_position : {"detect", "replay", "continue"}
        With ``resume``: whether the source starts again from the stream's first line,
        or continues after the last consumed one (default: tell from its first lines).
    on_record : callable, optional
        Called with every metrics record.
    on_reject : callable, optional
        Called with ``(line, reason)`` for every skipped event.
    on_progress : callable, optional
        Called with :meth:`status` a few times a second.
    on_message : callable, optional
        Called with a line of news (how a resumed source was read).
    stdin : stream, optional
        What ``--source -`` reads (default: ``sys.stdin``), binary or text.
    handle_signals : bool
        Stop cleanly on SIGINT and SIGTERM: finish the current event, write a checkpoint
        and return; :attr:`stopped_by` names the signal (the command line does this).
    """

    def __init__(
        self,
        config: StreamConfig,
        resume: bool = False,
        overwrite: bool = False,
        source_position: str = "detect",
        on_record: Callable[[dict[str, Any]], None] | None = None,
        on_reject: Callable[[int, str], None] | None = None,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
        on_message: Callable[[str], None] | None = None,
        stdin: Any = None,
        handle_signals: bool = False,
    ) -> None:
        if not isinstance(config, StreamConfig):
            raise ConfigError(f"a StreamRun needs a StreamConfig, got {type(config).__name__}")
        if config.source is None:
            raise ConfigError("--source is required: a JSON Lines file, or - for standard input")
        if config.source != "-":
            check_source(config.source)
        elif (stdin if stdin is not None else sys.stdin) is None:
            raise ConfigError("--source -: standard input is closed; give a file or a pipe")
        if resume and config.out is None:
            raise ConfigError("--resume needs --out DIR pointing at the stream to continue")
        if source_position not in SOURCE_POSITIONS:
            raise ConfigError(
                f"unknown --source-position {source_position!r}; choose one of "
                f"{', '.join(SOURCE_POSITIONS)}"
            )
        if source_position != "detect" and not resume:
            raise ConfigError("--source-position applies to --resume only")
        if resume and overwrite:
            raise ConfigError("--resume and --overwrite contradict each other; give one")
        self.config = config
        self.files_root = None if config.files_root is None else Path(config.files_root)
        self.resuming = resume
        self.overwrite = overwrite
        self.source_position = source_position
        self.on_record = on_record or (lambda record: None)
        self.on_reject = on_reject or (lambda line, reason: None)
        self.on_progress = on_progress or (lambda status: None)
        self.on_message = on_message or (lambda text: None)
        self.stdin = stdin
        self.handle_signals = handle_signals
        self.folder: RunFolder | None = None
        self.metrics: JsonLinesAppender | None = None
        self.predictions: JsonLinesAppender | None = None
        self.stopped_by: str | None = None
        self.abandoned = False
        self.reading = False
        self.learning = False
        self.checkpointed_lines = 0
        # the inputs, guarded from every output of this run until it is closed
        self.inputs = [
            (path, f"the {flag} {what} of this stream", False)
            for path, flag, what in (
                (config.source, "--source", "events"),
                (config.test, "--test", "samples"),
            )
            if path not in (None, "-")
        ]
        if config.files_root is not None:
            # every file below it may be an event's "path": no output may lie there, or
            # a --predictions or --out would empty a file the stream's own events read
            where = f"under --files-root {config.files_root}, the folder this stream's events read"
            self.inputs.append((config.files_root, where, True))
        for path, what, folder in self.inputs:
            guard_input(path, what, folder=folder)
        try:
            if config.out is not None:
                mode = "resume" if resume else "overwrite" if overwrite else "new"
                self.folder = RunFolder.open(
                    config.out, RUN_FILES, mode=mode, checkpoint="checkpoint.pt"
                )
            if config.predictions is not None:
                check_predictions_target(config.predictions, not resume, overwrite)
            self._set_up(resume)
        except BaseException:
            self.close()
            raise

    def _set_up(self, resume: bool) -> None:
        config = self.config
        self.checkpoint_state: dict[str, Any] | None = None
        if resume:
            assert self.folder is not None  # --resume needs --out
            path = self.folder.path / "checkpoint.pt"
            checkpoint = read_checkpoint(path)
            if checkpoint.get("format") not in READABLE_FORMATS:
                raise ConfigError(
                    f"--resume: {path} is not a stream checkpoint of this version; "
                    f"{fresh_start_advice(path.parent)}"
                )
            saved = checkpoint.get("config")
            if isinstance(saved, dict):
                # a checkpoint of an earlier version drew a new class's row at random: it
                # resumes with --new-class random (and detected no drift)
                saved = {"new_class": "random", "drift": "off", **saved}
            # as the checkpoint stores them (a tuple comes back a list)
            current = json_safe(config.comparable())
            check_same_settings(saved, current, RESUMABLE_STREAM_CHANGES, path)
            self.checkpoint_state = as_arrays(checkpoint)
        self.test_features: list[Any] = []
        self.test_labels: list[Identifier] = []
        self.x_test: np.ndarray | None = None
        if config.test is not None:
            self.test_features, self.test_labels = load_test_set(
                config.test, config.max_line_bytes, self.files_root
            )
        self.learner = StreamLearner(config)
        self.lines = 0
        self.rejected = 0
        self.ingest_seconds = 0.0
        self.timed_events = 0
        self.record_count = 0
        self.best_test_accuracy: float | None = None
        self.recent_records: deque[dict[str, Any]] = deque(maxlen=10)
        self.first_hashes: list[str] = []
        self.last_hashes: deque[str] = deque(maxlen=FINGERPRINT_LINES)
        self.pending: OrderedDict[Identifier, dict[str, Any]] = OrderedDict()
        self.dropped_pending = 0
        self.metrics_bytes = 0
        self.predictions_bytes = 0
        self.checkpoint_predictions: str | None = None
        self.begun = False
        if self.checkpoint_state is not None:
            self.restore(self.checkpoint_state)
        if self.folder is not None and not resume:
            # only now that every part is built: a failed set-up leaves --out untouched
            self.folder.start()
            self.folder.write_json("config.json", self.config_record())
        if self.learner.started:
            self.prepare_test_set()
        if not resume or not is_regular_file(self.config.predictions or "-"):
            # opened now, so a FIFO nobody reads is refused before the stream starts
            self.open_predictions()

    def close(self) -> None:
        """Release the run folder, the appended files (a run that never wrote a metrics
        line leaves nothing) and the guard on the inputs."""
        for appender in (self.metrics, self.predictions):
            if appender is not None:
                appender.close()
        self.metrics = self.predictions = None
        if self.folder is not None:
            self.folder.close()
        for path, _, _ in self.inputs:
            release_input(path)

    # -- checkpoint -----------------------------------------------------------------------

    def restore(self, checkpoint: dict[str, Any]) -> None:
        """Put the learner and the counters back where the checkpoint left them."""
        try:
            self.learner.load_state_dict(checkpoint["learner"])
            self.lines = int(checkpoint["lines"])
            self.first_hashes = [str(h) for h in checkpoint["first_hashes"]]
            self.last_hashes.extend(str(h) for h in checkpoint["last_hashes"])
            self.rejected = int(checkpoint["rejected"])
            self.ingest_seconds = float(checkpoint["ingest_seconds"])
            self.timed_events = int(checkpoint["timed_events"])
            self.record_count = int(checkpoint["record_count"])
            best = checkpoint["best_test_accuracy"]
            self.best_test_accuracy = None if best is None else float(best)
            self.recent_records.extend(dict(record) for record in checkpoint["recent_records"])
            self.metrics_bytes = int(checkpoint["metrics_bytes"])
            self.predictions_bytes = int(checkpoint["predictions_bytes"])
            self.checkpoint_predictions = checkpoint["predictions_path"]
            self.dropped_pending = int(checkpoint["dropped_pending"])
            for entry in checkpoint["pending"]:
                self.pending[entry["id"]] = dict(entry)
            self.checkpointed_lines = self.lines
        except (KeyError, ValueError, TypeError, RuntimeError, AttributeError) as error:
            raise ConfigError(
                f"--resume: {self.folder_path('checkpoint.pt')} does not fit this stream "
                f"({type(error).__name__}: {error}); start a new run with --overwrite"
            ) from None

    def checkpoint(self) -> None:
        """Write ``checkpoint.pt`` (the learner, whose buffers are client data, see the
        class docs, and how far the source has been read) and ``summary.json``."""
        if self.folder is None:
            return
        self.begin()
        for appender in (self.metrics, self.predictions):
            if appender is not None:
                appender.sync()  # the sizes recorded below are on disk
        state = {
            "format": CHECKPOINT_FORMAT,
            "config": self.config.comparable(),
            "lines": self.lines,
            "first_hashes": list(self.first_hashes),
            "last_hashes": list(self.last_hashes),
            "rejected": self.rejected,
            "ingest_seconds": self.ingest_seconds,
            "timed_events": self.timed_events,
            "record_count": self.record_count,
            "best_test_accuracy": self.best_test_accuracy,
            "recent_records": list(self.recent_records),
            "metrics_bytes": self.metrics.size if self.metrics is not None else self.metrics_bytes,
            "predictions_bytes": (
                self.predictions.size if self.predictions is not None else self.predictions_bytes
            ),
            "predictions_path": self.predictions_path(),
            "dropped_pending": self.dropped_pending,
            "pending": list(self.pending.values()),
            "learner": self.learner.state_dict(),
        }
        # 0600: it holds the clients' buffers and their placement key (docs/streaming.md,
        # "Placeholders"), for no one but the run's owner
        self.folder.write_bytes("checkpoint.pt", array_checkpoint_bytes(state), mode=SECRETS_MODE)
        self.folder.write_json("summary.json", self.summary())
        self.folder.commit()
        self.last_checkpoint = time.monotonic()
        self.checkpointed_lines = self.lines

    def begin(self) -> None:
        """Before the first new line is learned: (on resume) write the configuration and
        cut the appended files back to the checkpoint; open them."""
        if self.begun:
            return
        self.begun = True
        if self.folder is not None and self.resuming:
            self.folder.start()
            self.folder.write_json("config.json", self.config_record())
        if self.folder is not None and (self.resuming or self.record_count):
            self.open_metrics()
        self.open_predictions()

    def open_predictions(self) -> None:
        """Open ``--predictions`` (once): cut back to the checkpoint's size on resume,
        emptied with ``--overwrite``."""
        predictions = self.config.predictions
        if predictions is None or self.predictions is not None:
            return
        # the size in the checkpoint is that of the file the checkpoint wrote to
        same_file = self.resuming and self.checkpoint_predictions == self.predictions_path()
        size = self.predictions_bytes if same_file else (0 if self.overwrite else None)
        self.predictions = JsonLinesAppender(
            None if predictions == "-" else Path(predictions),
            size=size,
            what=f"--predictions {predictions}",
            flag="--predictions",
        )

    def predictions_path(self) -> str | None:
        """``--predictions`` as an absolute path (``-`` and ``None`` as they are)."""
        path = self.config.predictions
        return path if path in (None, "-") else os.path.abspath(path)

    def open_metrics(self) -> None:
        assert self.folder is not None
        self.folder.commit()  # a folder holding metrics is kept
        self.metrics = JsonLinesAppender(
            self.folder.location / "metrics.jsonl",
            size=self.metrics_bytes,
            what=str(self.folder.path / "metrics.jsonl"),
            flag="--out",
            owner=self.folder,
        )

    def folder_path(self, name: str) -> str:
        return str(self.folder.path / name) if self.folder is not None else name

    def config_record(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self.config), "versions": software_versions()}

    def prepare_test_set(self) -> None:
        """Turn the held-out samples into one array of the stream's features (once the
        first event has fixed their number, or their names)."""
        if not self.test_features or self.x_test is not None:
            return
        rows = []
        for number, features in enumerate(self.test_features, start=1):
            try:
                vector = self.learner.features.vector(features)
            except EventError as error:
                raise ConfigError(f"--test {self.config.test} sample {number}: {error}") from None
            assert vector is not None
            rows.append(vector)
        self.x_test = np.stack(rows)

    # -- the stream -----------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Read the source to its end (or to a stop signal); returns the summary.
        Releases the run folder."""
        previous: dict[signal.Signals, Any] = {}
        if self.handle_signals:
            for number in STOP_SIGNALS:
                previous[number] = signal.signal(number, self._on_signal)
            previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, self._on_alarm)
        try:
            # one BLAS thread for the whole run, entered once rather than per event
            # (docs/streaming.md, "river")
            with self.learner.blas:
                return self._run()
        except AbandonEvent:
            # the learner is halfway through an event: nothing more is written, and the
            # last checkpoint (whose appended files a resume cuts back to) is what is kept
            self.abandoned = True
            return self.summary()
        finally:
            if self.handle_signals:
                signal.setitimer(signal.ITIMER_REAL, 0)
            for number, handler in previous.items():
                signal.signal(number, handler)
            self.close()

    def _on_signal(self, number: int, frame: FrameType | None) -> None:
        self.stopped_by = STOP_SIGNALS.get(signal.Signals(number), str(number))
        if self.reading:
            raise StopReading
        if self.learning:
            # a long event (many steps, a FedAvg round, a blocked --predictions FIFO) ends
            # within the grace period, or is abandoned
            signal.setitimer(signal.ITIMER_REAL, STOP_GRACE_SECONDS)

    def _on_alarm(self, number: int, frame: FrameType | None) -> None:
        if self.learning:
            raise AbandonEvent

    def _source(self) -> Iterator[RawLine]:
        source = self.config.source or "-"
        if source == "-":
            read = stdin_reader(self.stdin if self.stdin is not None else sys.stdin)
            yield from read_lines(read, self.config.max_line_bytes)
            return
        handle = open_source(source)
        with handle:
            yield from read_lines(handle.read, self.config.max_line_bytes)

    def _next(self, lines: Iterator[RawLine]) -> RawLine | None:
        """The next source line, or ``None`` at the end or on a stop signal."""
        if self.stopped_by is not None:
            return None
        self.reading = True
        try:
            return next(lines, None)
        except StopReading:
            return None
        finally:
            self.reading = False

    def _run(self) -> dict[str, Any]:
        self.last_checkpoint = time.monotonic()
        lines = self._source()
        offset, skip = self.position(lines)
        if self.stopped_by is None:
            lines = itertools.chain(self.lookahead, lines)
        learner = self.learner
        last_progress = time.perf_counter()
        recorded_events = learner.stats.events
        regular = is_regular_file(self.config.source or "-")
        while True:
            raw = self._next(lines)
            if raw is None:
                break
            if raw.number <= skip:
                self.check_replayed(raw)
                continue
            number = offset + raw.number
            if not raw.complete and regular and not looks_complete(raw):
                self.on_reject(
                    number,
                    "the last line has no newline yet and is incomplete; not consumed (a "
                    "--resume reads it once it is complete)",
                )
                break
            self.begin()
            start = time.perf_counter()
            was_started = learner.started
            self.learning = True
            try:
                learned = self.consume(raw, number)
            finally:
                self.learning = False
                if self.stopped_by is not None and self.handle_signals:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            self.lines = number
            if len(self.first_hashes) < FINGERPRINT_LINES:
                self.first_hashes.append(line_hash(raw))
            self.last_hashes.append(line_hash(raw))
            now = time.perf_counter()
            if was_started:
                self.ingest_seconds += now - start
                self.timed_events += learned
            elif learner.started:
                self.prepare_test_set()
            if learned:
                events = learner.stats.events
                if events % self.config.eval_every == 0:
                    self.record()
                    recorded_events = events
                if events % self.config.checkpoint_every == 0:
                    self.checkpoint()
            if time.monotonic() - self.last_checkpoint >= self.config.checkpoint_seconds:
                self.checkpoint()
            if now - last_progress >= PROGRESS_SECONDS:
                last_progress = now
                self.on_progress(self.status())
        if self.stopped_by is None and (
            learner.stats.events > recorded_events or not self.record_count
        ):
            self.begin()
            self.record()
        self.checkpoint()
        return self.summary()

    def consume(self, raw: RawLine, number: int) -> bool:
        """Parse and ingest one line; returns whether a labeled event was learned. A
        line that is no event is reported with its number and skipped."""
        try:
            if raw.data is None:
                raise EventError(
                    f"longer than --max-line-bytes ({self.config.max_line_bytes:,} bytes)"
                )
            item = parse_line(raw.data, number, self.files_root)
            if item is None:
                return False
            if isinstance(item, LateLabel):
                return self.late_label(item)
            if item.label is None:
                self.predict(item)
                return False
            self.learner.ingest(item)
            return True
        except EventError as error:
            self.rejected += 1
            self.on_reject(number, str(error))
            return False

    def predict(self, event: Event) -> None:
        """An event without a label: its prediction goes to ``--predictions``; with an id
        it is kept (bounded by ``--max-pending``) for a late label."""
        if self.predictions is None:
            raise EventError("no label: give --predictions FILE to have unlabeled events predicted")
        check_identifier(event.client, "client")
        if event.id is not None and event.id in self.pending:
            raise EventError(f"id {event.id!r} is already waiting for its label")
        prediction = self.learner.predict(event.x)
        self.learner.stats.predicted += 1
        label = None if prediction is None else self.learner.classes[prediction.row]
        self.predictions.append(
            {
                "line": event.line,
                "id": event.id,
                "client": event.client,
                "prediction": label,
                "probability": None
                if prediction is None
                else prediction.probability(prediction.row),
            }
        )
        if event.id is None:
            return
        if len(self.pending) >= self.config.max_pending:
            self.pending.popitem(last=False)
            self.dropped_pending += 1
        self.pending[event.id] = {
            "id": event.id,
            "client": event.client,
            "x": event.x,
            "line": event.line,
            "row": -1 if prediction is None else prediction.row,
            "probabilities": np.zeros(0) if prediction is None else prediction.probabilities,
        }

    def late_label(self, item: LateLabel) -> bool:
        """The label of an earlier unlabeled event: scored against the prediction made
        then, and learned."""
        entry = self.pending.get(item.id)
        if entry is None:
            raise EventError(f"no unlabeled event with id {item.id!r} is waiting for its label")
        prediction = None
        if entry["row"] >= 0:
            prediction = Prediction(int(entry["row"]), entry["probabilities"])
        event = Event(entry["client"], item.label, entry["x"], int(entry["line"]), item.id)
        self.learner.ingest(event, prediction=prediction)
        del self.pending[item.id]
        return True

    # -- where a resumed source starts ------------------------------------------------------

    def position(self, lines: Iterator[RawLine]) -> tuple[int, int]:
        """``(offset, skip)``: the stream's number of the source's line 0, and how many
        source lines were consumed before (a replay). Reads the source's first lines
        into :attr:`lookahead` to tell a replay from a continuation."""
        self.lookahead: list[RawLine] = []
        consumed = self.lines
        if not self.resuming or consumed == 0:
            return 0, 0
        mode = self.source_position
        if mode == "continue":
            self.on_message(
                f"continuing the stream: the source's line 1 is the stream's line {consumed + 1}"
            )
            return consumed, 0
        if mode == "replay":
            self.on_message(f"the source replays the stream: skipping its first {consumed} lines")
            return 0, consumed
        wanted = min(FINGERPRINT_LINES, consumed)
        while len(self.lookahead) < wanted:
            raw = self._next(lines)
            if raw is None:
                break
            self.lookahead.append(raw)
        if self.stopped_by is not None or not self.lookahead:
            return 0, consumed
        replays = all(
            line_hash(raw) == expected for raw, expected in zip(self.lookahead, self.first_hashes)
        )
        if not replays:
            self.on_message(
                f"the source continues the stream (its first lines are new): its line 1 is "
                f"the stream's line {consumed + 1}"
            )
            return consumed, 0
        repeating = (
            consumed >= 2 * wanted
            and list(self.last_hashes)[-wanted:] == self.first_hashes[:wanted]
        )
        if len(self.lookahead) < wanted or repeating:
            why = (
                f"its {len(self.lookahead)} lines are the stream's first ones"
                if len(self.lookahead) < wanted
                else "the stream repeats its first lines"
            )
            raise ConfigError(
                f"--resume: cannot tell whether --source replays the stream from its first "
                f"line or continues it after line {consumed} ({why}); give "
                "--source-position replay or --source-position continue"
            )
        self.on_message(f"the source replays the stream: skipping its first {consumed} lines")
        return 0, consumed

    def check_replayed(self, raw: RawLine) -> None:
        """A replayed line must be the one consumed before (where the fingerprint has it)."""
        consumed = self.lines
        index = raw.number - 1
        expected = None
        if index < len(self.first_hashes):
            expected = self.first_hashes[index]
        last = list(self.last_hashes)
        position = raw.number - (consumed - len(last)) - 1
        if 0 <= position < len(last):
            expected = last[position]
        if expected is not None and line_hash(raw) != expected:
            raise ConfigError(
                f"--resume: line {raw.number} of --source differs from the line "
                f"{raw.number} consumed before; this source does not replay the stream "
                "(give --source-position continue if it continues it)"
            )

    # -- reporting ------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """What the live display shows."""
        return {
            **self.learner.status(),
            "events_per_second": self.events_per_second(),
            "rejected": self.rejected,
            "lines": self.lines,
        }

    def events_per_second(self) -> float | None:
        """Events ingested per second of ingestion over the whole stream: parsing
        included; evaluation, checkpoints and the event that built the model left out."""
        if self.ingest_seconds <= 0:
            return None
        return self.timed_events / self.ingest_seconds

    def record(self) -> dict[str, Any]:
        """A metrics line: the learner's counters, the held-out accuracy, the pace;
        appended to ``metrics.jsonl``."""
        test_accuracy = None
        if self.x_test is not None:
            test_accuracy = self.learner.test_accuracy(self.x_test, self.test_labels)
        record = {
            "line": self.lines,
            **self.learner.snapshot(),
            "rejected": self.rejected,
            "pending": len(self.pending),
            "dropped_pending": self.dropped_pending,
            "test_accuracy": test_accuracy,
            "events_per_second": self.events_per_second(),
            "ingest_seconds": round(self.ingest_seconds, 4),
        }
        if test_accuracy is not None:
            self.best_test_accuracy = max(self.best_test_accuracy or 0.0, test_accuracy)
        self.record_count += 1
        self.recent_records.append(record)
        if self.folder is not None:
            if self.metrics is None:
                self.open_metrics()
            assert self.metrics is not None
            self.metrics.append(record)
        self.on_record(record)
        return record

    @property
    def records(self) -> list[dict[str, Any]]:
        """The last (at most 10) metrics records."""
        return list(self.recent_records)

    def summary(self) -> dict[str, Any]:
        """The stream so far (``null`` figures before the first record)."""
        last = self.recent_records[-1] if self.recent_records else {}
        stats = self.learner.stats
        return {
            "events": stats.events,
            "lines": self.lines,
            "rejected": self.rejected,
            "predicted": stats.predicted,
            "steps": stats.steps,
            "undone_updates": stats.undone,
            "clients": len(self.learner.clients),
            "classes": len(self.learner.classes),
            "final_window_accuracy": last.get("window_accuracy"),
            "prequential_accuracy": last.get("prequential_accuracy"),
            "macro_f1": last.get("macro_f1"),
            "log_loss": last.get("log_loss"),
            "majority_accuracy": last.get("majority_accuracy"),
            "final_test_accuracy": last.get("test_accuracy"),
            "best_test_accuracy": self.best_test_accuracy,
            "transfers": last.get("transfers"),
            "events_per_second": self.events_per_second(),
            "ingest_seconds": round(self.ingest_seconds, 4),
            "stopped_by": self.stopped_by,
            **stream_privacy_summary(self.config),
        }


def stream_privacy_summary(config: StreamConfig) -> dict[str, Any]:
    """``{"privacy": {...}}``: the (ε, δ) of a DP stream, from Opacus's accountant over
    ``--max-uses`` noised steps, the most any one sample takes (per event: a sample sent
    twice is two samples; docs/architecture.md, "Differential privacy"); nothing without
    DP."""
    privacy = dp_settings_of(config)
    if privacy is None or config.max_uses is None:
        return {}
    sigma = privacy.sigma(config.max_uses)
    return {
        "privacy": {
            "mechanism": "per-step clipping + Gaussian noise, no subsampling, per event",
            "accountant": "opacus RDP",
            "target_epsilon": privacy.epsilon,
            "delta": privacy.delta,
            "clip": privacy.clip,
            "noise_multiplier": sigma,
            "uses": config.max_uses,
            "epsilon": epsilon_spent(sigma, privacy.delta, config.max_uses),
        }
    }


def looks_complete(raw: RawLine) -> bool:
    """Whether a last line without its newline holds a whole JSON value (a writer still
    writing it leaves it unreadable)."""
    if raw.data is None:
        return False
    try:
        json.loads(raw.data)
    except (ValueError, RecursionError):
        return False
    return True


def as_arrays(state: Any) -> Any:
    """``state`` with every torch tensor (a format-2 checkpoint's) replaced by a NumPy
    array; torch is only loaded if the checkpoint's reader loaded it."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(state, torch.Tensor):
        return as_numpy(state)
    if isinstance(state, dict):
        return {key: as_arrays(value) for key, value in state.items()}
    if isinstance(state, list):
        return [as_arrays(value) for value in state]
    return state
