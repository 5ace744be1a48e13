"""Partitions: NIID-Bench semantics, determinism, no lost or duplicated samples, bad specs."""

from __future__ import annotations

import numpy as np
import pytest

from stratify.data.partition import (
    MAX_DIRICHLET_TRIES,
    PARTITIONS,
    parse_partition_spec,
    partition,
    unassigned,
)
from stratify.errors import PartitionError


def balanced_labels(num_classes: int = 10, per_class: int = 50, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(num_classes), per_class))


def assert_disjoint(parts: list[np.ndarray]) -> np.ndarray:
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) == len(joined), "a sample is held by two clients"
    for part in parts:
        assert part.dtype == np.int64 and np.all(np.diff(part) > 0), "not sorted int64"
    return joined


def assert_exact_cover(parts: list[np.ndarray], num_samples: int) -> None:
    assert np.array_equal(np.sort(assert_disjoint(parts)), np.arange(num_samples))


# ---------------------------------------------------------------------------- spec parsing


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("iid", ("iid", None)),
        (" IID ", ("iid", None)),
        ("classes:2", ("classes", 2)),
        ("dirichlet:0.5", ("dirichlet", 0.5)),
        ("Dirichlet: 1e-1", ("dirichlet", 0.1)),
        ("shards:3", ("shards", 3)),
        ("domains:1", ("domains", 1)),
    ],
)
def test_parse_valid_specs(spec, expected):
    assert parse_partition_spec(spec) == expected


@pytest.mark.parametrize(
    "spec, message",
    [
        ("random", "unknown partition 'random'; use iid, classes:K"),
        ("classes:x", "classes needs a whole number of at least 1, got 'x'"),
        ("classes:0", "got '0'"),
        ("classes:1.5", "got '1.5'"),
        ("classes", "needs a value"),
        ("classes:", "needs a value"),
        ("shards:0", "shards needs a whole number"),
        ("dirichlet:-1", "positive concentration alpha, got '-1'"),
        ("dirichlet:abc", "got 'abc'"),
        ("dirichlet:0", "got '0'"),
        ("dirichlet:nan", "got 'nan'"),
        ("dirichlet:inf", "got 'inf'"),
        ("iid:3", "takes no value"),
        ("domains:-2", "got '-2'"),
    ],
)
def test_malformed_specs_are_one_line_errors(spec, message):
    with pytest.raises(PartitionError, match=message) as caught:
        parse_partition_spec(spec)
    assert "\n" not in str(caught.value)
    with pytest.raises(PartitionError):
        partition(balanced_labels(), 4, spec)


def test_partition_names():
    assert PARTITIONS == (
        "iid",
        "classes",
        "dirichlet",
        "shards",
        "domains",
        "domain-dirichlet",
        "concentrated",
        "gsc",
    )


# ---------------------------------------------------------------------------- shared checks


@pytest.mark.parametrize(
    "clients, message",
    [
        (0, "at least 1, got 0"),
        (-3, "at least 1"),
        (501, "501 clients but only 500 samples"),
        (2.5, "whole number"),
        (True, "whole number"),
    ],
)
def test_bad_client_counts(clients, message):
    with pytest.raises(PartitionError, match=message):
        partition(balanced_labels(), clients, "iid")


def test_labels_must_be_one_dimensional():
    with pytest.raises(PartitionError, match="1-D"):
        partition(np.zeros((4, 2), dtype=int), 2, "iid")


@pytest.mark.parametrize("spec", ["iid", "classes:2", "dirichlet:0.3", "shards:2"])
def test_deterministic_for_a_seed_and_different_across_seeds(spec):
    labels = balanced_labels()
    first = partition(labels, 10, spec, seed=7)
    again = partition(labels, 10, spec, seed=7)
    other = partition(labels, 10, spec, seed=8)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other))


