"""Planning that scales with clients: the same plans as the direct scan over every client.

``ScanPools`` and ``scan_select`` below are the straightforward implementation the
per-label candidate lists replaced: every draw scans all clients and masks the empty
pools. Plans built both ways must be identical for the same seed, in every mode.
"""

import numpy as np
import pytest

from stratify.federation import Federation, SamplePools
from stratify.registry import PlainRegistry
from stratify.schedule import label_repeats, stratified_label_schedule
from stratify.selection import ClientSelector, plan_global_batches, plan_single_sample


class ScanPools:
    """Pools as lists of arrays per client and placeholder; empty pools included."""

    def __init__(self, federation, sample_placeholders, num_placeholders, rng, refill=False):
        self.rng = rng
        self.allow_refill = refill
        self.pools = []
        self.remaining = np.zeros((federation.num_clients, num_placeholders), dtype=np.int64)
        self.passes = np.zeros(num_placeholders, dtype=np.int64)
        self.reused = 0
        for client, indices in enumerate(federation.client_indices):
            of_client = sample_placeholders[indices]
            row = []
            for placeholder in range(num_placeholders):
                pool = indices[of_client == placeholder]
                row.append(rng.permutation(pool))
                self.remaining[client, placeholder] = len(pool)
            self.pools.append(row)

    def remaining_of(self, client, placeholder):
        return self.remaining[client, placeholder]

    def take(self, client, placeholder):
        left = self.remaining[client, placeholder]
        pool = self.pools[client][placeholder]
        self.remaining[client, placeholder] = left - 1
        if self.passes[placeholder] > 0:
            self.reused += 1
        return int(pool[len(pool) - left])

    def refill(self, placeholder):
        if not self.allow_refill or self.remaining[:, placeholder].any():
            return False
        sizes = np.array([len(row[placeholder]) for row in self.pools])
        if not sizes.any():
            return False
        for row in self.pools:
            row[placeholder] = self.rng.permutation(row[placeholder])
        self.remaining[:, placeholder] = sizes
        self.passes[placeholder] += 1
        return True


class ScanSelector:
    """Selection over every client, the empty pools masked out."""

    def __init__(self, placeholder_counts, global_counts, mode):
        self.mode = mode
        totals = np.maximum(np.asarray(global_counts, dtype=np.float64), 1.0)
        self.weights = placeholder_counts / totals[None, :]

    def select(self, pools, placeholder, rng):
        available = pools.remaining[:, placeholder] > 0
        if self.mode == "uniform":
            candidates = np.flatnonzero(available)
            if len(candidates) == 0:
                return -1
            return int(candidates[rng.integers(len(candidates))])
        weights = np.where(available, self.weights[:, placeholder], 0.0)
        cumulative = np.cumsum(weights)
        if cumulative[-1] <= 0:
            return -1
        return int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))


