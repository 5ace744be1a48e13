"""--stop-on-plateau: a run ends where its validation accuracy plateaued, and the epochs it
ran are those of the same run without the rule."""

import dataclasses
import json

import pytest
from conftest import assert_refused_in_one_line

from stratify.config import run_complete
from stratify.errors import ConfigError
from stratify.measures import PlateauRule, plateau_budget
from stratify.parallel.folders import folder_state
from stratify.run import Run, TrainConfig

FAST = {"repeat_count": 10}


def config(tmp_path, name, **changes):
    values = dict(
        dataset="digits",
        partition="iid",
        clients=4,
        # at 0.05 this run swings between 25% and 88% for 60 epochs (not converged);
        # at 0.02 it climbs to 93-97% and converges at epoch 52
        epochs=60,
        lr=0.02,
        secure=False,
        validation=0.2,
        options=dict(FAST),
        out=str(tmp_path / name),
    )
    values.update(changes)
    return TrainConfig(**values)


def metrics(folder):
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        row.pop("wall_seconds")
    return rows


def test_a_run_stops_where_its_validation_accuracy_plateaued_and_equals_the_full_run(tmp_path):
    full = Run(config(tmp_path, "full")).train()
    records = metrics(tmp_path / "full")
    accuracies = [row["validation_accuracy"] for row in records]
    expected = plateau_budget(accuracies, PlateauRule(3, 60, chance=0.1))  # digits: 10 classes
    assert expected is not None and expected.reason == "plateau" and expected.rounds < 60
    assert full["stopped_on_plateau"] is None

    stopped = Run(config(tmp_path, "stopped", stop_on_plateau=3)).train()
    assert stopped["epochs_completed"] == stopped["stopped_on_plateau"] == expected.rounds
    # stopping changes nothing before it: the same epochs as the run without the rule
    assert metrics(tmp_path / "stopped") == records[: expected.rounds]


def test_a_plateaued_run_counts_as_finished_and_does_not_train_again(tmp_path):
    settings = config(tmp_path, "run", stop_on_plateau=3)
    summary = Run(settings).train()
    state = folder_state(settings)
    assert (state.kind, state.epochs_done) == ("finished", summary["epochs_completed"])
    resumed = Run(settings, resume=True).train()
    assert resumed["epochs_completed"] == summary["epochs_completed"]
    # a later R_min is a resumable change: the run goes on from its checkpoint
    later = Run(config(tmp_path, "run", stop_on_plateau=60), resume=True).train()
    assert later["epochs_completed"] == 60 and later["stopped_on_plateau"] is None


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"validation": 0.0}, "give --validation"),
        ({"stop_on_plateau": 61}, "--epochs is 60"),
        ({"stop_on_plateau": 0}, "--stop-on-plateau"),
    ],
)
def test_refusals(tmp_path, changes, message):
    values = {"stop_on_plateau": 3, **changes}
    with pytest.raises(ConfigError, match=message):
        config(tmp_path, "run", **values)


def test_the_train_command_says_where_it_stopped(tmp_path, capsys):
    from stratify.cli.main import main

    out = tmp_path / "cli"
    argv = ["train", "--dataset", "digits", "--partition", "iid", "--clients", "4"]
    argv += ["--epochs", "60", "--lr", "0.02", "--no-secure", "--validation", "0.2"]
    argv += ["--repeat-count", "10", "--stop-on-plateau", "3", "--out", str(out)]
    main(argv)
    summary = json.loads((out / "summary.json").read_text())
    assert f"stopped after epoch {summary['stopped_on_plateau']} of 60" in capsys.readouterr().out
    refused = argv[:-2] + ["--validation", "0", "--out", str(tmp_path / "x")]
    assert_refused_in_one_line(capsys, refused, "--validation", tmp_path / "x")


def test_a_folder_whose_run_sits_at_chance_is_not_finished(tmp_path):
    """The chance level comes from the classes the run recorded: a run at 10% of 10
    classes goes on, the same accuracies of 2 classes (chance 50%) would have stopped."""
    settings = config(tmp_path, "run", stop_on_plateau=3)
    at_chance = [0.1, 0.11, 0.1] * 10
    assert not run_complete(settings, at_chance, classes=10)
    assert run_complete(settings, at_chance)  # the chance level unknown: patience and margin alone
    Run(dataclasses.replace(settings, epochs=3)).train()
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["resolved"]["num_classes"] == 10
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    rows = [dict(record, epoch=e, validation_accuracy=a) for e, a in enumerate(at_chance, 1)]
    (tmp_path / "run" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert folder_state(settings).kind == "resumable"
