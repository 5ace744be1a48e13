"""What a run folder holds before its run starts: nothing, a finished run, a checkpoint
to resume, or a run of another configuration (:func:`folder_state`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stratify.config import TrainConfig, resolved_differences, run_complete
from stratify.errors import (
    CorruptRunError,
)
from stratify.runfiles import RUN_FILES, check_checkpoint_file, read_json_object, read_records
from stratify.runfolder import json_safe


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

    @property
    def epochs_kept(self) -> int:
        """The epochs a continued run keeps: all of a finished run's, a resumable one's up
        to its checkpoint, none of a partial or corrupt folder's (run again from epoch 1),
        so a folder copied without its checkpoints counts its finished runs only."""
        return self.epochs_done if self.kind in ("finished", "resumable") else 0


def config_differences(saved: dict[str, Any], config: TrainConfig) -> tuple[str, ...]:
    """``"key: saved vs asked"`` for each setting a resumed run must share (as JSON).

    The rate, the schedule and the method's options are compared as the run used them
    (``config.json``'s ``"resolved"``) against what ``config`` resolves to today: a run
    that took a default which has since moved is another configuration, and one that
    named a value explicitly matches a run that got the same value as a default
    (docs/architecture.md, "Run folder").
    """
    asked = json.loads(json.dumps(json_safe(config.comparable())))
    used = saved.get("resolved") if isinstance(saved.get("resolved"), dict) else None
    compared_as_used = ("lr", "lr_schedule", "options") if used is not None else ()
    differences = [
        f"{key}: {saved.get(key)!r:.60} vs {value!r}"
        for key, value in asked.items()
        if key not in compared_as_used and saved.get(key) != value
    ]
    if used is not None:
        differences += resolved_differences(used, config)
    return tuple(differences)


def saved_classes(saved: dict[str, Any]) -> int | None:
    """The data's classes a run folder's ``config.json`` recorded, if any."""
    resolved = saved.get("resolved")
    classes = resolved.get("num_classes") if isinstance(resolved, dict) else None
    return classes if isinstance(classes, int) and classes > 0 else None


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
    accuracies = [record.get("validation_accuracy") for record in records]
    if run_complete(config, accuracies, saved_classes(saved)):
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