def skewed_federation(seed, num_clients, num_labels=6, num_samples=400):
    """Clients holding one or two labels each, unevenly: most (client, label) pairs empty."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_labels, size=num_samples)
    held = np.zeros((num_clients, num_labels), dtype=bool)
    for client in range(num_clients):
        held[client, rng.choice(num_labels, size=rng.integers(1, 3), replace=False)] = True
    owners = np.empty(num_samples, dtype=np.int64)
    for label in range(num_labels):
        holders = np.flatnonzero(held[:, label])
        if len(holders) == 0:
            holders = np.arange(num_clients)
        members = np.flatnonzero(labels == label)
        owners[members] = holders[rng.integers(len(holders), size=len(members))]
    client_indices = [rng.permutation(np.flatnonzero(owners == k)) for k in range(num_clients)]
    client_indices = [ix for ix in client_indices if len(ix)]
    federation = Federation(client_indices, labels)
    registry = PlainRegistry(seed=seed).register(federation.label_counts())
    return federation, registry


def plan_both_ways(seed, num_clients, selection, refill, planner, size, repeats):
    federation, registry = skewed_federation(seed, num_clients)
    placeholders = federation.sample_placeholders(registry)
    counts = federation.placeholder_counts(registry)
    plans = []
    for pools_class, selector_class in ((SamplePools, ClientSelector), (ScanPools, ScanSelector)):
        rng = np.random.default_rng([seed, 7])
        schedule = stratified_label_schedule(
            label_repeats(registry.global_counts, 400, repeats), rng
        )
        pools = pools_class(federation, placeholders, registry.num_placeholders, rng, refill)
        selector = selector_class(counts, registry.global_counts, selection)
        if planner == "single-sample":
            plans.append(plan_single_sample(schedule, pools, selector, size, rng))
        else:
            plans.append(plan_global_batches(schedule, pools, selector, size, rng))
        plans[-1] = (plans[-1], rng.integers(1 << 62))  # the generator's state after planning
    return plans


@pytest.mark.parametrize("selection", ["uniform", "weighted"])
@pytest.mark.parametrize("refill", [True, False])
@pytest.mark.parametrize(
    "planner, size",
    [
        ("single-sample", 1),
        ("single-sample", 4),
        ("single-sample", 50),
        ("batch", 1),
        ("batch", 16),
    ],
)
@pytest.mark.parametrize("repeats", ["uniform", "proportional"])
def test_candidate_lists_plan_exactly_as_the_scan_over_every_client(
    selection, refill, planner, size, repeats
):
    for seed in range(2):
        (ours, our_state), (scan, scan_state) = plan_both_ways(
            seed, 30, selection, refill, planner, size, repeats
        )
        assert np.array_equal(ours.samples, scan.samples)
        assert np.array_equal(ours.clients, scan.clients)
        if planner == "batch":
            assert np.array_equal(ours.batch_starts, scan.batch_starts)
        assert (ours.skipped, ours.reused) == (scan.skipped, scan.reused)
        assert our_state == scan_state  # both drew the same numbers from the generator


def test_federation_tables_equal_the_per_client_computation():
    federation, registry = skewed_federation(5, 30)
    expected_counts = []
    for indices in federation.client_indices:
        values, freq = np.unique(federation.labels[indices], return_counts=True)
        expected_counts.append({int(v): int(c) for v, c in zip(values, freq)})
    assert federation.label_counts() == expected_counts
    assert [list(c) for c in federation.label_counts()] == [list(c) for c in expected_counts]
    matrix = np.zeros((federation.num_clients, registry.num_placeholders), dtype=np.int64)
    placeholders = np.full(len(federation.labels), -1)
    owners = np.full(len(federation.labels), -1)
    for client, indices in enumerate(federation.client_indices):
        for label, count in expected_counts[client].items():
            matrix[client, registry.client_maps[client][label]] = count
        for index in indices:
            placeholders[index] = registry.client_maps[client][int(federation.labels[index])]
            owners[index] = client
    assert np.array_equal(federation.placeholder_counts(registry), matrix)
    assert np.array_equal(federation.sample_placeholders(registry), placeholders)
    assert np.array_equal(federation.sample_clients(), owners)


def test_available_lists_follow_the_pools():
    federation, registry = skewed_federation(2, 12)
    rng = np.random.default_rng(0)
    placeholders = federation.sample_placeholders(registry)
    pools = SamplePools(federation, placeholders, registry.num_placeholders, rng, refill=True)
    for placeholder in range(registry.num_placeholders):
        held = np.flatnonzero(pools.remaining[:, placeholder])
        assert pools.available[placeholder] == held.tolist()
        # empty the first holder: it leaves the list, the others stay in order
        first = int(held[0])
        while pools.remaining[first, placeholder]:
            pools.take(first, placeholder)
        assert pools.available[placeholder] == held[1:].tolist()
        with pytest.raises(IndexError):
            pools.take(first, placeholder)
