"""Many independent runs at once: worker processes on this machine, or Ray tasks.

A :class:`RunSpec` is one run: its configuration (``config.out`` is its run folder) and
what to do with a folder that already holds something. :func:`run_specs` checks every
folder first, skips the finished runs, and hands the rest to a backend with one method,
``run(specs, on_event)``:

- :class:`LocalBackend`: N spawned single-thread worker processes, each keeping the
  datasets it has loaded (:class:`DatasetCache`); with one worker, in this process.
- :class:`RayBackend`: one Ray task per run (one CPU, or one GPU with ``--device cuda``)
  on an existing cluster or a local one.

Workers report :class:`RunEvent` objects (start, epoch, steps) and one :class:`RunOutcome`
per run; a display subscribes with ``on_event``. Runs checkpoint every epoch, so a run
stopped anywhere (Ctrl-C, a killed worker) resumes from its last finished epoch to the
same result (docs/architecture.md, "Many runs at once").
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Protocol

from stratify.backend import resolve_device, single_thread_settings
from stratify.config import TrainConfig
from stratify.data.datasets import Dataset, dataset_uses_seed, load_dataset
from stratify.errors import (
    CheckpointError,
    ConfigError,
    CorruptRunError,
    StratifyError,
    TrainingError,
)
from stratify.run import RUN_FILES, EpochRecord, Run
from stratify.runfiles import check_checkpoint_file, read_json_object, read_records
from stratify.runfolder import json_safe
from stratify.validation import check_positive_int
from stratify.vectorize import plan_groups, train_together

#: ``new``: the folder must hold no run; ``continue``: skip a finished run, resume one
#: with a checkpoint, start the rest afresh; ``overwrite``: start afresh in any case
POLICIES = ("new", "continue", "overwrite")
#: outcomes after which the run folder holds every epoch asked for
COMPLETE = ("finished", "skipped")


@dataclass(frozen=True)
class RunSpec:
    """One run to execute.

    Parameters
    ----------
    name : str
        Unique name, shown by the display (e.g. ``seed-3`` or a grid cell's key).
    config : TrainConfig
        The run's configuration; ``config.out`` is its run folder.
    policy : {"new", "continue", "overwrite"}
        What to do with a folder that already holds something (:data:`POLICIES`).
    keep_corrupt : bool
        Under ``continue``, leave a folder whose files cannot be read (outcome
        ``corrupt``) instead of running it again from its first epoch.
    """

    name: str
    config: TrainConfig
    policy: str = "continue"
    keep_corrupt: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"a run's name must be non-empty text, got {self.name!r:.60}")
        if not isinstance(self.config, TrainConfig):
            raise ConfigError(
                f"run {self.name}: config must be a TrainConfig, got {type(self.config).__name__}"
            )
        if self.policy not in POLICIES:
            raise ConfigError(f"unknown run policy {self.policy!r}; use {', '.join(POLICIES)}")
        if not self.config.out:
            raise ConfigError(f"run {self.name}: its configuration needs a run folder (out)")
        if not isinstance(self.keep_corrupt, bool):
            raise ConfigError(f"run {self.name}: keep_corrupt must be True or False")


@dataclass(frozen=True)
class RunEvent:
    """Progress of one run: ``start`` (``epoch`` = epochs already done), ``epoch`` (one more
    finished, with its test accuracy) or ``steps`` (``samples`` trained since the last)."""

    name: str
    kind: str
    epoch: int = 0
    epochs: int = 0
    accuracy: float | None = None
    samples: int = 0
    pid: int = 0
    message: str = ""


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended.

    ``status`` is ``finished``, ``skipped`` (the folder already held every epoch),
    ``diverged`` (a non-finite loss stopped it; its good epochs are kept), ``failed`` (an
    error, or its worker died: ``message`` says which), ``corrupt`` (its folder could not
    be read and was left, ``keep_corrupt``) or ``interrupted``. ``corrupt`` holds why a
    folder was found corrupt, also when the run was then started again.
    """

    name: str
    status: str
    message: str = ""
    epochs_done: int = 0
    best_accuracy: float | None = None
    best_epoch: int | None = None
    corrupt: str = ""


@dataclass(frozen=True)
class RunGroup:
    """Runs that a worker executes together: one spec alone, or specs stepped together
    (:mod:`stratify.vectorize`), spec ``i`` in lane ``lanes[i]`` of ``lane_count``.

    A vectorised group keeps the lane count it was planned with, even when some of its
    runs have finished meanwhile: a run's numbers depend on the lane count.
    """

    specs: tuple[RunSpec, ...]
    lanes: tuple[int, ...] = ()
    lane_count: int = 1

    @property
    def vectorised(self) -> bool:
        return bool(self.lanes)


def group_specs(
    specs: Sequence[RunSpec], vectorize: int | None
) -> tuple[list[RunGroup], str | None]:
    """``specs`` as groups: each alone without ``vectorize``; else groups of at most
    ``vectorize`` runs sharing a step (:func:`~stratify.vectorize.plan_groups`), with the
    one-line note on what runs alone."""
    if vectorize is None:
        return [RunGroup((spec,)) for spec in specs], None
    grouping = plan_groups([spec.config for spec in specs], vectorize)
    groups = []
    for indices in grouping.groups:
        members = tuple(specs[index] for index in indices)
        if len(indices) == 1:
            groups.append(RunGroup(members))
        else:
            groups.append(RunGroup(members, tuple(range(len(indices))), len(indices)))
    return groups, grouping.note(vectorize)


class RunsInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped the runs; ``outcomes`` says which finished and which are resumable."""

    def __init__(self, outcomes: list[RunOutcome]) -> None:
        super().__init__("interrupted")
        self.outcomes = outcomes


EventHandler = Callable[[RunEvent | RunOutcome], None]


class Backend(Protocol):
    """Runs groups of specs whose folders have been checked, reporting to ``on_event``;
    returns every run's outcome."""

    def run(self, groups: Sequence[RunGroup], on_event: EventHandler) -> list[RunOutcome]: ...


# -- run folders ------------------------------------------------------------------------


@dataclass(frozen=True)
class FolderState:
    """What a run folder holds: ``empty``, ``finished`` (every epoch asked for),
    ``resumable`` (a checkpoint), ``partial`` (files but no checkpoint), ``corrupt`` (a
    file that cannot be read back: ``reason`` says which and why).

    ``differences`` lists the settings in which its ``config.json`` differs from the
    configuration asked for (empty when they agree or the folder holds no run).
    """

    kind: str
    epochs_done: int = 0
    differences: tuple[str, ...] = ()
    reason: str = ""


def config_differences(saved: dict[str, Any], config: TrainConfig) -> tuple[str, ...]:
    """``"key: saved vs asked"`` for each setting a resumed run must share (as JSON)."""
    asked = json.loads(json.dumps(json_safe(config.comparable())))
    return tuple(
        f"{key}: {saved.get(key)!r:.60} vs {value!r}"
        for key, value in asked.items()
        if saved.get(key) != value
    )


def folder_state(config: TrainConfig) -> FolderState:
    """What ``config.out`` holds, compared with ``config``; never raises on what the
    files hold (a damaged one makes the folder ``corrupt``)."""
    out = Path(str(config.out))
    try:
        present = [name for name in RUN_FILES if os.path.lexists(out / name)]
        if not present:
            return FolderState("empty")
        if "config.json" not in present:
            return FolderState("corrupt", reason=f"{out / 'config.json'} is missing")
        saved = read_json_object(out / "config.json")
        records = read_records(out)
        if "summary.json" in present:
            read_json_object(out / "summary.json")
        if "checkpoint.pt" in present:
            check_checkpoint_file(out / "checkpoint.pt")
    except CorruptRunError as error:
        return FolderState("corrupt", reason=str(error))
    except OSError as error:
        return FolderState("corrupt", reason=f"{out}: {error.strerror or error}")
    differences = config_differences(saved, config)
    done = len(records)
    if done >= config.epochs:
        return FolderState("finished", done, differences)
    if "checkpoint.pt" in present:
        return FolderState("resumable", done, differences)
    return FolderState("partial", done, differences)


def best_of(records: Sequence[dict[str, Any]]) -> tuple[float | None, int | None]:
    """Best test accuracy of ``records`` and its epoch (the first, on ties)."""
    if not records:
        return None, None
    best = max(records, key=lambda record: record["test_accuracy"])
    return best["test_accuracy"], best["epoch"]


# -- one run, in this process -------------------------------------------------------------


class DatasetCache:
    """The datasets a worker has loaded, kept for its next runs.

    The key is everything that decides a dataset's content; the seed only for datasets
    whose data depends on it (:func:`~stratify.data.datasets.dataset_uses_seed`), so a
    worker loads a fixed split once for every seed. Runs never change the tensors.

    Parameters
    ----------
    size : int
        How many datasets to keep (the least recently used is dropped); one by default,
        since a worker's runs mostly share one dataset and a large one is worth its memory.
    """

    def __init__(self, size: int = 1) -> None:
        self.size = size
        self.loaded: OrderedDict[tuple, Dataset] = OrderedDict()

    def load(self, config: TrainConfig) -> Dataset:
        device = resolve_device(config.device)
        options = tuple(sorted((key, str(value)) for key, value in config.dataset_options.items()))
        seed = config.seed if dataset_uses_seed(config.dataset) else None
        key = (config.dataset, config.data_dir, str(device), seed, options)
        if key in self.loaded:
            self.loaded.move_to_end(key)
            return self.loaded[key]
        dataset = load_dataset(
            config.dataset,
            data_dir=config.data_dir,
            device=device,
            seed=config.seed,
            **config.dataset_options,
        )
        self.loaded[key] = dataset
        while len(self.loaded) > self.size:
            self.loaded.popitem(last=False)
        return dataset


def open_run(
    spec: RunSpec,
    report: Callable[[RunEvent], None],
    datasets: DatasetCache | None,
) -> tuple[Run, str] | RunOutcome:
    """``spec``'s run, built by its policy and ready to train with one thread, and the
    reason its folder was corrupt (``""`` if it was not: a corrupt folder is run again
    from epoch 1); or its outcome without training: ``skipped`` when its folder already
    holds every epoch, ``corrupt`` when a corrupt folder is to be left as it is."""
    config = spec.config
    pid = os.getpid()
    corrupt = ""
    state = folder_state(config)
    if spec.policy == "continue" and state.kind == "finished" and not state.differences:
        best, epoch = best_of(read_records(str(config.out))[: config.epochs])
        return RunOutcome(spec.name, "skipped", "", state.epochs_done, best, epoch)
    if state.kind == "corrupt":
        if spec.policy == "continue" and spec.keep_corrupt:
            return RunOutcome(spec.name, "corrupt", state.reason, corrupt=state.reason)
        corrupt = state.reason
    resume = spec.policy == "continue" and state.kind == "resumable"
    overwrite = spec.policy == "overwrite" or (
        spec.policy == "continue" and state.kind in ("partial", "corrupt")
    )
    single_thread_settings()
    dataset = datasets.load(config) if datasets is not None else None

    def on_epoch(record: EpochRecord) -> None:
        report(
            RunEvent(spec.name, "epoch", record.epoch, config.epochs, record.test_accuracy, pid=pid)
        )

    def on_steps(count: int) -> None:
        report(RunEvent(spec.name, "steps", samples=count, pid=pid))

    def start(resume: bool, overwrite: bool) -> Run:
        return Run(
            config,
            resume=resume,
            overwrite=overwrite,
            on_epoch=on_epoch,
            on_steps=on_steps,
            dataset=dataset,
        )

    try:
        run = start(resume, overwrite)
    except CheckpointError as error:
        if not resume:
            raise
        # its checkpoint cannot be resumed from: the folder is corrupt
        if spec.keep_corrupt:
            return RunOutcome(spec.name, "corrupt", error.reason, corrupt=error.reason)
        corrupt = error.reason
        run = start(False, True)
    note = f"corrupt ({corrupt}); run again from epoch 1" if corrupt else ""
    report(RunEvent(spec.name, "start", run.start_epoch, config.epochs, pid=pid, message=note))
    return run, corrupt


def finished_outcome(spec: RunSpec, run: Run, corrupt: str = "") -> RunOutcome:
    summary = run.summary()
    return RunOutcome(
        spec.name,
        "finished",
        "",
        len(run.records),
        summary["best_accuracy"],
        summary["best_epoch"],
        corrupt,
    )


def error_outcome(
    spec: RunSpec, run: Run | None, error: BaseException, corrupt: str = ""
) -> RunOutcome:
    """A :class:`~stratify.errors.TrainingError` is ``diverged`` (its good epochs stay),
    any other error ``failed``; ``corrupt``: why its folder was run again from epoch 1."""
    if isinstance(error, TrainingError):
        records = [vars(record) for record in run.records] if run is not None else []
        best, epoch = best_of(records)
        return RunOutcome(spec.name, "diverged", str(error), len(records), best, epoch, corrupt)
    if isinstance(error, StratifyError):
        return RunOutcome(spec.name, "failed", str(error), corrupt=corrupt)
    where = traceback.extract_tb(error.__traceback__)[-1]
    return RunOutcome(
        spec.name,
        "failed",
        f"{type(error).__name__}: {error} ({Path(where.filename).name}:{where.lineno})",
        corrupt=corrupt,
    )


def execute(
    spec: RunSpec,
    report: Callable[[RunEvent], None] | None = None,
    datasets: DatasetCache | None = None,
) -> RunOutcome:
    """Run ``spec`` in this process with one thread, following its policy.

    Errors become the outcome: a :class:`~stratify.errors.TrainingError` is ``diverged``
    (the epochs before it are kept), any other error ``failed``; Ctrl-C propagates.
    """
    run: Run | None = None
    corrupt = ""
    try:
        opened = open_run(spec, report or (lambda event: None), datasets)
        if isinstance(opened, RunOutcome):
            return opened
        run, corrupt = opened
        run.train()
        return finished_outcome(spec, run, corrupt)
    except Exception as error:  # a bug must not take the other runs down with it
        return error_outcome(spec, run, error, corrupt)


def execute_group(
    group: RunGroup,
    report: Callable[[RunEvent], None] | None = None,
    datasets: DatasetCache | None = None,
) -> list[RunOutcome]:
    """Run a group's specs in this process, stepping together
    (:func:`~stratify.vectorize.train_together`); a group of one runs as :func:`execute`.

    Each run follows its own policy and ends in its own outcome: a run that fails to
    build or diverges leaves the group and the others go on.
    """
    if not group.vectorised:
        return [execute(spec, report, datasets) for spec in group.specs]
    report = report or (lambda event: None)
    outcomes: dict[int, RunOutcome] = {}
    runs: dict[int, Run] = {}
    corrupt: dict[int, str] = {}
    try:
        for index, spec in enumerate(group.specs):
            try:
                opened = open_run(spec, report, datasets)
            except Exception as error:
                outcomes[index] = error_outcome(spec, None, error)
                continue
            if isinstance(opened, RunOutcome):
                outcomes[index] = opened
            else:
                runs[index], corrupt[index] = opened
        order = sorted(runs)

        def on_end(position: int, error: BaseException | None) -> None:
            index = order[position]
            runs[index].close()
            spec = group.specs[index]
            outcomes[index] = (
                finished_outcome(spec, runs[index], corrupt[index])
                if error is None
                else error_outcome(spec, runs[index], error, corrupt[index])
            )

        if order:
            try:
                train_together(
                    [runs[index] for index in order],
                    [group.lanes[index] for index in order],
                    group.lane_count,
                    on_end,
                )
            except Exception as error:  # a failure of the shared step ends every run left
                for index in order:
                    if index not in outcomes:
                        outcomes[index] = error_outcome(
                            group.specs[index], runs[index], error, corrupt[index]
                        )
    finally:
        for run in runs.values():
            run.close()
    return [outcomes[index] for index in range(len(group.specs))]


# -- checking folders and dispatching ---------------------------------------------------


def check_specs(specs: Sequence[RunSpec]) -> dict[str, FolderState]:
    """Each spec's folder state; refuses what cannot go ahead, before any run starts.

    Refused: two specs with one name or one folder, a folder holding a run under policy
    ``new``, and under ``continue`` a folder whose run has another configuration.
    """
    names = [spec.name for spec in specs]
    folders = [str(Path(str(spec.config.out)).resolve()) for spec in specs]
    for label, values in (("name", names), ("run folder", folders)):
        repeated = sorted({value for value in values if values.count(value) > 1})
        if repeated:
            raise ConfigError(f"two runs share the {label} {repeated[0]}")
    states = {}
    occupied, foreign = [], []
    for spec in specs:
        state = folder_state(spec.config)
        states[spec.name] = state
        if spec.policy == "new" and state.kind != "empty":
            occupied.append(str(spec.config.out))
        if spec.policy == "continue" and state.differences:
            foreign.append(f"{spec.config.out} ({'; '.join(state.differences)})")
    if occupied:
        raise ConfigError(
            f"{', '.join(occupied)} already hold(s) a run; use --resume to continue, "
            "--overwrite to replace, or another --out"
        )
    if foreign:
        raise ConfigError(
            f"{foreign[0]} holds a run with another configuration"
            + (f" (and {len(foreign) - 1} more folders)" if len(foreign) > 1 else "")
            + "; move it away or use another --out"
        )
    return states


def run_specs(
    specs: Sequence[RunSpec],
    backend: Backend | None = None,
    on_event: EventHandler | None = None,
    vectorize: int | None = None,
    on_note: Callable[[str], None] | None = None,
) -> list[RunOutcome]:
    """Execute ``specs`` on ``backend`` (default: local workers, one per core).

    Folders are checked first (:func:`check_specs`); finished runs under ``continue`` are
    reported as ``skipped`` without starting anything. With ``vectorize``, runs that can
    share a step go in groups of at most that many (:func:`group_specs`, planned over
    every spec, finished or not, so the same command forms the same groups), and
    ``on_note`` is told in one line what runs alone. Returns one outcome per spec, in
    order. Ctrl-C stops every run and raises :class:`RunsInterrupted`.
    """
    on_event = on_event or (lambda item: None)
    states = check_specs(specs)
    groups, note = group_specs(specs, vectorize)
    if note is not None and on_note is not None:
        on_note(note)
    outcomes: dict[str, RunOutcome] = {}
    todo: list[RunGroup] = []
    for group in groups:
        kept = []
        for position, spec in enumerate(group.specs):
            state = states[spec.name]
            if spec.policy == "continue" and state.kind == "finished":
                best, epoch = best_of(read_records(str(spec.config.out))[: spec.config.epochs])
                outcomes[spec.name] = RunOutcome(
                    spec.name, "skipped", "", state.epochs_done, best, epoch
                )
                on_event(outcomes[spec.name])
            elif spec.policy == "continue" and state.kind == "corrupt" and spec.keep_corrupt:
                outcomes[spec.name] = RunOutcome(
                    spec.name, "corrupt", state.reason, corrupt=state.reason
                )
                on_event(outcomes[spec.name])
            else:
                kept.append(position)
        if not kept:
            continue
        members = tuple(group.specs[position] for position in kept)
        lanes = tuple(group.lanes[position] for position in kept) if group.vectorised else ()
        todo.append(RunGroup(members, lanes, group.lane_count))
    if todo:
        backend = backend or LocalBackend()
        for outcome in backend.run(todo, on_event):
            outcomes[outcome.name] = outcome
    return [outcomes[spec.name] for spec in specs]


def available_cores() -> int:
    """The CPU cores this process may use."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


# -- local worker processes ---------------------------------------------------------------


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
        if count <= 1:
            return self._run_here(groups, on_event)
        return self._run_in_processes(groups, on_event, count)

    def _run_here(self, groups: Sequence[RunGroup], on_event: EventHandler) -> list[RunOutcome]:
        datasets = DatasetCache()
        outcomes: list[RunOutcome] = []
        for index, group in enumerate(groups):
            try:
                done = execute_group(group, on_event, datasets)
            except KeyboardInterrupt:
                outcomes += [
                    RunOutcome(spec.name, "interrupted")
                    for rest in groups[index:]
                    for spec in rest.specs
                ]
                raise RunsInterrupted(outcomes) from None
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
        except KeyboardInterrupt:
            self._stop(workers)
            stopped = [
                outcomes.get(spec.name) or RunOutcome(spec.name, "interrupted") for spec in specs
            ]
            raise RunsInterrupted(stopped) from None
        self._stop(workers)
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


# -- Ray ----------------------------------------------------------------------------------

RAY_HINT = "--backend ray needs Ray: pip install 'stratify[ray]'"
#: seconds a Ray cluster's address has to accept a connection before it is called dead
#: (ray.init itself retries a dead address for minutes)
RAY_CONNECT_SECONDS = 10.0
#: seconds a trial driver has to join the cluster (what answers may not be Ray)
RAY_JOIN_SECONDS = 30.0
#: a trial driver: joins the cluster at argv[1] and leaves
RAY_JOIN_SCRIPT = (
    "import logging, sys\n"
    "import ray\n"
    "ray.init(address=sys.argv[1], log_to_driver=False, include_dashboard=False,\n"
    "         logging_level=logging.ERROR)\n"
    "ray.shutdown()\n"
)
#: the addresses Ray resolves itself, without a host to connect to
RAY_LOCAL_ADDRESSES = ("auto", "local")


def ray_endpoint(address: str) -> tuple[str, int] | None:
    """The ``(host, port)`` of a Ray address (``host:port`` or ``ray://host:port``), or
    ``None`` for ``auto``/``local``; anything else is refused in one line."""
    if address in RAY_LOCAL_ADDRESSES:
        return None
    text = address.removeprefix("ray://")
    host, separator, port = text.rpartition(":")
    host = host.strip("[]")  # [::1]:6379
    if not separator or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--address {address!r} is not host:port, ray://host:port, auto or local")
    return host, int(port)


def check_ray_address(address: str | None) -> None:
    """Refuse, in bounded time and one line, a Ray address that cannot be joined, before
    ``ray.init`` in this process would retry it for minutes, printing as it goes.

    First a TCP connection (at most :data:`RAY_CONNECT_SECONDS`): nothing listening is
    refused at once. Then a trial driver in a child process joins the cluster (at most
    :data:`RAY_JOIN_SECONDS`, its output kept from the terminal): something that answers
    but is not a Ray cluster is refused too. ``None`` checks the address Ray would read
    from ``RAY_ADDRESS``, if set; ``auto`` and ``local`` are Ray's to resolve."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is None:
        return
    endpoint = ray_endpoint(address)
    if endpoint is None:
        return
    try:
        socket.create_connection(endpoint, timeout=RAY_CONNECT_SECONDS).close()
    except OSError as error:
        reason = "no answer" if isinstance(error, TimeoutError) else error.strerror or error
        raise ConfigError(
            f"--backend ray: nothing answers at {address} ({reason}, waited at most "
            f"{RAY_CONNECT_SECONDS:g} s); start the cluster (ray start --head) or fix --address"
        ) from None
    try:
        trial = subprocess.run(
            [sys.executable, "-c", RAY_JOIN_SCRIPT, address],
            capture_output=True,
            text=True,
            timeout=RAY_JOIN_SECONDS,
        )
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"--backend ray: could not join the Ray cluster at {address} within "
            f"{RAY_JOIN_SECONDS:g} s; check that --address names a Ray head node"
        ) from None
    if trial.returncode != 0:
        lines = [line.strip() for line in trial.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if "Error" in line.split(":")[0]] or lines or ["?"]
        raise ConfigError(
            f"--backend ray: cannot join the Ray cluster at {address} ({errors[-1][:200]}); "
            "check that --address names a Ray head node"
        )


#: the datasets a Ray worker process has loaded, kept for the next tasks it runs
_RAY_WORKER_DATASETS = DatasetCache()


def _ray_execute(group: RunGroup, events: Any) -> list[RunOutcome]:
    return execute_group(group, events.put, _RAY_WORKER_DATASETS)


@dataclass
class RayBackend:
    """One Ray task per group (a run alone, or runs stepped together): one CPU each, or
    one GPU for runs with ``device="cuda"``.

    Parameters
    ----------
    address : str, optional
        The cluster to join (``ray.init(address=...)``; e.g. ``auto`` or
        ``ray://head:10001``). Default: Ray's own default, which starts a local cluster
        where none runs; a Ray already initialised in this process is used as it is.
    """

    address: str | None = None

    def __post_init__(self) -> None:
        if self.address is not None:
            if not isinstance(self.address, str):
                raise ConfigError(f"--address must be text, got {self.address!r:.60}")
            ray_endpoint(self.address)

    def check(self) -> None:
        """Refuse a cluster address where nothing answers, in bounded time."""
        check_ray_address(self.address)

    def run(self, groups: Sequence[RunGroup], on_event: EventHandler) -> list[RunOutcome]:
        try:
            import ray
            from ray.util.queue import Queue
        except ImportError:
            raise ConfigError(RAY_HINT) from None
        started_here = not ray.is_initialized()
        if started_here:
            self.check()
            try:
                ray.init(address=self.address, log_to_driver=False, include_dashboard=False)
            except (ConnectionError, RuntimeError, ValueError) as error:
                raise ConfigError(
                    f"--backend ray: cannot join the Ray cluster at {self.address or 'default'} "
                    f"({str(error).splitlines()[0]})"
                ) from None
        events = Queue(actor_options={"num_cpus": 0})
        task = ray.remote(_ray_execute)
        pending = {
            task.options(
                num_cpus=1, num_gpus=1 if group.specs[0].config.device == "cuda" else 0
            ).remote(group, events): group
            for group in groups
        }
        specs = [spec for group in groups for spec in group.specs]
        outcomes: dict[str, RunOutcome] = {}

        def drain() -> None:
            waiting = events.qsize()
            if waiting:
                for event in events.get_nowait_batch(waiting):
                    on_event(event)

        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1, timeout=0.25)
                drain()
                for reference in done:
                    group = pending.pop(reference)
                    try:
                        results = ray.get(reference)
                    except Exception as error:  # the task's process died or Ray failed it
                        message = f"Ray: {str(error).splitlines()[0]}"
                        results = [RunOutcome(spec.name, "failed", message) for spec in group.specs]
                    for outcome in results:
                        outcomes[outcome.name] = outcome
                        on_event(outcome)
            drain()
        except KeyboardInterrupt:
            for reference in pending:
                ray.cancel(reference, force=True)
            stopped = [
                outcomes.get(spec.name) or RunOutcome(spec.name, "interrupted") for spec in specs
            ]
            raise RunsInterrupted(stopped) from None
        finally:
            events.shutdown(force=True)
            if started_here:
                ray.shutdown()
        return [outcomes[spec.name] for spec in specs]


def make_backend(name: str, workers: int | None = None, address: str | None = None) -> Backend:
    """``local`` (``workers`` processes) or ``ray`` (the cluster at ``address``)."""
    if name == "local":
        if address is not None:
            raise ConfigError("--address applies to --backend ray")
        return LocalBackend(workers)
    if name == "ray":
        if workers is not None:
            raise ConfigError("--workers applies to --backend local; Ray places one run per CPU")
        return RayBackend(address)
    raise ConfigError(f"unknown --backend {name!r}; choose local or ray")
