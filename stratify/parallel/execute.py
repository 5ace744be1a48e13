"""One run, or one group of runs stepped together, in this process: the worker side of
every backend (:func:`execute`, :func:`execute_group`), with the datasets it keeps
(:class:`DatasetCache`).
"""

from __future__ import annotations

import os
import traceback
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from stratify.backend import resolve_device, single_thread_settings
from stratify.config import TrainConfig
from stratify.data.datasets import Dataset, dataset_uses_seed, load_dataset
from stratify.errors import (
    CheckpointError,
    StratifyError,
    TrainingError,
)
from stratify.parallel.folders import (
    best_of,
    folder_state,
)
from stratify.parallel.specs import (
    RunEvent,
    RunGroup,
    RunOutcome,
    RunSpec,
)
from stratify.run import EpochRecord, Run
from stratify.runfiles import read_records
from stratify.vectorize import train_together


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
