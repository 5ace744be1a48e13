"""Sample pools, the label-aware router (selection) and plans on hand-checkable cases."""

import numpy as np
import pytest

from stratify.errors import ConfigError
from stratify.federation import Federation, SamplePools
from stratify.registry import PlainRegistry
from stratify.schedule import label_repeats, stratified_label_schedule
from stratify.selection import (
    ClientSelector,
    Plan,
    chain_transfers,
    plan_global_batches,
    plan_single_sample,
    select_or_refill,
)


def make_federation(labels, client_indices, seed=0):
    federation = Federation([np.asarray(ix) for ix in client_indices], np.asarray(labels))
    registry = PlainRegistry(seed=seed).register(federation.label_counts())
    return federation, registry


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
    assert plan.holders == 1


def test_transfers_count_changes_of_holder():
    plan = Plan("single-sample", np.arange(6), np.array([2, 2, 0, 0, 2, 1]), 0)
    assert plan.holders == 4  # arrivals at 2, 0, 2, 1
    # server -> 2 -> 0 -> 2 -> 1 -> server: 1 + 3 relays of 2 + 1, or 1 + 3 direct + 1
    assert plan.model_transfers("server") == 8
    assert plan.model_transfers("direct") == 5
    batches = Plan(
        "batch", np.arange(6), np.array([0, 1, 1, 0, 0, 2]), 0, batch_starts=np.array([0, 3, 6])
    )
    assert batches.holders == batches.model_transfers() == 2 + 2
    assert batches.steps == 2


def test_chain_transfers_by_hand():
    assert [chain_transfers(n, "server") for n in range(4)] == [0, 2, 4, 6]
    assert [chain_transfers(n, "direct") for n in range(4)] == [0, 2, 3, 4]
    with pytest.raises(ConfigError, match="--hops"):
        chain_transfers(2, "carrier pigeon")


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


# ------------------------------------------------------------- hand-worked reference cases


class ZeroDraws:
    """A generator whose every draw is 0: the uniform selector then takes the first
    candidate and the weighted one the first client with positive weight, so both pick
    the lowest-index client that still has a sample of the label. Counts its draws."""

    def __init__(self):
        self.draws = 0

    def integers(self, high):
        self.draws += 1
        return 0

    def random(self):
        self.draws += 1
        return 0.0


# Three clients, labels a = 0 and b = 1 (used directly as placeholders):
#   client 0: a x 5          (samples 0-4)
#   client 1: a x 2, b x 4   (samples 5-6, 7-10)
#   client 2: b x 5          (samples 11-15)
# Schedule  b a b a b a a b b; every draw is 0, so a selection takes the lowest-index
# client with the label left. Worked by hand, position by position:
#   CS=1: every entry selects:                      1 0 1 0 1 0 0 1 2  (p8: client 1 out of b)
#   CS=2: chunks start at 0,2,4,6,8                 1 1 1 1 1 0 0 1 2  (p5: client 1 out of a)
#   CS=3: chunks start at 0,3,6; p3 and p6 are a,   1 1 1 0 1 1 0 1 2
#         re-selected to client 0 although client 1 still holds an a
#   CS=9: one chunk, re-selection only on an empty pool: 1 1 1 1 1 0 0 1 2
HAND_LABELS = [0] * 5 + [0] * 2 + [1] * 4 + [1] * 5
HAND_CLIENTS = [range(0, 5), range(5, 11), range(11, 16)]
HAND_SCHEDULE = [1, 0, 1, 0, 1, 0, 0, 1, 1]


@pytest.mark.parametrize("selection", ["uniform", "weighted"])
@pytest.mark.parametrize(
    "chunk, clients, holders, selections",
    [
        (1, [1, 0, 1, 0, 1, 0, 0, 1, 2], 8, 9),
        (2, [1, 1, 1, 1, 1, 0, 0, 1, 2], 4, 7),  # starts 0,2,4,6,8 + p5, p7 on empty/absent
        (3, [1, 1, 1, 0, 1, 1, 0, 1, 2], 6, 6),  # starts 0,3,6 + p4, p7 absent, p8 empty
        (9, [1, 1, 1, 1, 1, 0, 0, 1, 2], 4, 4),  # p0 + p5, p7, p8
    ],
)
def test_single_sample_plan_reselects_at_every_chunk_start(
    chunk, clients, holders, selections, selection
):
    labels = np.asarray(HAND_LABELS)
    federation = Federation([np.asarray(ix) for ix in HAND_CLIENTS], labels)
    pools = SamplePools(federation, labels, 2, np.random.default_rng(0))
    counts = np.array([[5, 0], [2, 4], [0, 5]])
    selector = ClientSelector(counts, counts.sum(0), selection)
    draws = ZeroDraws()
    plan = plan_single_sample(np.asarray(HAND_SCHEDULE), pools, selector, chunk, draws)
    assert plan.clients.tolist() == clients
    assert plan.holders == holders
    assert draws.draws == selections
    assert plan.skipped == 0
    # every sample is drawn from the client the plan names, with the scheduled label
    assert federation.sample_clients()[plan.samples].tolist() == clients
    assert labels[plan.samples].tolist() == HAND_SCHEDULE


def chi_square_bound(df, false_alarm):
    """Upper ``false_alarm`` quantile of the chi-square law, exact for 1 and 2 degrees of
    freedom: chi2(1) is the square of a standard normal, chi2(2) is exponential with mean 2.
    (No scipy needed; cross-checked against scipy.stats.chi2.isf: 23.93 and 27.63.)"""
    from statistics import NormalDist

    if df == 1:
        return NormalDist().inv_cdf(1 - false_alarm / 2) ** 2
    if df == 2:
        return -2 * np.log(false_alarm)
    raise ValueError(df)


