"""SLS, sample pools, label-aware selection and plans on hand-checkable cases."""

import numpy as np
import pytest

from stratify.errors import ConfigError
from stratify.federation import Federation, SamplePools
from stratify.registry import PlainRegistry
from stratify.schedule import label_repeats, stratified_label_schedule
from stratify.selection import ClientSelector, Plan, plan_global_batches, plan_single_sample


def make_federation(labels, client_indices, seed=0):
    federation = Federation([np.asarray(ix) for ix in client_indices], np.asarray(labels))
    registry = PlainRegistry(seed=seed).register(federation.label_counts())
    return federation, registry


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


def random_federation(rng, num_samples=600, num_clients=6, num_labels=5):
    labels = rng.integers(0, num_labels, size=num_samples)
    owners = rng.integers(0, num_clients, size=num_samples)
    client_indices = [np.flatnonzero(owners == k) for k in range(num_clients)]
    return make_federation(labels, client_indices)


@pytest.mark.parametrize("chunk", [1, 5, 50])
@pytest.mark.parametrize("selection", ["uniform", "weighted"])
def test_single_sample_plan_uses_each_sample_at_most_once(chunk, selection):
    rng = np.random.default_rng(3)
    federation, registry = random_federation(rng)
    placeholders = federation.sample_placeholders(registry)
    owners = federation.sample_clients()
    repeats = label_repeats(registry.global_counts, 600, "uniform", repeats=150)
    schedule = stratified_label_schedule(repeats, rng)
    pools = SamplePools(federation, placeholders, registry.num_placeholders, rng)
    selector = ClientSelector(
        federation.placeholder_counts(registry), registry.global_counts, selection
    )
    plan = plan_single_sample(schedule, pools, selector, chunk, rng)
    assert len(np.unique(plan.samples)) == len(plan.samples)
    assert np.array_equal(owners[plan.samples], plan.clients)
    # executed entries keep the schedule's order: drop the skipped ones and compare
    assert len(plan.samples) + plan.skipped == len(schedule)
    executed_labels = placeholders[plan.samples]
    expected = []
    remaining = registry.global_counts.copy()
    for placeholder in schedule:
        if remaining[placeholder] > 0:
            remaining[placeholder] -= 1
            expected.append(placeholder)
    assert executed_labels.tolist() == expected


def test_skipped_entries_when_every_pool_is_empty():
    federation, registry = make_federation([0, 0, 1], [[0, 1], [2]])
    placeholders = federation.sample_placeholders(registry)
    zero = registry.client_maps[0][0]
    one = registry.client_maps[1][1]
    schedule = np.array([zero, zero, zero, one, one])
    rng = np.random.default_rng(0)
    pools = SamplePools(federation, placeholders, 2, rng)
    selector = ClientSelector(federation.placeholder_counts(registry), registry.global_counts)
    plan = plan_single_sample(schedule, pools, selector, chunk=1, rng=rng)
    assert plan.skipped == 2
    assert sorted(plan.samples.tolist()) == [0, 1, 2]


def test_chunk_keeps_model_with_client_while_it_has_the_label():
    # client 0 holds labels a and b, client 1 holds only a: with one chunk covering the
    # schedule the model must never leave client 0 once it gets there.
    labels = [0] * 4 + [1] * 4 + [0] * 4
    federation, registry = make_federation(labels, [range(8), range(8, 12)])
    placeholders = federation.sample_placeholders(registry)
    a, b = registry.client_maps[0][0], registry.client_maps[0][1]
    schedule = np.array([b, a, b, a, b, a, b, a])
    rng = np.random.default_rng(0)
    pools = SamplePools(federation, placeholders, 2, rng)
    selector = ClientSelector(federation.placeholder_counts(registry), registry.global_counts)
    plan = plan_single_sample(schedule, pools, selector, chunk=8, rng=rng)
    assert plan.clients.tolist() == [0] * 8
    assert plan.transfers == 1


def test_transfers_count_changes_of_holder():
    plan = Plan(np.arange(6), np.array([2, 2, 0, 0, 2, 1]), None, 0)
    assert plan.transfers == 4
    batches = Plan(np.arange(6), np.array([0, 1, 1, 0, 0, 2]), np.array([0, 3, 6]), 0)
    assert batches.transfers == 2 + 2
    assert batches.steps == 2


def test_weighted_selection_follows_client_share():
    federation, registry = make_federation([0] * 40, [range(30), range(30, 40)])
    placeholders = federation.sample_placeholders(registry)
    selector = ClientSelector(
        federation.placeholder_counts(registry), registry.global_counts, "weighted"
    )
    rng = np.random.default_rng(1)
    pools = SamplePools(federation, placeholders, 1, rng)
    draws = np.array([selector.select(pools, 0, rng) for _ in range(4000)])
    assert abs(np.mean(draws == 0) - 0.75) < 0.03
    uniform = ClientSelector(federation.placeholder_counts(registry), registry.global_counts)
    draws = np.array([uniform.select(pools, 0, rng) for _ in range(4000)])
    assert abs(np.mean(draws == 0) - 0.5) < 0.03


def test_global_batches_group_clients_and_hold_b_entries():
    rng = np.random.default_rng(5)
    federation, registry = random_federation(rng)
    placeholders = federation.sample_placeholders(registry)
    owners = federation.sample_clients()
    schedule = stratified_label_schedule(label_repeats(registry.global_counts, 600, "uniform"), rng)
    pools = SamplePools(federation, placeholders, registry.num_placeholders, rng)
    selector = ClientSelector(federation.placeholder_counts(registry), registry.global_counts)
    plan = plan_global_batches(schedule, pools, selector, batch_labels=32, rng=rng)
    sizes = np.diff(plan.batch_starts)
    assert sizes.sum() == len(plan.samples) == len(schedule) - plan.skipped
    assert (sizes <= 32).all()
    assert len(np.unique(plan.samples)) == len(plan.samples)
    assert np.array_equal(owners[plan.samples], plan.clients)
    for start, stop in zip(plan.batch_starts[:-1], plan.batch_starts[1:]):
        assert (np.diff(plan.clients[start:stop]) >= 0).all()


def test_non_positive_chunk_and_batch_rejected():
    federation, registry = make_federation([0, 1], [[0], [1]])
    rng = np.random.default_rng(0)
    pools = SamplePools(federation, federation.sample_placeholders(registry), 2, rng)
    selector = ClientSelector(federation.placeholder_counts(registry), registry.global_counts)
    with pytest.raises(ConfigError):
        plan_single_sample(np.array([0]), pools, selector, chunk=0, rng=rng)
    with pytest.raises(ConfigError):
        plan_global_batches(np.array([0]), pools, selector, batch_labels=-1, rng=rng)
