"""Incremental label registration (``LabelRegistry.add_label``), the stream's entry point:
CKKS (naive and packed) gives exactly the plain registry's result, placeholders handed
out stay stable, and refused input leaves every registry unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from stratify.errors import RegistryError
from stratify.registry import PROTOCOLS, LabelRegistry, PlainRegistry, make_registry
from stratify.registry.ckks import CKKSRegistry, same_result
from stratify.registry.ckks.encoding import COUNT_LIMIT

# (client, label, count): client 1 joins with a label client 0 already holds, client 2
# with a new one; labels of several types, as a stream may bring them
ARRIVALS = [(0, 3, 1), (0, "cat", 2), (1, 3, 5), (1, 7, 1), (2, "dog", 4), (0, 7, 3)]


def registries(**kwargs) -> list[LabelRegistry]:
    """The plain registry, then a secure one per protocol."""
    return [
        PlainRegistry(seed=5),
        *(CKKSRegistry(seed=5, protocol=protocol, **kwargs) for protocol in PROTOCOLS),
    ]


def test_labels_added_one_by_one_get_placeholders_in_discovery_order_and_exact_counts():
    for registry in registries():
        placeholders = [registry.add_label(*arrival) for arrival in ARRIVALS]
        assert placeholders == [0, 1, 0, 2, 3, 2]
        result = registry.result
        assert result.num_placeholders == 4
        assert result.client_maps == [{3: 0, "cat": 1, 7: 2}, {3: 0, 7: 2}, {"dog": 3}]
        np.testing.assert_array_equal(result.global_counts, [6, 2, 4, 4])
        assert result.global_counts.dtype == np.int64


def test_secure_incremental_registration_equals_plain():
    plain, *secure = registries()
    for arrival in ARRIVALS:
        for registry in (plain, *secure):
            registry.add_label(*arrival)
        for registry in secure:
            assert same_result(plain.result, registry.result)


@pytest.mark.parametrize("index", range(1 + len(PROTOCOLS)))
def test_after_a_full_registration_old_placeholders_stay_and_a_new_label_gets_the_next(index):
    initial = [{0: 4, 1: 2}, {1: 3, 2: 1}]
    registry = registries()[index]
    before = registry.register(initial, num_classes=None)
    plain = PlainRegistry(seed=5, secrets=registry.secrets)  # the clients' same secrets
    plain.register(initial)
    assert same_result(before, plain.result)
    # client 1 starts holding label 0 (known), a new client 2 brings label 9 (new)
    assert registry.add_label(1, 0, 2) == before.client_maps[0][0]
    assert registry.add_label(2, 9, 6) == 3
    after = registry.result
    for client, mapping in enumerate(before.client_maps):
        for label, placeholder in mapping.items():
            assert after.client_maps[client][label] == placeholder
    assert after.client_maps[2] == {9: 3}
    expected = np.append(before.global_counts, 6)
    expected[before.client_maps[0][0]] += 2
    np.testing.assert_array_equal(after.global_counts, expected)
    plain.add_label(1, 0, 2)
    plain.add_label(2, 9, 6)
    assert same_result(after, plain.result)


@pytest.mark.parametrize("protocol", ["packed", "packed-blind"])
def test_packed_blocks_widen_when_more_labels_arrive_than_they_hold(protocol):
    plain, packed = PlainRegistry(seed=1), CKKSRegistry(seed=1, protocol=protocol)
    for label in range(20):  # the packed registration starts with blocks of 16 slots
        client = label % 3
        plain.add_label(client, label, label + 1)
        packed.add_label(client, label, label + 1)
    assert packed.stats.block_size == 32
    assert same_result(plain.result, packed.result)
    # labels known before the widening are still found in the new layout
    plain.add_label(2, 1)
    packed.add_label(2, 1)
    assert same_result(plain.result, packed.result)


def test_register_after_incremental_labels_starts_afresh():
    for registry in registries():
        registry.add_label(0, "x")
        result = registry.register([{"y": 2}])
        assert result.client_maps == [{"y": 0}] and result.num_placeholders == 1
        assert registry.add_label(0, "x") == 1


@pytest.mark.parametrize("index", range(1 + len(PROTOCOLS)))
@pytest.mark.parametrize(
    ("arrival", "message"),
    [
        ((5, 1, 1), "client 5 is out of range; clients 0..1 are registered and the next"),
        ((-1, 1, 1), "client -1 is out of range"),
        ((0, "a", 1), "client 0 has already registered label 'a'"),
        ((1, 2, 0), "client 1: count 0 for label 2 must be a positive integer"),
        ((1, 2, 1.5), "count 1.5"),
        (("0", 2, 1), "client '0' must be an integer index"),
    ],
)
def test_refused_registrations_leave_the_registry_unchanged(index, arrival, message):
    registry = registries()[index]
    registry.add_label(0, "a")
    registry.add_label(1, "b")
    before = registry.result
    with pytest.raises(RegistryError, match=message):
        registry.add_label(*arrival)
    assert registry.result is before


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_ckks_bound_collision_and_label_type_are_refused_without_a_trace(protocol):
    bounded = CKKSRegistry(seed=0, protocol=protocol, max_unique=2)
    bounded.add_label(0, "a")
    bounded.add_label(0, "b")
    before = bounded.result
    with pytest.raises(RegistryError, match=r"unique label number 3 \(new: 'c'\), more than"):
        bounded.add_label(1, "c")
    assert bounded.result is before
    assert bounded.add_label(1, "a") == 0  # a known label still maps after the refusal
    with pytest.raises(RegistryError, match="frozenset"):
        bounded.add_label(1, frozenset({1}))
    assert bounded.result.client_maps == [{"a": 0, "b": 1}, {"a": 0}]

    colliding = CKKSRegistry(
        seed=0, protocol=protocol, label_hash=lambda label: 5 if label in ("p", "q") else 9
    )
    colliding.add_label(0, "p")
    with pytest.raises(RegistryError, match="hash to the same code 5"):
        colliding.add_label(1, "q")
    assert colliding.result.client_maps == [{"p": 0}]
    assert colliding.add_label(1, "z") == 1


def test_make_registry_registries_all_take_labels_incrementally():
    for secure in (False, True):
        registry = make_registry(secure, seed=2)
        assert registry.add_label(0, 1) == 0 and registry.result.num_placeholders == 1


def test_deferred_counts_join_the_totals_at_the_flush_in_one_round_per_client():
    plain, *secure = registries()
    for registry in (plain, *secure):
        for arrival in ARRIVALS:
            registry.add_label(*arrival, defer_count=True)
        assert registry.result.num_placeholders == 4
        np.testing.assert_array_equal(registry.result.global_counts, [0, 0, 0, 0])
        assert registry.pending_total() == sum(count for _, _, count in ARRIVALS)
        before = registry.stats.encryptions if isinstance(registry, CKKSRegistry) else 0
        registry.flush_counts()
        np.testing.assert_array_equal(registry.result.global_counts, [6, 2, 4, 4])
        assert registry.pending_counts == {} and registry.pending_total() == 0
        if isinstance(registry, CKKSRegistry) and registry.layout == "packed":
            assert registry.stats.encryptions - before == 3  # one ciphertext per client
    for registry in secure:
        assert same_result(plain.result, registry.result)


def test_deferred_counts_count_against_the_secure_bound():
    registry = CKKSRegistry(seed=0, protocol="packed")
    registry.add_label(0, "a", COUNT_LIMIT - 1, defer_count=True)
    with pytest.raises(RegistryError, match="more than"):
        registry.add_label(0, "b", 2, defer_count=True)


@pytest.mark.parametrize("index", range(1 + len(PROTOCOLS)))
def test_a_clients_labels_added_together_get_what_one_by_one_gives(index):
    """add_labels is add_label for each label, in one comparison round where packed."""
    together, one_by_one = registries()[index], registries()[index]
    batches = [(0, [3, "cat"]), (1, [3, 7, "dog"]), (0, [7, "dog", 9]), (2, [9])]
    for client, labels in batches:
        secure = isinstance(together, CKKSRegistry) and together.stats is not None
        before = together.stats.decryptions if secure else 0
        placeholders = together.add_labels(client, labels, [1] * len(labels), defer_count=True)
        assert placeholders == [one_by_one.add_label(client, label, 1) for label in labels]
        if secure and together.layout == "packed" and client:
            assert together.stats.decryptions - before == 1  # one comparison for them all
        assert together.result.client_maps == one_by_one.result.client_maps
    together.flush_counts()
    assert same_result(together.result, one_by_one.result)


def test_labels_added_together_widen_packed_blocks_and_are_refused_whole():
    registry = CKKSRegistry(seed=0, protocol="packed", max_unique=6)
    registry.add_label(0, "a")
    registry._run.widen_blocks(2)  # a small block, so the batch below must widen it
    placeholders = registry.add_labels(1, ["a", "b", "c", "d"], [1] * 4)
    assert placeholders == [registry.result.client_maps[1][label] for label in "abcd"]
    assert placeholders[0] == registry.result.client_maps[0]["a"]
    assert sorted(placeholders) == [0, 1, 2, 3] and registry._run.block_size >= 4
    before = registry.result
    with pytest.raises(RegistryError, match="bound"):
        registry.add_labels(2, ["a", "e", "f", "g"], [1] * 4)
    assert registry.result is before
    with pytest.raises(RegistryError, match="distinct"):
        registry.add_labels(2, ["a", "a"], [1, 1])


@pytest.mark.parametrize("index", range(1 + len(PROTOCOLS)))
def test_labels_whose_index_the_client_knows_get_what_discovery_gives_and_no_decryption(index):
    """A fresh stream's clients know each label's index in ``U`` (its classifier row): a
    new label is appended, a known one recorded, nothing compared, nothing decrypted."""
    placed, discovered = registries()[index], registries()[index]
    secure = isinstance(placed, CKKSRegistry)
    rows: dict[object, int] = {}
    batches = [(0, [3, "cat"]), (1, [3]), (1, ["dog", "cat"]), (2, [9, 3, 8]), (0, [9])]
    for client, labels in batches:
        before = placed.stats.decryptions if secure and placed.stats else 0
        indices = [rows.setdefault(label, len(rows)) for label in labels]
        ones = [1] * len(labels)
        placeholders = placed.add_labels(client, labels, ones, defer_count=True, indices=indices)
        assert placeholders == discovered.add_labels(client, labels, ones, defer_count=True)
        assert placed.result.client_maps == discovered.result.client_maps
        if secure:
            assert placed.stats.decryptions == before
    placed.flush_counts()
    discovered.flush_counts()
    assert same_result(placed.result, discovered.result)
    if secure:
        assert placed.stats.decryptions < discovered.stats.decryptions


@pytest.mark.parametrize("index", range(1 + len(PROTOCOLS)))
def test_an_index_that_is_not_the_labels_is_refused_without_a_trace(index):
    registry = registries(max_unique=3)[index] if index else registries()[0]
    registry.add_label(0, "a", index=0)
    registry.add_label(1, "b", index=1)
    before = registry.result
    for client, labels, indices, message in [
        (2, ["c", "a"], [2, 1], "label 'a' is unique label 0, not 1"),
        (2, ["c"], [3], "label 'c' is unique label 2, not 3"),
        (2, ["c", "d"], [2, 2], "label 'd' is unique label 3, not 2"),
        (2, ["c"], [2, 3], "one index per label"),
    ]:
        with pytest.raises(RegistryError, match=message):
            registry.add_labels(client, labels, [1] * len(labels), indices=indices)
        assert registry.result is before
    if index:  # the secure bound holds for appended labels too
        registry.add_label(2, "c", index=2)
        with pytest.raises(RegistryError, match="more than"):
            registry.add_label(2, "d", index=3)
        assert registry.result.client_maps == [{"a": 0}, {"b": 1}, {"c": 2}]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_hash_collision_is_refused_for_a_label_placed_by_index(protocol):
    colliding = CKKSRegistry(
        seed=0, protocol=protocol, label_hash=lambda label: 5 if label in ("p", "q") else 9
    )
    colliding.add_label(0, "p", index=0)
    with pytest.raises(RegistryError, match="hash to the same code 5"):
        colliding.add_label(1, "q", index=1)
    assert colliding.result.client_maps == [{"p": 0}]
    assert colliding.add_label(1, "z", index=1) == 1


def test_public_counts_are_added_in_the_clear_to_the_totals_the_encrypted_round_gives():
    plain, *secure = registries()
    for registry in (plain, *secure):
        encrypted = (
            registries()[0]
            if registry is plain
            else CKKSRegistry(seed=5, protocol=registry.protocol)
        )
        for client, label, _ in ARRIVALS:
            registry.add_label(client, label, 1, defer_count=True)
            encrypted.add_label(client, label, 1, defer_count=True)
        before = registry.stats.encryptions if registry is not plain else 0
        registry.flush_counts(public=True)
        encrypted.flush_counts()
        assert same_result(registry.result, encrypted.result)
        np.testing.assert_array_equal(registry.result.global_counts, [2, 1, 2, 1])
        if registry is not plain:
            assert registry.stats.encryptions == before  # no round
        assert registry.pending_counts == {}


def test_a_count_of_more_than_one_sample_is_not_public():
    for registry in registries():
        registry.add_label(0, "a", 1, defer_count=True)
        registry.add_label(1, "a", 3, defer_count=True)
        with pytest.raises(RegistryError, match="3 samples of placeholder 0 are not a public"):
            registry.flush_counts(public=True)
        np.testing.assert_array_equal(registry.result.global_counts, [0])
        assert registry.pending_total() == 4