def chi_square(observed, probabilities):
    expected = observed.sum() * np.asarray(probabilities)
    return float(np.sum((observed - expected) ** 2 / expected))


def test_weighted_selection_matches_the_share_of_each_client_goodness_of_fit():
    # one label held 1 / 9 / 90 times: selection probabilities exactly 0.01, 0.09, 0.90.
    # (Add-one smoothing, (n_kl + 1) / (n_l + K), would give 2/103, 10/103, 91/103: with
    # 20000 draws a chi-square of about 190, against a bound of 27.6 at p = 1e-6.)
    labels = np.zeros(100, dtype=np.int64)
    federation = Federation([range(0, 1), range(1, 10), range(10, 100)], labels)
    counts = np.array([[1], [9], [90]])
    selector = ClientSelector(counts, np.array([100]), "weighted")
    rng = np.random.default_rng(12)
    pools = SamplePools(federation, labels, 1, rng)
    draws = np.array([selector.select(pools, 0, rng) for _ in range(20000)])
    observed = np.bincount(draws, minlength=3)
    assert chi_square(observed, [0.01, 0.09, 0.90]) < chi_square_bound(2, 1e-6), observed
    # client 2 runs out: the probabilities renormalise over the others, 1/10 and 9/10
    # (smoothed: 2/12 and 10/12, a chi-square of about 500 against 23.9)
    for _ in range(90):
        pools.take(2, 0)
    draws = np.array([selector.select(pools, 0, rng) for _ in range(5000)])
    observed = np.bincount(draws, minlength=3)
    assert observed[2] == 0
    assert chi_square(observed[:2], [0.1, 0.9]) < chi_square_bound(1, 1e-6), observed


# -- exhausted labels: refill or skip --------------------------------------------------------


def imbalanced_pools(rng, refill):
    # label 0: samples 0-2 at client 0 and 3-4 at client 1 (5 in all); label 1: 20 samples
    labels = [0] * 5 + [1] * 20
    federation, registry = make_federation(
        labels, [[0, 1, 2, *range(5, 15)], [3, 4, *range(15, 25)]]
    )
    pools = SamplePools(
        federation,
        federation.sample_placeholders(registry),
        registry.num_placeholders,
        rng,
        refill=refill,
    )
    placeholder_of_label_0 = int(federation.sample_placeholders(registry)[0])
    return federation, registry, pools, placeholder_of_label_0


def test_refill_passes_use_every_sample_once_per_pass():
    rng = np.random.default_rng(0)
    federation, registry, pools, zero = imbalanced_pools(rng, refill=True)
    selector = ClientSelector(
        federation.placeholder_counts(registry), registry.global_counts, "uniform"
    )
    drawn = []
    for _ in range(13):
        client = select_or_refill(selector, pools, zero, rng)
        assert client >= 0
        drawn.append(pools.take(client, zero))
    # passes of 5: each holds every sample of label 0 exactly once
    for start in (0, 5):
        assert sorted(drawn[start : start + 5]) == [0, 1, 2, 3, 4]
    assert len(set(drawn[10:])) == 3 and set(drawn[10:]) <= {0, 1, 2, 3, 4}
    assert pools.reused == 8 and pools.passes[zero] == 2


@pytest.mark.parametrize("planner", ["single-sample", "batch"])
def test_refill_keeps_every_label_at_its_repeats(planner):
    # uniform repeats: round(25 / 2) = 12 entries per label, but label 0 has 5 samples
    for refill, skipped, reused in ((True, 0, 7), (False, 7, 0)):
        rng = np.random.default_rng(4)
        federation, registry, pools, zero = imbalanced_pools(rng, refill)
        repeats = label_repeats(registry.global_counts, 25, mode="uniform")
        assert repeats.tolist() == [12, 12]
        schedule = stratified_label_schedule(repeats, rng)
        selector = ClientSelector(
            federation.placeholder_counts(registry), registry.global_counts, "uniform"
        )
        if planner == "single-sample":
            plan = plan_single_sample(schedule, pools, selector, 3, rng)
        else:
            plan = plan_global_batches(schedule, pools, selector, 4, rng)
        labels = np.asarray([0] * 5 + [1] * 20)[plan.samples]
        assert (plan.skipped, plan.reused) == (skipped, reused)
        assert np.bincount(labels, minlength=2).tolist() == [12 - skipped, 12]
        if planner == "single-sample":
            label_0 = plan.samples[labels == 0].tolist()
            for start in range(0, len(label_0), 5):  # no sample twice within a pass
                assert len(set(label_0[start : start + 5])) == len(label_0[start : start + 5])


def test_a_trailing_global_batch_of_one_joins_the_previous_batch():
    from stratify.selection import merge_trailing_singleton

    plan = Plan(
        "batch",
        np.arange(7),
        np.array([0, 1, 1, 2, 0, 2, 1]),
        0,
        batch_starts=np.array([0, 3, 6, 7]),
    )
    merged = merge_trailing_singleton(plan)
    assert merged.batch_starts.tolist() == [0, 3, 7] and merged.steps == 2
    assert np.array_equal(merged.samples, plan.samples)
    even = Plan(
        "batch", np.arange(6), np.zeros(6, dtype=np.int64), 0, batch_starts=np.array([0, 3, 6])
    )
    assert merge_trailing_singleton(even) is even
    single = Plan(
        "batch", np.arange(1), np.zeros(1, dtype=np.int64), 0, batch_starts=np.array([0, 1])
    )
    assert merge_trailing_singleton(single) is single
