"""The grid folder's record of its runs that a non-finite loss stopped (``diverged.json``).

A run folder keeps a diverged run's good epochs and their checkpoint, which reads as a
run to continue; without this record every resume of a grid trained such a run again,
and it diverged again at the same epoch. An entry holds for the run's configuration
(the settings a resumed run must share, :meth:`~stratify.options.OptionFields.comparable`),
the grid's ``--vectorize`` group size (a run's numbers depend on its group) and the
epochs its folder holds; a run whose configuration changed, or whose folder holds other
epochs (removed, or run on by hand), runs again (docs/architecture.md, "Grids").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stratify.errors import CorruptRunError
from stratify.files import guarded_as, release_input
from stratify.parallel import RunOutcome, RunSpec
from stratify.parallel.folders import best_of, folder_state
from stratify.runfiles import read_json_object, read_records
from stratify.runfolder import json_safe, write_output_file

DIVERGED_FILE = "diverged.json"


def run_identity(spec: RunSpec, vectorize: int | None) -> str:
    """What a recorded divergence is valid for: the run's comparable settings and the
    ``--vectorize`` group size, as canonical JSON."""
    settings = json_safe({**spec.config.comparable(), "vectorize": vectorize})
    return json.dumps(settings, sort_keys=True, default=str)


class DivergedRuns:
    """The diverged runs of the grid in ``folder``, read from and written to its
    :data:`DIVERGED_FILE`.

    Parameters
    ----------
    folder : Path
        The grid's folder.
    vectorize : int or None
        The grid's ``--vectorize`` group size (``None``: every run alone).
    """

    def __init__(self, folder: Path, vectorize: int | None = None) -> None:
        self.path = folder / DIVERGED_FILE
        self.vectorize = vectorize
        # reading guards the file as an input of the command; it is the grid's own state,
        # rewritten under the grid's folder lock, so that guard is dropped again, but not
        # one it already had (a link to an input stays refused as an output)
        guarded = guarded_as(self.path) is not None
        try:
            saved = read_json_object(self.path)
        except (OSError, CorruptRunError):
            saved = {}  # an unreadable record only costs running those runs again
        if not guarded:
            release_input(self.path)
        self.entries: dict[str, dict[str, Any]] = {
            name: entry
            for name, entry in saved.items()
            if isinstance(entry, dict) and {"identity", "epochs", "message"} <= entry.keys()
        }

    def outcome(self, spec: RunSpec) -> RunOutcome | None:
        """``spec``'s recorded divergence, if it still holds for it, as its outcome."""
        entry = self.entries.get(spec.name)
        if entry is None or spec.policy != "continue":
            return None
        if entry["identity"] != run_identity(spec, self.vectorize):
            return None
        # a folder that now holds every epoch asked for (fewer asked, or a plateau) is a
        # finished run, one that holds other epochs has been changed since
        state = folder_state(spec.config)
        if state.kind not in ("empty", "resumable", "partial") or state.differences:
            return None
        if state.epochs_done != entry["epochs"]:
            return None
        best, epoch = best_of(read_records(str(spec.config.out)))
        return RunOutcome(spec.name, "diverged", entry["message"], state.epochs_done, best, epoch)

    def record(self, specs: list[RunSpec], outcomes: dict[str, RunOutcome]) -> None:
        """Add the runs of ``specs`` that diverged in ``outcomes``, drop those that ran
        to their end, and write the file if anything changed."""
        changed = False
        for spec in specs:
            outcome = outcomes.get(spec.name)
            if outcome is None:
                continue
            if outcome.status == "diverged":
                entry = {
                    "identity": run_identity(spec, self.vectorize),
                    "epochs": outcome.epochs_done,
                    "message": outcome.message,
                }
                changed |= self.entries.get(spec.name) != entry
                self.entries[spec.name] = entry
            elif outcome.status in ("finished", "skipped") and spec.name in self.entries:
                del self.entries[spec.name]
                changed = True
        if changed:
            text = json.dumps(self.entries, indent=2, sort_keys=True) + "\n"
            write_output_file(self.path, text.encode())