@pytest.mark.parametrize(
    "spec",
    ["iid", "classes:1", "classes:3", "dirichlet:0.1", "dirichlet:100", "shards:1", "shards:5"],
)
def test_every_sample_held_exactly_once(spec):
    labels = balanced_labels(per_class=37)
    parts = partition(labels, 10, spec, seed=1)
    assert len(parts) == 10
    assert_exact_cover(parts, len(labels))
    assert len(unassigned(len(labels), parts)) == 0


# ---------------------------------------------------------------------------- iid


def test_iid_sizes_differ_by_at_most_one():
    sizes = [len(p) for p in partition(np.zeros(5, dtype=int), 2, "iid", seed=3)]
    assert sizes == [3, 2]
    sizes = [len(p) for p in partition(balanced_labels(), 7, "iid")]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 500


# ---------------------------------------------------------------------------- classes:k


def test_classes_tiny_hand_case():
    labels = np.array([0, 0, 1, 1, 1])
    # one label each: client i holds label i, whatever the seed
    for seed in range(5):
        parts = partition(labels, 2, "classes:1", seed=seed)
        assert [p.tolist() for p in parts] == [[0, 1], [2, 3, 4]]
    # both clients hold both labels: each label's samples are split 2/2 and 2/1
    parts = partition(np.array([0, 1, 0, 1, 0, 1, 0]), 2, "classes:2", seed=0)
    assert_exact_cover(parts, 7)
    counts = [np.bincount(np.array([0, 1, 0, 1, 0, 1, 0])[p], minlength=2).tolist() for p in parts]
    assert counts == [[2, 2], [2, 1]]


@pytest.mark.parametrize("k", [1, 2, 3, 10])
def test_classes_each_client_holds_exactly_k_labels_split_equally(k):
    labels = balanced_labels(per_class=61)
    parts = partition(labels, 12, f"classes:{k}", seed=4)
    holders: dict[int, list[int]] = {}
    for client, part in enumerate(parts):
        held = np.unique(labels[part])
        assert len(held) == k
        assert client % 10 in held  # client i holds label i mod K
        for label in held:
            holders.setdefault(int(label), []).append(int(np.sum(labels[part] == label)))
    for label, shares in holders.items():
        assert max(shares) - min(shares) <= 1, f"label {label} split unequally: {shares}"
        assert sum(shares) == 61
    assert_exact_cover(parts, len(labels))  # 12 clients >= 10 labels: every label is held


def test_classes_drops_labels_no_client_holds():
    labels = balanced_labels(per_class=20)
    parts = partition(labels, 3, "classes:1", seed=0)
    assert [np.unique(labels[p]).tolist() for p in parts] == [[0], [1], [2]]
    dropped = unassigned(len(labels), parts)
    assert len(dropped) == 7 * 20
    assert set(labels[dropped].tolist()) == set(range(3, 10))
    assert_disjoint(parts)


def test_classes_k_larger_than_labels():
    with pytest.raises(
        PartitionError,
        match="classes:11 asks for 11 labels per client but the "
        "data has only 10; use classes:K with K <= 10",
    ):
        partition(balanced_labels(), 5, "classes:11")


def test_classes_uses_the_distinct_labels_present():
    labels = np.array([3, 3, 7, 7, 9, 9])  # labels need not be 0..K-1
    parts = partition(labels, 3, "classes:1", seed=0)
    assert [labels[p].tolist() for p in parts] == [[3, 3], [7, 7], [9, 9]]


# ---------------------------------------------------------------------------- dirichlet


@pytest.mark.parametrize("alpha", [0.05, 0.5, 5.0])
def test_dirichlet_respects_the_minimum_size(alpha):
    labels = balanced_labels(per_class=100)
    parts = partition(labels, 10, f"dirichlet:{alpha}", seed=2, min_size=20)
    assert min(len(p) for p in parts) >= 20
    assert_exact_cover(parts, len(labels))


def test_dirichlet_default_minimum_works_for_small_data():
    labels = balanced_labels(per_class=6)  # 60 samples, 10 clients: minimum min(10, 3) = 3
    parts = partition(labels, 10, "dirichlet:0.5", seed=0)
    assert min(len(p) for p in parts) >= 3
    assert_exact_cover(parts, 60)


