"""Runs on this machine: spawned single-thread worker processes, or this process with
one worker (:class:`LocalBackend`).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from stratify.parallel.execute import (
    DatasetCache,
    execute_group,
)
from stratify.parallel.specs import (
    EventHandler,
    RunGroup,
    RunOutcome,
    RunsInterrupted,
    Terminated,
)
from stratify.validation import check_positive_int


def available_cores() -> int:
    """The CPU cores this process may use."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class GroupDone:
    """A worker's answer for a group: every run's outcome, in the group's order."""

    outcomes: tuple[RunOutcome, ...]


def worker_main(connection: Connection) -> None:
    """A worker process: run the groups it is sent, one at a time, until sent ``None``."""
    # Ctrl-C is the parent's to handle: it stops the workers itself
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    datasets = DatasetCache()
    while True:
        group = connection.recv()
        if group is None:
            return
        connection.send(GroupDone(tuple(execute_group(group, connection.send, datasets))))


@dataclass
class Worker:
    process: Any  # multiprocessing.process.BaseProcess of the spawn context
    connection: Connection
    current: RunGroup | None = None
    closed: bool = False


@contextmanager
def sigint_ignored() -> Iterator[None]:
    """SIGINT ignored while child processes start: they inherit it, so a Ctrl-C during
    their start-up cannot kill one with a traceback (the parent still stops them)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def sigterm_stops_runs() -> Iterator[None]:
    """SIGTERM raised as :class:`Terminated` in this (main) thread while runs go on.

    Without it SIGTERM ends this process at once and its workers, which do not share its
    death, go on training into the run folders; raised, it takes the path of Ctrl-C: every
    worker is stopped and the runs keep their last finished epoch. The workers themselves
    keep SIGTERM's default action (a Python handler is not inherited through ``exec``),
    so the parent's ``terminate()`` ends them at once.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread can handle signals; its caller owns SIGTERM then
        return

    def stop(number: int, frame: object) -> None:
        # a second SIGTERM while the workers are being stopped must not cut that short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated("SIGTERM")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass
class LocalBackend:
    """Runs on ``workers`` spawned single-thread processes; with one worker (or one
    run), in this process.

    Parameters
    ----------
    workers : int, optional
        Worker processes (default: the number of cores).
    """

    workers: int | None = None

    def __post_init__(self) -> None:
        if self.workers is not None:
            self.workers = check_positive_int(self.workers, "--workers")

    def run(self, groups: Sequence[RunGroup], on_event: EventHandler) -> list[RunOutcome]:
        count = min(self.workers or available_cores(), len(groups))
        with sigterm_stops_runs():
            if count <= 1:
                return self._run_here(groups, on_event)
            return self._run_in_processes(groups, on_event, count)

    def _run_here(self, groups: Sequence[RunGroup], on_event: EventHandler) -> list[RunOutcome]:
        datasets = DatasetCache()
        outcomes: list[RunOutcome] = []
        for index, group in enumerate(groups):
            try:
                done = execute_group(group, on_event, datasets)
            except KeyboardInterrupt as stop:
                outcomes += [
                    RunOutcome(spec.name, "interrupted")
                    for rest in groups[index:]
                    for spec in rest.specs
                ]
                raise RunsInterrupted(outcomes, RunsInterrupted.signal_of(stop)) from None
            for outcome in done:
                outcomes.append(outcome)
                on_event(outcome)
        return outcomes

    def _start(self, context: Any) -> Worker:
        ours, theirs = context.Pipe()
        process = context.Process(target=worker_main, args=(theirs,), daemon=True)
        with sigint_ignored():
            process.start()
        theirs.close()
        return Worker(process, ours)

    def _run_in_processes(
        self, groups: Sequence[RunGroup], on_event: EventHandler, count: int
    ) -> list[RunOutcome]:
        context = multiprocessing.get_context("spawn")
        waiting = deque(groups)
        specs = [spec for group in groups for spec in group.specs]
        outcomes: dict[str, RunOutcome] = {}
        workers: list[Worker] = []

        def dispatch(worker: Worker) -> None:
            worker.current = waiting.popleft() if waiting else None
            try:
                worker.connection.send(worker.current)
            except OSError:
                pass  # it died: found below by its sentinel

        def finish(outcome: RunOutcome) -> None:
            outcomes[outcome.name] = outcome
            on_event(outcome)

        try:
            for _ in range(count):
                workers.append(self._start(context))
                dispatch(workers[-1])
            while len(outcomes) < len(specs):
                live = [worker for worker in workers if not worker.closed]
                if not live:
                    break
                ready = wait(
                    [worker.connection for worker in live] + [w.process.sentinel for w in live]
                )
                for worker in live:
                    if worker.connection not in ready and worker.process.sentinel not in ready:
                        continue
                    self._receive(worker, finish, on_event, dispatch)
                    if worker.process.is_alive():
                        continue
                    worker.closed = True
                    if worker.current is not None:
                        lost = worker.current
                        worker.current = None
                        for spec in lost.specs:
                            finish(
                                RunOutcome(
                                    spec.name,
                                    "failed",
                                    "its worker process died (exit code "
                                    f"{worker.process.exitcode}); run again to resume it from "
                                    "its last checkpoint",
                                )
                            )
                    if waiting:
                        workers.append(self._start(context))
                        dispatch(workers[-1])
            for spec in specs:  # every worker gone before these were sent
                if spec.name not in outcomes:
                    finish(RunOutcome(spec.name, "failed", "no worker process was left to run it"))
            self._stop(workers)  # inside: a signal while they stop still stops them all
        except KeyboardInterrupt as stop:
            self._stop(workers)
            stopped = [
                outcomes.get(spec.name) or RunOutcome(spec.name, "interrupted") for spec in specs
            ]
            raise RunsInterrupted(stopped, RunsInterrupted.signal_of(stop)) from None
        return [outcomes[spec.name] for spec in specs]

    @staticmethod
    def _receive(
        worker: Worker,
        finish: Callable[[RunOutcome], None],
        on_event: EventHandler,
        dispatch: Callable[[Worker], None],
    ) -> None:
        """Everything ``worker`` has sent; a finished group gets it its next one."""
        try:
            while worker.connection.poll():
                message = worker.connection.recv()
                if isinstance(message, GroupDone):
                    worker.current = None
                    for outcome in message.outcomes:
                        finish(outcome)
                    dispatch(worker)
                else:
                    on_event(message)
        except (EOFError, OSError):
            pass  # the worker is gone; its sentinel says so

    @staticmethod
    def _stop(workers: list[Worker]) -> None:
        """Stop every worker: a run cut mid-epoch resumes from its last checkpoint."""
        for worker in workers:
            if worker.process.is_alive():
                worker.process.terminate()
        for worker in workers:
            worker.process.join(timeout=10)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
            worker.connection.close()
