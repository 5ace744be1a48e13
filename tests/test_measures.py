"""Accuracy summaries that do not choose an epoch on the test set, against hand values."""

import pytest

from stratify.measures import accuracy_summary, best_on_validation, last_rounds, last_window


def test_last_window_is_a_tenth_of_the_epochs_and_at_least_three():
    assert [last_window(n) for n in (0, 1, 2, 3, 10, 30, 31, 40, 200)] == [
        0, 1, 2, 3, 3, 3, 4, 4, 20,
    ]  # fmt: skip


def test_last_rounds_mean_and_sample_std_by_hand():
    # ten epochs: the last three are 0.5, 0.7, 0.9 -> mean 0.7, sample std 0.2
    result = last_rounds([0.1] * 7 + [0.5, 0.7, 0.9])
    assert result is not None and result.rounds == 3
    assert result.mean == pytest.approx(0.7) and result.std == pytest.approx(0.2)
    single = last_rounds([0.4])
    assert single is not None and (single.mean, single.std, single.rounds) == (0.4, 0.0, 1)
    assert last_rounds([]) is None


def test_best_on_validation_reads_the_test_accuracy_only_at_its_epoch():
    records = [
        {"epoch": 1, "validation_accuracy": 0.6, "test_accuracy": 0.9},
        {"epoch": 2, "validation_accuracy": 0.8, "test_accuracy": 0.5},
        {"epoch": 3, "validation_accuracy": 0.8, "test_accuracy": 0.7},
    ]
    choice = best_on_validation(records)
    assert choice is not None
    # the first of the tied validation epochs, whatever the test accuracy elsewhere
    assert (choice.epoch, choice.validation_accuracy, choice.test_accuracy) == (2, 0.8, 0.5)
    assert best_on_validation([{"epoch": 1, "test_accuracy": 0.9}]) is None


def test_accuracy_summary_of_a_swinging_run():
    # a run that peaks once on test: best 0.9 at epoch 2, but it ends at 0.2, 0.4, 0.3
    values = [0.5, 0.9, 0.2, 0.4, 0.3]
    groups = [0.1, 0.6, 0.0, 0.2, 0.1]
    records = [
        {"epoch": e + 1, "test_accuracy": a, "worst_group_accuracy": g}
        for e, (a, g) in enumerate(zip(values, groups))
    ]
    summary = accuracy_summary(records)
    assert (summary["best_accuracy"], summary["best_epoch"]) == (0.9, 2)
    assert summary["final_accuracy"] == 0.3 and summary["last_rounds"] == 3
    assert summary["last_mean_accuracy"] == pytest.approx(0.3)
    assert summary["last_std_accuracy"] == pytest.approx(0.1)
    assert summary["last_mean_worst_group_accuracy"] == pytest.approx(0.1)
    assert summary["best_worst_group_accuracy"] == 0.6
    assert summary["best_val_epoch"] is None
    assert summary["last_mean_validation_accuracy"] is None  # no validation split
    assert accuracy_summary([])["last_mean_accuracy"] is None


def test_the_last_rounds_validation_mean_is_over_the_test_accuracy_s_window():
    validation = [0.1, 0.9, 0.6, 0.7, 0.8]
    records = [
        {"epoch": e + 1, "test_accuracy": 0.5, "validation_accuracy": v}
        for e, v in enumerate(validation)
    ]
    summary = accuracy_summary(records)
    assert summary["last_rounds"] == 3
    assert summary["last_mean_validation_accuracy"] == pytest.approx(0.7)
