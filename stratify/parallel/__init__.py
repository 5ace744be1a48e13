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

The package's modules, one idea each: :mod:`~stratify.parallel.specs` (what a batch of
runs is made of), :mod:`~stratify.parallel.folders` (what a run folder holds before its
run), :mod:`~stratify.parallel.execute` (one run or group in this process),
:mod:`~stratify.parallel.dispatch` (checking the folders, handing the runs to a backend),
:mod:`~stratify.parallel.local_workers` and :mod:`~stratify.parallel.ray_tasks` (the two
backends). The names below are the package's interface for the command line, the
reproduce code and the tests.
"""

from __future__ import annotations

from stratify.parallel.dispatch import check_specs, make_backend, run_specs
from stratify.parallel.execute import DatasetCache, execute
from stratify.parallel.folders import best_of, folder_state
from stratify.parallel.local_workers import LocalBackend, available_cores
from stratify.parallel.ray_tasks import RayBackend, check_ray_address
from stratify.parallel.specs import (
    COMPLETE,
    POLICIES,
    Backend,
    EventHandler,
    RunEvent,
    RunOutcome,
    RunsInterrupted,
    RunSpec,
    group_specs,
)

__all__ = [
    "Backend",
    "COMPLETE",
    "DatasetCache",
    "EventHandler",
    "LocalBackend",
    "POLICIES",
    "RayBackend",
    "RunEvent",
    "RunOutcome",
    "RunSpec",
    "RunsInterrupted",
    "available_cores",
    "best_of",
    "check_ray_address",
    "check_specs",
    "execute",
    "folder_state",
    "group_specs",
    "make_backend",
    "run_specs",
]
