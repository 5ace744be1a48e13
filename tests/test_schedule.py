"""The Stratified Label Schedule: label repeats and the schedule, on hand-checkable cases."""

import numpy as np
import pytest

from stratify.errors import ConfigError
from stratify.schedule import label_repeats, stratified_label_schedule


def test_uniform_repeats_round_n_over_labels():
    assert label_repeats(np.array([5, 1, 4]), num_train=10, mode="uniform").tolist() == [3, 3, 3]
    assert label_repeats(np.array([5, 1]), 10, "uniform", repeats=7).tolist() == [7, 7]


def test_proportional_repeats_are_capped_counts():
    counts = np.array([50, 3, 20])
    assert label_repeats(counts, num_train=73, mode="proportional").tolist() == [24, 3, 20]
    assert label_repeats(counts, 73, "proportional", cap=10).tolist() == [10, 3, 10]


def test_bad_repeats_rejected():
    with pytest.raises(ConfigError):
        label_repeats(np.array([1, 2]), 3, mode="cubic")
    with pytest.raises(ConfigError):
        label_repeats(np.array([1, 2]), 3, mode="uniform", repeats=0)


def test_schedule_frequencies_exact_and_reshuffled_each_epoch():
    repeats = np.array([4, 1, 3, 2])
    first = stratified_label_schedule(repeats, np.random.default_rng([0, 1]))
    second = stratified_label_schedule(repeats, np.random.default_rng([0, 2]))
    again = stratified_label_schedule(repeats, np.random.default_rng([0, 1]))
    assert np.bincount(first, minlength=4).tolist() == [4, 1, 3, 2]
    assert np.bincount(second, minlength=4).tolist() == [4, 1, 3, 2]
    assert not np.array_equal(first, second)
    assert np.array_equal(first, again)


def test_uniform_repeats_round_to_nearest_not_down():
    # N / |L| = 11/3 = 3.67 -> 4, 8/3 = 2.67 -> 3, 17/4 = 4.25 -> 4, 1/3 -> 0 is rejected.
    # (Exact halves, e.g. 10/4 = 2.5, round half to even, giving 2; docs/architecture.md "Stratify"
    # only says round(N/|L|), so halves are deliberately left untested here.)
    assert label_repeats(np.array([4, 4, 3]), num_train=11).tolist() == [4, 4, 4]
    assert label_repeats(np.array([3, 3, 2]), num_train=8).tolist() == [3, 3, 3]
    assert label_repeats(np.array([5, 4, 4, 4]), num_train=17).tolist() == [4, 4, 4, 4]
    assert label_repeats(np.array([100, 100]), num_train=199).tolist() == [100, 100]
    with pytest.raises(ConfigError):
        label_repeats(np.array([1, 1, 1]), num_train=1)


def test_a_cap_is_refused_with_uniform_repeats_which_would_ignore_it():
    with pytest.raises(ConfigError, match="--cap applies to --repeats proportional"):
        label_repeats(np.array([10, 3, 20]), 33, "uniform", cap=10)