def test_dirichlet_skew_grows_as_alpha_shrinks():
    labels = balanced_labels(per_class=200)

    def labels_per_client(alpha: float) -> float:
        parts = partition(labels, 10, f"dirichlet:{alpha}", seed=0, min_size=1)
        return np.mean(
            [np.sum(np.bincount(labels[p], minlength=10) > 0.05 * len(p)) for p in parts]
        )

    assert labels_per_client(0.05) < labels_per_client(1.0) < labels_per_client(1000.0) + 1e-9
    sizes = [len(p) for p in partition(labels, 10, "dirichlet:1000", seed=0)]
    assert max(sizes) - min(sizes) < 0.25 * 200


def test_dirichlet_one_client_gets_everything():
    assert partition(np.array([1, 0, 1]), 1, "dirichlet:0.5")[0].tolist() == [0, 1, 2]


def test_dirichlet_gives_up_after_the_retry_cap():
    labels = np.repeat([0, 1], 50)  # 2 labels, 20 clients, tiny alpha: a few clients get all
    message = (
        f"could not draw a Dirichlet partition with at least 5 samples per client after "
        f"{MAX_DIRICHLET_TRIES} tries; use fewer clients or a larger alpha"
    )
    with pytest.raises(PartitionError, match=message):
        partition(labels, 20, "dirichlet:0.01", min_size=5)


