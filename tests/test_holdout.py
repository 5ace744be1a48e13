"""The validation split: carved from the training samples, per label, never the test set."""

import json

import numpy as np
import pytest
import torch

from stratify.data.datasets import load_dataset
from stratify.data.holdout import holdout_validation, stratified_holdout
from stratify.errors import ConfigError
from stratify.experiment import build_experiment
from stratify.run import Run, TrainConfig


def test_holdout_takes_the_share_of_every_label():
    labels = np.array([0] * 10 + [1] * 4 + [2] * 1)
    kept, held = stratified_holdout(labels, 0.3, seed=0)
    # round(3.0) = 3 of label 0, round(1.2) = 1 of label 1, round(0.3) = 0 of label 2
    assert np.bincount(labels[held], minlength=3).tolist() == [3, 1, 0]
    assert sorted(np.concatenate([kept, held]).tolist()) == list(range(len(labels)))
    assert not set(kept) & set(held)
    assert np.all(np.diff(held) > 0) and np.all(np.diff(kept) > 0)


def test_holdout_keeps_one_sample_of_every_label():
    labels = np.array([0] * 3 + [1] * 2)
    kept, held = stratified_holdout(labels, 0.9, seed=0)
    assert np.bincount(labels[kept]).tolist() == [1, 1]
    assert np.bincount(labels[held]).tolist() == [2, 1]


def test_holdout_is_seeded():
    labels = np.repeat(np.arange(5), 20)
    first = stratified_holdout(labels, 0.2, seed=3)[1]
    assert np.array_equal(first, stratified_holdout(labels, 0.2, seed=3)[1])
    assert not np.array_equal(first, stratified_holdout(labels, 0.2, seed=4)[1])


def test_validation_split_is_held_out_of_training_and_the_test_set_kept():
    dataset = load_dataset("digits")
    training, validation = holdout_validation(dataset, 0.25, seed=0)
    _, held = stratified_holdout(dataset.train_labels, 0.25, seed=0)
    assert torch.equal(validation.x, dataset.x_train[torch.as_tensor(held)])
    assert torch.equal(validation.y, dataset.y_train[torch.as_tensor(held)])
    assert len(training.y_train) + len(validation) == len(dataset.y_train)
    # no validation image is a training image, and the test set is the dataset's own
    kept_rows = {row.numpy().tobytes() for row in training.x_train.flatten(1)}
    assert not any(row.numpy().tobytes() in kept_rows for row in validation.x.flatten(1))
    assert torch.equal(training.x_test, dataset.x_test)
    assert len(dataset.y_test) == 360 and len(dataset.y_train) == 1437  # left as it was


def test_a_run_with_validation_evaluates_on_the_split_and_the_test_set(tmp_path):
    config = TrainConfig(
        dataset="digits",
        partition="classes:2",
        epochs=3,
        secure=False,
        validation=0.2,
        options={"repeat_count": 20},
        out=str(tmp_path / "run"),
    )
    experiment = build_experiment(config)
    held = stratified_holdout(load_dataset("digits").train_labels, 0.2, seed=0)[1]
    assert experiment.validation is not None and len(experiment.validation) == len(held)
    assert experiment.federation.client_sizes.sum() == len(experiment.dataset.y_train)
    summary = Run(config).train()
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["validation"] == 0.2
    assert saved["resolved"]["evaluated_on"] == "validation and test"
    assert saved["resolved"]["validation_samples"] == len(held)
    assert saved["resolved"]["evaluation_samples"] == 360
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert all(0 <= r["validation_accuracy"] <= 1 and 0 <= r["test_accuracy"] <= 1 for r in records)
    # the epoch is chosen on validation; the test accuracy is the one of that epoch
    chosen = max(records, key=lambda r: r["validation_accuracy"])
    assert summary["best_val_epoch"] == chosen["epoch"]
    assert summary["test_accuracy_at_best_val"] == chosen["test_accuracy"]


@pytest.mark.parametrize("share", [-0.1, 1.0, "half"])
def test_validation_share_must_leave_training_samples(share):
    with pytest.raises(ConfigError, match="--validation"):
        TrainConfig(validation=share)
