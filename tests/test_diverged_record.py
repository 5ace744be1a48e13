"""A grid's diverged.json holds a divergence only for the run it was recorded for: the
same comparable settings, the same ``--vectorize`` group size and the same epochs in its
folder; otherwise the run trains again (docs/architecture.md, "Grids")."""

from __future__ import annotations

from pathlib import Path

from stratify.config import TrainConfig
from stratify.parallel import RunOutcome, RunSpec
from stratify.reproduce.diverged import DivergedRuns

MESSAGE = "a non-finite loss in epoch 3"


def spec_in(folder: Path) -> RunSpec:
    """A grid cell whose run folder ``folder/run`` does not exist."""
    config = TrainConfig(dataset="digits", secure=False, epochs=5, out=str(folder / "run"))
    return RunSpec("classes-2/fedavg/seed-0", config)


def recorded(folder: Path, spec: RunSpec, vectorize: int | None, epochs: int) -> None:
    """Record ``spec`` as diverged after ``epochs`` good epochs, as a grid run does."""
    outcome = RunOutcome(spec.name, "diverged", MESSAGE, epochs, None, None)
    DivergedRuns(folder, vectorize).record([spec], {spec.name: outcome})


def test_a_divergence_recorded_at_another_group_size_does_not_hold(tmp_path):
    spec = spec_in(tmp_path)
    recorded(tmp_path, spec, vectorize=None, epochs=0)
    held = DivergedRuns(tmp_path, vectorize=None).outcome(spec)
    assert held is not None and (held.status, held.message) == ("diverged", MESSAGE)
    # run in groups of 4 now: its numbers differ, so it trains again
    assert DivergedRuns(tmp_path, vectorize=4).outcome(spec) is None


def test_a_divergence_whose_folder_holds_other_epochs_does_not_hold(tmp_path):
    spec = spec_in(tmp_path)
    # recorded after two good epochs; the folder has since been removed (0 epochs)
    recorded(tmp_path, spec, vectorize=None, epochs=2)
    assert DivergedRuns(tmp_path, vectorize=None).outcome(spec) is None
    recorded(tmp_path, spec, vectorize=None, epochs=0)
    assert DivergedRuns(tmp_path, vectorize=None).outcome(spec) is not None