@pytest.mark.parametrize("clients", [2, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dirichlet_accepts_a_draw_that_meets_the_minimum_exactly(clients, seed):
    # min_size * clients == N: the only acceptable partition gives every client exactly
    # N / n = 10 samples. Such a draw exists (alpha = 1000 puts every share near 1/n) and
    # must be accepted; a check "more than min_size" could never be met and would give up.
    labels = np.zeros(10 * clients, dtype=np.int64)
    parts = partition(labels, clients, "dirichlet:1000", seed=seed, min_size=10)
    assert [len(p) for p in parts] == [10] * clients
    assert_exact_cover(parts, 10 * clients)


@pytest.mark.parametrize("alpha", [0.01, 0.05])
@pytest.mark.parametrize("seed", range(4))
def test_dirichlet_clients_at_their_fair_share_take_no_more(alpha, seed):
    # 20 labels of 10 samples, 10 clients: fair share N/n = 20. A client receives a label
    # only while it holds fewer than 20 samples (at most 19), and one label adds at most
    # its 10 samples, so no client can exceed 19 + 10 = 29. Tiny alpha gives each label
    # almost wholly to one client: without the cap some client collects 4+ labels (40+).
    labels = np.repeat(np.arange(20), 10)
    parts = partition(labels, 10, f"dirichlet:{alpha}", seed=seed, min_size=1)
    assert max(len(p) for p in parts) <= 29, sorted(len(p) for p in parts)
    assert min(len(p) for p in parts) >= 1
    assert_exact_cover(parts, 200)


def test_dirichlet_minimum_larger_than_the_data():
    with pytest.raises(PartitionError, match="needs 110 samples but there are 100"):
        partition(np.repeat([0, 1], 50), 11, "dirichlet:1", min_size=10)


# ---------------------------------------------------------------------------- shards


def test_shards_hand_case_one_label_per_client():
    labels = np.repeat(np.arange(4), 5)  # 4 labels of 5: 4 clients x 1 shard = one label each
    parts = partition(labels, 4, "shards:1", seed=3)
    assert sorted(np.unique(labels[p]).tolist() for p in parts) == [[0], [1], [2], [3]]
    assert_exact_cover(parts, 20)


def test_shards_give_each_client_s_shards():
    labels = balanced_labels(per_class=30)  # 300 samples, 10 clients x 3 shards of 10
    parts = partition(labels, 10, "shards:3", seed=0)
    assert [len(p) for p in parts] == [30] * 10
    assert all(len(np.unique(labels[p])) <= 3 for p in parts)
    assert_exact_cover(parts, 300)


def test_too_many_shards():
    with pytest.raises(PartitionError, match="needs 60 shards but there are only 50 samples"):
        partition(balanced_labels(per_class=5), 20, "shards:3")


# ---------------------------------------------------------------------------- domains


def test_domains_each_client_holds_exactly_d_domains():
    labels = balanced_labels(per_class=40)
    domains = np.arange(len(labels)) % 4
    parts = partition(labels, 6, "domains:2", seed=0, domains=domains)
    for client, part in enumerate(parts):
        held = np.unique(domains[part])
        assert len(held) == 2 and client % 4 in held
    assert_exact_cover(parts, len(labels))


def test_domains_without_domains_or_with_too_few():
    with pytest.raises(PartitionError, match="needs per-sample domains and this dataset has none"):
        partition(balanced_labels(), 4, "domains:1")
    domains = np.arange(500) % 3
    with pytest.raises(
        PartitionError, match="domains:4 asks for 4 domains per client but the data has only 3"
    ):
        partition(balanced_labels(), 4, "domains:4", domains=domains)
    with pytest.raises(PartitionError, match="one domain id per training sample"):
        partition(balanced_labels(), 4, "domains:1", domains=domains[:10])


@pytest.mark.data
def test_niid_bench_sizes_on_real_mnist_10k_labels(shared_data_dir):
    """Sanity numbers on the real labels: every client of classes:2 holds exactly 2 digits."""
    from stratify.data.datasets import load_dataset

    labels = load_dataset("mnist-10k", data_dir=shared_data_dir).train_labels
    parts = partition(labels, 10, "classes:2", seed=0)
    assert all(len(np.unique(labels[p])) == 2 for p in parts)
    assert_exact_cover(parts, 8000)
    parts = partition(labels, 10, "dirichlet:0.5", seed=0)
    assert min(len(p) for p in parts) >= 10
    assert_exact_cover(parts, 8000)


# -- feature skew: partitions over domains ---------------------------------------------------


def domain_data(seed=0, n=400, num_domains=4):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 10, size=n), rng.integers(0, num_domains, size=n)


def test_domain_dirichlet_is_the_dirichlet_split_over_domain_ids():
    labels, domains = domain_data()
    ours = partition(labels, 5, "domain-dirichlet:0.5", seed=3, domains=domains)
    reference = partition(domains, 5, "dirichlet:0.5", seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(ours, reference))
    assert sorted(np.concatenate(ours).tolist()) == list(range(len(labels)))
    # the split follows the domains, not the labels: some client's domain mix is skewed
    mixes = np.stack([np.bincount(domains[part], minlength=4) / len(part) for part in ours])
    assert mixes.max() > 0.5


def test_concentrated_puts_one_domain_on_client_0():
    labels, domains = domain_data()
    parts = partition(labels, 4, "concentrated:2", seed=1, domains=domains)
    assert np.array_equal(parts[0], np.flatnonzero(domains == 2))
    rest = parts[1:]
    assert all(not np.any(domains[part] == 2) for part in rest)
    sizes = [len(part) for part in rest]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == np.sum(domains != 2)
    with pytest.raises(PartitionError, match="no sample has domain 7"):
        partition(labels, 4, "concentrated:7", domains=domains)
    with pytest.raises(PartitionError, match="at least 2 clients"):
        partition(labels, 1, "concentrated:2", domains=domains)
    with pytest.raises(PartitionError, match="needs per-sample domains"):
        partition(labels, 4, "domain-dirichlet:0.5")


@pytest.mark.parametrize(
    "spec, message",
    [
        ("concentrated:x", "needs a domain id"),
        ("concentrated:-1", "needs a domain id"),
        ("domain-dirichlet:0", "positive concentration"),
    ],
)
def test_bad_domain_specs(spec, message):
    with pytest.raises(PartitionError, match=message):
        parse_partition_spec(spec)
