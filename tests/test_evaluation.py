"""Worst-group accuracy: the metric by hand, in the engine's evaluation and in the run files."""

import json

import numpy as np
import pytest
import torch

from stratify.evaluation import worst_group_accuracy
from stratify.run import Run, TrainConfig


def test_worst_group_accuracy_by_hand():
    labels = np.array([0, 0, 0, 1, 1, 1, 1])
    colours = np.array([0, 0, 0, 0, 1, 1, 1])
    correct = np.array([1, 1, 0, 1, 1, 0, 1], dtype=bool)
    # groups (0, red) 2/3, (1, red) 1/1, (1, green) 2/3; (0, green) holds no sample
    assert worst_group_accuracy(correct, labels, colours) == pytest.approx(2 / 3)
    correct[5:] = False
    assert worst_group_accuracy(correct, labels, colours) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="at least one sample"):
        worst_group_accuracy(np.array([], bool), np.array([], int), np.array([], int))


def config(tmp_path, name, **changes):
    values = dict(
        dataset="digits",
        partition="iid",
        clients=4,
        epochs=2,
        secure=False,
        options={"repeat_count": 20},
        out=str(tmp_path / name),
    )
    values.update(changes)
    return TrainConfig(**values)


def test_runs_without_attributes_write_null(tmp_path):
    summary = Run(config(tmp_path, "plain")).train()
    rows = (tmp_path / "plain" / "metrics.jsonl").read_text().splitlines()
    assert all(json.loads(row)["worst_group_accuracy"] is None for row in rows)
    assert summary["best_worst_group_accuracy"] is None
    assert summary["final_worst_group_accuracy"] is None


def test_the_engine_reports_the_worst_group_of_the_test_sets_attributes(tmp_path):
    run = Run(config(tmp_path, "groups", epochs=1))
    engine = run.engine
    # give the test set two attributes: even and odd positions
    engine.dataset.domains_test = np.arange(len(engine.dataset.y_test)) % 2
    metrics = engine.test_metrics()
    with torch.no_grad():
        engine.model.eval()
        hits = (engine.model(engine.dataset.x_test).argmax(1) == engine.dataset.y_test).numpy()
    labels = engine.dataset.y_test.numpy()
    groups = [
        hits[(labels == y) & (engine.dataset.domains_test == a)].mean()
        for y in np.unique(labels)
        for a in (0, 1)
    ]
    assert metrics.worst_group_accuracy == pytest.approx(min(groups))
    assert metrics.accuracy == pytest.approx(hits.mean())
    assert engine.evaluate() == (metrics.accuracy, metrics.loss)


def test_checkpoints_written_before_the_field_existed_still_resume(tmp_path):
    Run(config(tmp_path, "old", epochs=1)).train()
    path = tmp_path / "old" / "checkpoint.pt"
    checkpoint = torch.load(path, weights_only=True)
    for record in checkpoint["records"]:
        del record["worst_group_accuracy"]
    torch.save(checkpoint, path)
    Run(config(tmp_path, "old", epochs=2), resume=True).train()
    rows = [json.loads(r) for r in (tmp_path / "old" / "metrics.jsonl").read_text().splitlines()]
    assert [row["worst_group_accuracy"] for row in rows] == [None, None]
