"""Checking every run folder before anything runs (:func:`check_specs`) and handing the
runs to a backend (:func:`run_specs`, :func:`make_backend`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from stratify.errors import (
    ConfigError,
)
from stratify.parallel.folders import (
    FolderState,
    best_of,
    folder_state,
)
from stratify.parallel.local_workers import (
    LocalBackend,
)
from stratify.parallel.ray_tasks import (
    RayBackend,
)
from stratify.parallel.specs import (
    Backend,
    EventHandler,
    RunGroup,
    RunOutcome,
    RunSpec,
    group_specs,
)
from stratify.runfiles import read_records


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
