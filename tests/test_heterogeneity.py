"""FedDiverse heterogeneity metrics against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stratify.data.heterogeneity import (
    METRIC_NAMES,
    attribute_imbalance,
    class_imbalance,
    client_triplets,
    entropy,
    heterogeneity_metrics,
    heterogeneity_triplet,
    interaction_matrix,
    spurious_correlation,
)


def h2(p: float) -> float:
    """Binary entropy in bits."""
    return -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def test_entropy_in_nats():
    assert entropy(np.array([1, 1])) == pytest.approx(math.log(2))
    assert entropy(np.array([5, 0, 0])) == 0.0
    assert entropy(np.zeros(3)) == 0.0


def test_interaction_matrix_counts_pairs():
    labels = np.array([0, 0, 1, 2, 2, 2])
    attributes = np.array([1, 1, 0, 0, 1, 1])
    assert interaction_matrix(labels, attributes, 3, 2).tolist() == [[0, 2], [1, 0], [1, 2]]
    assert interaction_matrix(labels, None, 4).tolist() == [[2], [1], [3], [0]]
    with pytest.raises(ValueError, match="labels must lie in"):
        interaction_matrix(labels, None, 2)


def test_balanced_classes_have_zero_class_imbalance():
    assert class_imbalance(np.array([7, 7, 7, 7])) == pytest.approx(0.0, abs=1e-12)
    assert class_imbalance(np.full((10, 3), 4)) == pytest.approx(0.0, abs=1e-12)


def test_one_class_of_many_is_maximal_class_imbalance():
    assert class_imbalance(np.array([0, 9, 0, 0])) == pytest.approx(1.0)


def test_hand_computed_two_by_two_case():
    # N = [[2, 1], [0, 1]]: Y counts (3, 1), A counts (2, 2), joint (1/2, 1/4, 0, 1/4)
    matrix = np.array([[2, 1], [0, 1]])
    label_bits, attribute_bits, joint_bits = h2(0.25), 1.0, 1.5
    mutual_bits = label_bits + attribute_bits - joint_bits
    assert class_imbalance(matrix) == pytest.approx(1 - label_bits / 1.0)  # = 0.188722
    assert class_imbalance(matrix) == pytest.approx(0.188722, abs=1e-6)
    assert attribute_imbalance(matrix) == pytest.approx(0.0, abs=1e-12)
    expected_sc = 2 * mutual_bits / (label_bits + attribute_bits)
    assert spurious_correlation(matrix) == pytest.approx(expected_sc)
    assert spurious_correlation(matrix) == pytest.approx(0.343711, abs=1e-6)
    assert heterogeneity_triplet(matrix) == pytest.approx((0.188722, 0.0, 0.343711), abs=1e-6)


def test_attribute_equal_to_label_is_maximal_spurious_correlation():
    labels = np.array([0, 0, 1, 1, 2, 2])
    assert spurious_correlation(interaction_matrix(labels, labels, 3, 3)) == pytest.approx(1.0)
    # any bijection works too
    assert spurious_correlation(interaction_matrix(labels, 2 - labels, 3, 3)) == pytest.approx(1.0)


def test_attribute_coarser_than_label_is_below_one():
    # 4 balanced classes, attribute = label >= 2: I = H(A) = 1 bit, H(Y) = 2 bits -> 2/3
    labels = np.repeat(np.arange(4), 5)
    attributes = (labels >= 2).astype(int)
    matrix = interaction_matrix(labels, attributes, 4, 2)
    assert spurious_correlation(matrix) == pytest.approx(2 / 3)


def test_independent_attribute_has_no_spurious_correlation():
    assert spurious_correlation(np.full((3, 2), 5)) == pytest.approx(0.0, abs=1e-12)
    assert spurious_correlation(np.array([[1, 3], [2, 6]])) == pytest.approx(0.0, abs=1e-12)


def test_spurious_correlation_equals_arithmetic_normalised_mutual_information():
    from sklearn.metrics import normalized_mutual_info_score

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 5, size=300)
    attributes = (labels + rng.integers(0, 3, size=300)) % 4
    ours = spurious_correlation(interaction_matrix(labels, attributes, 5, 4))
    reference = normalized_mutual_info_score(labels, attributes, average_method="arithmetic")
    assert ours == pytest.approx(reference, abs=1e-10)


def test_degenerate_cases_are_zero():
    one_cell = np.array([[4]])
    assert heterogeneity_triplet(one_cell) == (0.0, 0.0, 0.0)  # one class, one attribute
    assert spurious_correlation(np.array([[4, 0], [0, 0]])) == 0.0  # 0/0


def test_federated_metrics_global_versus_client():
    # client 0: (y=0, a=0) x 2; client 1: (y=1, a=1) x 2. The union is balanced and the
    # attribute determines the label; each client alone holds one class and one attribute.
    labels = np.array([0, 0, 1, 1])
    attributes = np.array([0, 0, 1, 1])
    metrics = heterogeneity_metrics(labels, attributes, [np.array([0, 1]), np.array([2, 3])], 2, 2)
    assert set(metrics) == set(METRIC_NAMES)
    assert metrics["global_ci"] == pytest.approx(0.0, abs=1e-12)
    assert metrics["global_ai"] == pytest.approx(0.0, abs=1e-12)
    assert metrics["global_sc"] == pytest.approx(1.0)
    assert metrics["client_ci"] == pytest.approx(1.0)
    assert metrics["client_ai"] == pytest.approx(1.0)
    assert metrics["client_sc"] == pytest.approx(0.0)


def test_client_metrics_use_the_whole_label_space_and_an_unweighted_mean():
    labels = np.array([0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 0, 1, 2, 3])
    parts = [np.arange(6), np.arange(6, 10), np.arange(10, 14), np.array([], dtype=np.int64)]
    metrics = heterogeneity_metrics(labels, None, parts, num_classes=4)
    # clients 0 and 1 hold 2 balanced labels of 4: 1 - log 2 / log 4 = 0.5; client 2 is
    # balanced over 4: 0; the empty client is left out: (0.5 + 0.5 + 0) / 3
    assert metrics["client_ci"] == pytest.approx(1 / 3)
    assert metrics["global_ci"] == pytest.approx(class_imbalance(np.array([4, 4, 3, 3])))
    assert metrics["global_ai"] is None and metrics["client_ai"] is None
    assert metrics["global_sc"] is None and metrics["client_sc"] is None


def test_global_metrics_ignore_samples_no_client_holds():
    labels = np.array([0, 0, 1, 1, 2, 2])
    metrics = heterogeneity_metrics(labels, None, [np.array([0, 1]), np.array([2, 3])], 3)
    assert metrics["global_ci"] == pytest.approx(1 - math.log(2) / math.log(3))


def test_client_triplets():
    labels = np.array([0, 1, 0, 1])
    attributes = np.array([0, 0, 1, 1])
    triplets = client_triplets(labels, attributes, [np.array([0, 1]), np.array([], int)], 2, 2)
    assert triplets.shape == (2, 3)
    assert triplets[0] == pytest.approx([0.0, 1.0, 0.0])
    assert np.isnan(triplets[1]).all()
    no_attributes = client_triplets(labels, None, [np.arange(4)], 2)
    assert no_attributes[0, 0] == pytest.approx(0.0) and np.isnan(no_attributes[0, 1:]).all()


@pytest.mark.data
def test_metrics_on_colored_mnist_follow_the_correlation(shared_data_dir):
    """Perfect colour-label correlation on 10 digits: ΔSC = 2 H(A) / (H(Y) + H(A)) globally."""
    from stratify.data.datasets import load_dataset
    from stratify.data.partition import partition

    dataset = load_dataset("colored-mnist", data_dir=shared_data_dir, correlation=1.0)
    labels, colours = dataset.train_labels, dataset.domains_train
    parts = partition(labels, 10, "iid", seed=0)
    metrics = heterogeneity_metrics(labels, colours, parts, 10, 2)
    label_entropy = entropy(np.bincount(labels))
    colour_entropy = entropy(np.bincount(colours))
    expected = 2 * colour_entropy / (label_entropy + colour_entropy)
    assert metrics["global_sc"] == pytest.approx(expected)
    assert 0.45 < metrics["global_sc"] < 0.48
    uncorrelated = load_dataset("colored-mnist", data_dir=shared_data_dir, correlation=0.0)
    loose = heterogeneity_metrics(labels, uncorrelated.domains_train, parts, 10, 2)
    assert loose["global_sc"] < 0.01
