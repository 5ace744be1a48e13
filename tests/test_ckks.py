"""Encrypted registry: roles, precision, identity with the plain registry for every
protocol, placeholders, bad input (tests/test_privacy.py: what each role learns).

Naive comparisons cost ~2 ms each, so inputs stay small; `stratify bench privacy` times
the full grid.
"""

from __future__ import annotations

import numpy as np
import pytest
import tenseal as ts
from privacy_attacks import fixed_secrets

import stratify.registry.ckks.protocols as protocols_module
import stratify.registry.ckks.roles as roles_module
from stratify.errors import RegistryError
from stratify.registry.base import PROTOCOLS
from stratify.registry.ckks import (
    BLIND_PLAIN_MODULUS,
    CHECK_SLOTS,
    LABEL_HASH_RANGE,
    MATCH_THRESHOLD,
    BFVParameters,
    BlindKeyHolder,
    BlindServer,
    CKKSParameters,
    CKKSRegistry,
    KeyedLabelHash,
    KeyHolder,
    ProtocolStats,
    Server,
    label_bytes,
    same_result,
)
from stratify.registry.plain import PlainRegistry

TOP = LABEL_HASH_RANGE - 1
T = BLIND_PLAIN_MODULUS


@pytest.fixture(scope="module")
def roles() -> tuple[KeyHolder, Server]:
    key_holder = KeyHolder(CKKSParameters(), KeyedLabelHash(b"test key"))
    return key_holder, Server(key_holder.public_context())


@pytest.fixture(scope="module")
def blind_roles() -> tuple[BlindKeyHolder, BlindServer]:
    key_holder = BlindKeyHolder(BFVParameters(), KeyedLabelHash(b"test key"))
    rng = np.random.default_rng(0)
    return key_holder, BlindServer(key_holder.public_context(), T, rng)


def random_clients(
    rng: np.random.Generator, labels: list, num_clients: int, max_count: int = 500
) -> list[dict]:
    """Clients holding random subsets (random order) of ``labels``."""
    clients = []
    for _ in range(num_clients):
        size = int(rng.integers(1, len(labels) + 1))
        chosen = rng.choice(len(labels), size=size, replace=False)
        clients.append({labels[i]: int(rng.integers(1, max_count + 1)) for i in chosen})
    return clients


def assert_identical(first, second) -> None:
    assert first.num_placeholders == second.num_placeholders
    assert first.client_maps == second.client_maps
    assert [list(m) for m in first.client_maps] == [list(m) for m in second.client_maps]
    np.testing.assert_array_equal(first.global_counts, second.global_counts)
    assert same_result(first, second)


# -- roles -----------------------------------------------------------------------------


def test_server_context_has_no_secret_key_and_cannot_decrypt(roles):
    key_holder, server = roles
    assert not server.context.has_secret_key() and not server.context.is_private()
    stats = ProtocolStats()
    seven = server.receive(key_holder.encrypt(np.array([7.0]), stats), "client 0", 1)
    three = server.receive(key_holder.encrypt(np.array([3.0]), stats), "client 1", 1)
    with pytest.raises(ValueError, match="secret"):
        seven.decrypt()
    with pytest.raises(ValueError, match="secret"):
        (seven - three).decrypt()
    # the key holder decrypts what the server computed, sent to it as bytes
    difference = server.subtract(seven, three, stats)
    assert key_holder.decrypt(difference, "client 0", 10, stats)[0] == pytest.approx(4, abs=1e-4)


def test_blind_server_cannot_decrypt_and_sends_only_blinded_comparisons(blind_roles):
    key_holder, server = blind_roles
    assert not server.context.has_secret_key() and not server.context.is_private()
    stats = ProtocolStats()
    left = server.receive(key_holder.encrypt(np.array([7, 5, 9]), stats), "client 0", 3)
    right = server.receive(key_holder.encrypt(np.array([3, 5, 2]), stats), "client 1", 3)
    assert left.size() == 3 + CHECK_SLOTS  # the key holder appended the check slots
    with pytest.raises(ValueError, match="secret"):
        (left - right).decrypt()
    # slots 0 and 1 compared: 7 - 3 blinded to a random non-zero residue, 5 - 5 stays 0;
    # slot 2 (not compared) is zeroed, though 9 - 2 differs
    firsts = set()
    for _ in range(20):
        values = key_holder.decrypt(
            server.compare(left, right, np.array([0, 1]), stats), "c", 0, stats
        )
        assert values.shape == (3,) and values[1] == 0 and values[2] == 0
        assert 0 < values[0] < T
        firsts.add(int(values[0]))
    assert len(firsts) == 20  # a fresh factor each time
    # counts: the key holder sees count + mask mod t, the server unmasks
    blob, masks = server.reveal(left, np.array([0, 2]), stats)
    masked = key_holder.decrypt(blob, "c", 0, stats)
    assert masked[1] == 5  # not a count slot: left as it is
    np.testing.assert_array_equal(server.unmask(masked, np.array([0, 2]), masks), [7, 9])
    assert stats.multiplications == 20 and stats.maskings == 1


def test_each_compared_slot_is_blinded_by_its_own_factor(blind_roles):
    # One factor r for the whole comparison would give the key holder r (l - u_i) in every
    # slot: the ratio of two slots, (l - u_i) / (l - u_j) mod t, would be the same in every
    # comparison, and with its own code l it would solve for the u_i.
    key_holder, server = blind_roles
    stats = ProtocolStats()
    label = server.receive(key_holder.encrypt(np.array([10, 10, 10]), stats), "client 0", 3)
    unique = server.receive(key_holder.encrypt(np.array([3, 7, 10]), stats), "clients", 3)
    ratios = set()
    for _ in range(20):
        blob = server.compare(label, unique, np.array([0, 1, 2]), stats)
        first, second, match = key_holder.decrypt(blob, "c", 0, stats)
        assert match == 0 and first != 0 and second != 0
        ratios.add(int(first) * pow(int(second), -1, T) % T)
    assert len(ratios) == 20


def test_each_count_is_masked_by_its_own_mask(blind_roles):
    # One mask m for all counts would give the key holder c_i + m: the difference of two
    # slots is the difference of the counts.
    key_holder, server = blind_roles
    stats = ProtocolStats()
    counts = np.array([40, 17, 5_000, 1])
    total = server.receive(key_holder.encrypt(counts, stats), "aggregate", len(counts))
    positions = np.arange(len(counts))
    for _ in range(10):
        blob, masks = server.reveal(total, positions, stats)
        masked = key_holder.decrypt(blob, "c", 0, stats)
        np.testing.assert_array_equal(server.unmask(masked, positions, masks), counts)
        seen_differences = np.mod(masked[1:] - masked[0], T)
        assert not np.any(seen_differences == np.mod(counts[1:] - counts[0], T))


def test_the_check_slots_the_key_holder_sees_are_blinded_not_the_plain_values(blind_roles):
    # A ciphertext whose check slots are not zero (tampered, or another key's) must not
    # show the key holder what it holds there: the server multiplies the check slots by
    # fresh factors, as it does the compared slots.
    key_holder, server = blind_roles
    stats = ProtocolStats()
    context = key_holder._context
    crafted = ts.bfv_vector(context, [4, 0, 0, 123, 456]).serialize()  # check slots 123, 456
    vector = server.receive(crafted, "client 0", 3)
    zeros = server.receive(key_holder.encrypt(np.zeros(3, dtype=np.int64), stats), "c", 3)
    seen = set()
    for _ in range(20):
        blob = server.compare(vector, zeros, np.array([0]), stats)
        checks = np.mod(ts.bfv_vector_from(context, blob).decrypt(), T)[-CHECK_SLOTS:]
        assert np.all(checks != 0) and tuple(checks) != (123, 456)
        seen.add(tuple(int(check) for check in checks))
        with pytest.raises(RegistryError, match="check slots"):
            key_holder.decrypt(blob, "client 0", 0, stats)  # and it is refused
    assert len(seen) == 20


def test_blinded_comparison_is_exact_at_the_worst_case_with_noise_to_spare(blind_roles):
    # Every data slot compared, codes at the top of the range, neighbours one apart, U the
    # sum of 64 ciphertexts (a tile that 64 clients added to), factors over all of [1, t).
    key_holder, server = blind_roles
    stats = ProtocolStats()
    slots = key_holder.data_slots
    rng = np.random.default_rng(1)
    left = rng.integers(0, LABEL_HASH_RANGE, slots)
    left[:64] = TOP
    right = left.copy()
    right[::3] -= 1
    right[1::3] = rng.integers(0, LABEL_HASH_RANGE, len(right[1::3]))
    tile = None
    for share in np.array_split(np.arange(slots), 64):
        part = np.zeros(slots, dtype=np.int64)
        part[share] = right[share]
        vector = server.receive(key_holder.encrypt(part, stats), "client", slots)
        tile = server.add(tile, vector, stats)
    labels = server.receive(key_holder.encrypt(left, stats), "client", slots)
    difference = server.difference(labels, tile, stats)
    factors = rng.integers(1, T, slots + CHECK_SLOTS)
    blinded = difference * factors.tolist()
    expected = np.mod((left - right) * factors[:slots], T)
    np.testing.assert_array_equal(key_holder.decrypt(blinded.serialize(), "c", 0, stats), expected)
    np.testing.assert_array_equal(expected == 0, left == right)  # zero exactly on matches
    # the noise left after blinding still allows a further multiplication by 2^20
    # (measured here: 2^22 passes, 2^24 does not): decryption is exact with a wide margin
    scaled = blinded * ([2**20] * (slots + CHECK_SLOTS))
    np.testing.assert_array_equal(
        key_holder.decrypt(scaled.serialize(), "c", 0, stats), np.mod(expected * 2**20, T)
    )
    # the server's own blinding of the same difference: the same zero pattern
    values = key_holder.decrypt(
        server.compare(labels, tile, np.arange(slots), stats), "c", 0, stats
    )
    np.testing.assert_array_equal(values == 0, left == right)


def test_bfv_parameters_refuse_a_plain_modulus_below_the_codes():
    with pytest.raises(RegistryError, match="must exceed 1073741824"):
        BFVParameters(plain_modulus=65537)


def test_server_rejects_a_private_or_unreadable_context(roles):
    key_holder, _ = roles
    private = key_holder._context.serialize(save_secret_key=True)
    with pytest.raises(RegistryError, match="holds the secret key"):
        Server(private)
    with pytest.raises(RegistryError, match="server: cannot load the context"):
        Server(b"not a context")


def test_subtracting_a_ciphertext_from_itself_is_a_zero_not_an_error(roles):
    key_holder, server = roles
    stats = ProtocolStats()
    vector = server.receive(key_holder.encrypt(np.array([TOP]), stats), "client 0", 1)
    difference = server.subtract(vector, vector, stats)  # SEAL: "result ciphertext is transparent"
    assert abs(key_holder.decrypt(difference, "client 0", LABEL_HASH_RANGE, stats)[0]) < 1e-4


def test_decryption_error_is_far_below_the_match_threshold_at_the_top_of_the_range(roles):
    key_holder, server = roles
    stats = ProtocolStats()
    slots = key_holder.parameters.slots
    rng = np.random.default_rng(0)
    left = rng.integers(0, LABEL_HASH_RANGE, slots).astype(float)
    left[:64] = TOP
    right = left.copy()
    right[::3] -= 1  # differ by one, at the top of the range too
    right[1::3] = rng.integers(0, LABEL_HASH_RANGE, len(right[1::3]))  # unrelated codes
    difference = server.subtract(
        server.receive(key_holder.encrypt(left, stats), "client 0", slots),
        server.receive(key_holder.encrypt(right, stats), "client 1", slots),
        stats,
    )
    decrypted = key_holder.decrypt(difference, "client 0", LABEL_HASH_RANGE, stats)
    error = np.max(np.abs(decrypted - (left - right)))
    assert error < 1e-4  # measured ~5e-7 with the default parameters
    assert error * 1000 < MATCH_THRESHOLD
    np.testing.assert_array_equal(np.abs(decrypted) < MATCH_THRESHOLD, left == right)


# -- label encoding --------------------------------------------------------------------


def test_label_bytes_tags_types_and_follows_dict_equality():
    assert label_bytes(1) == label_bytes(True) == label_bytes(1.0) == label_bytes(np.int64(1))
    assert label_bytes(1) != label_bytes("1") != label_bytes(b"1")
    assert label_bytes(("a", "bc")) != label_bytes(("ab", "c"))
    assert label_bytes(0.5) != label_bytes("0.5")
    with pytest.raises(RegistryError, match="cannot be encoded"):
        label_bytes(frozenset({1}))


def test_keyed_hash_is_in_range_and_depends_on_the_key():
    first, second = KeyedLabelHash(b"a"), KeyedLabelHash(b"b")
    codes = [first(label) for label in range(1000)]
    assert all(0 <= code < LABEL_HASH_RANGE for code in codes)
    assert len(set(codes)) == 1000
    assert first("cat") == first("cat") != second("cat")
    assert first(7) != first("7")


# -- identical to the plain registry ---------------------------------------------------


LABEL_SETS = {
    "ints": list(range(12)),
    "strings": [f"class-{i}" for i in range(12)],
    "mixed": [0, 1, "1", "0", 2.5, "2.5", b"x", ("a", 1), -3, "", "ü", 10**12],
}


@pytest.mark.parametrize("kind", sorted(LABEL_SETS))
@pytest.mark.parametrize("num_classes", [None, "exact"])
def test_every_protocol_and_plain_give_identical_results(kind, num_classes):
    rng = np.random.default_rng([3, len(kind), num_classes is None])
    labels = LABEL_SETS[kind]
    clients = random_clients(rng, labels, num_clients=5)
    bound = len({label for client in clients for label in client}) if num_classes else None
    expected = PlainRegistry(seed=11, secrets=fixed_secrets(11)).register(
        clients, num_classes=bound
    )
    for protocol in PROTOCOLS:
        registry = CKKSRegistry(seed=11, secrets=fixed_secrets(11), protocol=protocol)
        assert_identical(registry.register(clients, num_classes=bound), expected)


def test_labels_differing_by_one_at_the_top_of_the_hash_range():
    # codes are the labels themselves here, so neighbours really are one apart
    labels = [TOP, TOP - 1, TOP - 2, TOP - 3, 0, 1]
    clients = [
        {TOP: 5, TOP - 1: 2},
        {TOP - 1: 1, TOP - 2: 4, 0: 1},
        {TOP - 3: 9, TOP: 1, 1: 2},
        {1: 3, 0: 3, TOP - 2: 1},
    ]
    expected = PlainRegistry(seed=2, secrets=fixed_secrets(2)).register(clients)
    assert expected.num_placeholders == len(labels)
    for protocol in PROTOCOLS:
        registry = CKKSRegistry(seed=2, secrets=fixed_secrets(2), protocol=protocol, label_hash=int)
        assert_identical(registry.register(clients, num_classes=len(labels)), expected)


def test_equal_keys_of_different_types_are_one_label_and_text_is_not_a_number():
    clients = [{1: 2, "1": 3}, {True: 4, 2: 1}, {2.0: 5, "2": 6}]
    expected = PlainRegistry(seed=0, secrets=fixed_secrets(0)).register(clients)
    assert expected.num_placeholders == 4
    for protocol in PROTOCOLS:
        assert_identical(
            CKKSRegistry(seed=0, secrets=fixed_secrets(0), protocol=protocol).register(clients),
            expected,
        )


def test_discovery_is_in_client_order_then_each_clients_secret_order():
    clients = [{"b": 1, "a": 2, "e": 1}, {"c": 3, "a": 4}, {"d": 5, "b": 6}]
    secrets = fixed_secrets(5)
    discovered: dict[str, int] = {}
    for client, counts in enumerate(clients):
        for position in secrets.client_order(client, len(counts)):
            discovered.setdefault(list(counts)[position], len(discovered))
    assert list(discovered) != ["b", "a", "e", "c", "d"]  # not the order the clients list
    order = secrets.placeholders(5)  # placeholder of the i-th discovered label
    for protocol in PROTOCOLS:
        result = CKKSRegistry(seed=5, secrets=secrets, protocol=protocol).register(clients)
        for client, counts in enumerate(clients):
            assert result.client_maps[client] == {
                label: order[discovered[label]] for label in counts
            }


def test_global_counts_are_exact_for_large_counts():
    clients = [{0: 999_999, 1: 1}, {0: 700_001, 2: 123_457}, {2: 1, 1: 65_536}]
    expected = PlainRegistry(seed=1, secrets=fixed_secrets(1)).register(clients)
    for protocol in PROTOCOLS:
        registry = CKKSRegistry(seed=1, secrets=fixed_secrets(1), protocol=protocol)
        assert_identical(registry.register(clients), expected)
        assert registry.stats.max_decryption_error < 1e-3


def test_num_classes_stops_discovery_once_every_class_is_found():
    clients = [{0: 1, 1: 1, 2: 1}, {2: 1, 0: 1}, {1: 1}, {0: 1, 2: 1, 1: 1}]
    expected = PlainRegistry(seed=4, secrets=fixed_secrets(4)).register(clients)
    for protocol in PROTOCOLS:
        stopping = CKKSRegistry(seed=4, secrets=fixed_secrets(4), protocol=protocol)
        assert_identical(stopping.register(clients, num_classes=3), expected)
        scanning = CKKSRegistry(seed=4, secrets=fixed_secrets(4), protocol=protocol)
        assert_identical(scanning.register(clients), expected)
        assert stopping.stats.subtractions < scanning.stats.subtractions


def test_timings_and_stats_are_recorded(monkeypatch):
    created = []
    make_context = roles_module.ts.context

    def counting_context(*args, **kwargs):
        created.append(1)
        return make_context(*args, **kwargs)

    monkeypatch.setattr(roles_module.ts, "context", counting_context)
    clients = [{0: 3, 1: 4}, {1: 2, 2: 5}]
    for protocol in PROTOCOLS:
        created.clear()
        registry = CKKSRegistry(seed=0, secrets=fixed_secrets(0), protocol=protocol)
        registry.register(clients, num_classes=3)
        assert set(registry.timings) == {"setup_s", "unique_s", "mapping_s", "aggregation_s"}
        assert all(value >= 0 for value in registry.timings.values())
        assert registry.stats.bytes_to_server > 0 and registry.stats.bytes_to_key_holder > 0
        assert registry.stats.block_size == (3 if registry.layout == "packed" else 0)
        # the blinded protocols blind every comparison and mask every total they decrypt
        comparisons = registry.stats.subtractions
        assert registry.stats.multiplications == (comparisons if registry.blinded else 0)
        totals = 1 if registry.layout == "packed" else 3  # naive: one per placeholder
        assert registry.stats.maskings == (totals if registry.blinded else 0)
        roles = registry.roles()
        registry.register(clients, num_classes=3)
        # one key generation per registry: the second registration reuses the roles
        assert len(created) == 1 and registry.roles() is roles


@pytest.mark.parametrize("protocol", ["packed", "packed-blind"])
def test_packed_vectors_hold_many_labels_per_subtraction(protocol):
    labels = list(range(40))
    clients = [{label: 1 for label in labels}, {label: 2 for label in reversed(labels)}]
    registry = CKKSRegistry(seed=0, secrets=fixed_secrets(0), protocol=protocol)
    expected = PlainRegistry(0, secrets=fixed_secrets(0)).register(clients)
    assert_identical(registry.register(clients, num_classes=40), expected)
    # 40 labels fit one vector (4096 CKKS slots, 8190 BFV data slots) in blocks of 40.
    # Client 0 adds its labels unseen, which fills U, so discovery ends; mapping is one
    # subtraction per client.
    assert registry.stats.subtractions == 2
    assert registry.stats.decryptions == 3  # two comparisons and the aggregate


def test_blinded_packing_holds_twice_the_labels_of_ckks():
    # BFV has a slot per ring coefficient (8192, two kept for checks), CKKS half as many
    labels = list(range(100))
    clients = [{label: 1 for label in labels}]
    vectors = {}
    for protocol in ("packed", "packed-blind"):
        registry = CKKSRegistry(seed=0, secrets=fixed_secrets(0), protocol=protocol)
        registry.register(clients, num_classes=100)
        vectors[protocol] = registry.stats.subtractions  # mapping: one per label vector
    assert vectors == {"packed": 3, "packed-blind": 2}  # ceil(100 / 40), ceil(100 / 81)


# -- placeholders reveal nothing of the labels -----------------------------------------


def test_placeholders_do_not_follow_label_order():
    labels = list(range(20))
    clients = [{label: 1 for label in labels}]  # discovered in ascending label order
    for protocol in PROTOCOLS:
        result = CKKSRegistry(seed=9, secrets=fixed_secrets(9), protocol=protocol).register(clients)
        placeholders = [result.client_maps[0][label] for label in labels]
        assert sorted(placeholders) == labels
        assert placeholders != labels and placeholders != labels[::-1]
    # over many clients' secrets, placeholder and label value are uncorrelated
    correlations = [
        np.corrcoef(labels, fixed_secrets(seed).placeholders(20))[0, 1] for seed in range(500)
    ]
    assert abs(np.mean(correlations)) < 0.03


def test_placeholders_depend_only_on_discovery_order_not_on_label_values():
    clients = [{3: 1, 1: 2}, {2: 1, 3: 4}, {0: 7}]
    renamed = [{f"label {label * 1000}": count for label, count in c.items()} for c in clients]
    first = CKKSRegistry(seed=6, secrets=fixed_secrets(6), protocol="packed").register(clients)
    second = CKKSRegistry(seed=6, secrets=fixed_secrets(6), protocol="packed").register(renamed)
    assert [list(m.values()) for m in first.client_maps] == [
        list(m.values()) for m in second.client_maps
    ]
    np.testing.assert_array_equal(first.global_counts, second.global_counts)


# -- bad input: a clear error, nothing half-registered ---------------------------------


GOOD = [{0: 2, 1: 3}, {1: 1, 2: 4}]


@pytest.fixture(params=PROTOCOLS)
def registered(request) -> CKKSRegistry:
    """A registry that already holds a result, to show failures leave it untouched."""
    registry = CKKSRegistry(seed=0, secrets=fixed_secrets(0), protocol=request.param)
    registry.register(GOOD)
    return registry


def fails_cleanly(registry: CKKSRegistry, clients, match: str, **kwargs) -> str:
    before = (registry.result, registry.timings, registry.stats)
    with pytest.raises(RegistryError, match=match) as caught:
        registry.register(clients, **kwargs)
    assert (registry.result, registry.timings, registry.stats) == before
    assert registry.result is before[0]
    return str(caught.value)


def test_client_without_labels(registered):
    fails_cleanly(registered, [{0: 1}, {}], "client 1 has no labels")


def test_bad_counts(registered):
    fails_cleanly(registered, [{0: 1}, {1: 0}], "client 1: count 0")
    fails_cleanly(registered, [{0: 2.5}], "client 0: count 2.5")


def test_more_unique_labels_than_the_bound(registered):
    # U is full after client 0, so discovery stops and client 1's new label shows in mapping
    fails_cleanly(
        registered,
        [{0: 1, 1: 1}, {2: 1, 1: 1}],
        r"client 1: label 2 matches no discovered unique label; the bound of 2 ",
        num_classes=2,
    )
    fails_cleanly(
        registered,
        [{0: 1}, {1: 1, 2: 1, 0: 1}],
        # the new labels in client 1's secret order, whichever it is
        r"client 1 brings unique label number 3 \(new: (1, 2|2, 1)\), more than the bound of 2",
        num_classes=2,
    )
    fails_cleanly(
        registered,
        [{"a": 1, "b": 1, "c": 1}],
        "client 0 brings unique label number 3",
        num_classes=2,
    )
    bounded = CKKSRegistry(
        seed=0, secrets=fixed_secrets(0), protocol=registered.protocol, max_unique=2
    )
    fails_cleanly(bounded, [{0: 1}, {1: 1, 2: 1}], "client 1 brings unique label number 3")
    fails_cleanly(bounded, [{0: 1}, {1: 1}, {2: 1}], "client 2: label 2 matches no discovered")


def test_num_classes_must_be_a_positive_integer(registered):
    fails_cleanly(registered, GOOD, "num_classes must be a positive integer", num_classes=0)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_label_that_does_not_hash_into_range(protocol):
    codes = {7: LABEL_HASH_RANGE, 8: -1, 9: 2.5}
    registry = CKKSRegistry(
        seed=0, protocol=protocol, label_hash=lambda label: codes.get(label, label)
    )
    registry.register(GOOD)
    fails_cleanly(registry, [{0: 1}, {7: 1}], r"client 1: label 7 hashes to 1073741824, outside")
    fails_cleanly(registry, [{8: 1}], r"client 0: label 8 hashes to -1, outside")
    fails_cleanly(registry, [{0: 1, 9: 1}], r"client 0: label 9 hashes to 2.5, outside")


def test_hash_collision_is_raised_not_merged():
    registry = CKKSRegistry(
        seed=0, secrets=fixed_secrets(0), label_hash=lambda label: 5 if label in ("a", "b") else 9
    )
    message = fails_cleanly(registry, [{"a": 1}, {"c": 1, "b": 2}], "hash to the same code 5")
    assert "'a' (client 0)" in message and "'b' (client 1)" in message


def test_unsupported_label_type(registered):
    fails_cleanly(registered, [{0: 1}, {frozenset({1}): 1}], "frozenset")


def tamper_client(monkeypatch, registry: CKKSRegistry, client: int, tamper) -> None:
    """Change every ciphertext ``client`` sends on its way to the server."""
    server = registry.roles()[1]
    receive = server.receive

    def receive_tampered(blob: bytes, sender: str, size: int):
        return receive(tamper(blob, size) if sender == f"client {client}" else blob, sender, size)

    monkeypatch.setattr(server, "receive", receive_tampered)


def test_truncated_ciphertext_names_the_client(registered, monkeypatch):
    tamper_client(monkeypatch, registered, 1, lambda blob, size: blob[: len(blob) // 2])
    fails_cleanly(registered, GOOD, "client 1: ciphertext rejected by the server")


def test_flipped_ciphertext_bytes_name_the_client(registered, monkeypatch):
    def flip(blob: bytes, size: int) -> bytes:
        middle = len(blob) // 2
        flipped = bytes(byte ^ 0xFF for byte in blob[middle : middle + 64])
        return blob[:middle] + flipped + blob[middle + 64 :]

    tamper_client(monkeypatch, registered, 1, flip)
    fails_cleanly(registered, GOOD, "client 1: ")


def foreign_key_holder(registry: CKKSRegistry):
    """A key holder of the registry's scheme and parameters, with another secret key."""
    if registry.blinded:
        return BlindKeyHolder(BFVParameters(), KeyedLabelHash(b"someone else"))
    return KeyHolder(CKKSParameters(), KeyedLabelHash(b"someone else"))


#: what the key holder says of a result that a foreign or tampered ciphertext went into
FOREIGN = {
    False: "a decrypted value has magnitude .* another key",
    True: "the check slots of a result did not decrypt to zero; a ciphertext was tampered "
    "with or encrypted under another key",
}


def test_ciphertext_under_another_key_names_the_client(registered, monkeypatch):
    foreign = foreign_key_holder(registered)
    tamper_client(
        monkeypatch,
        registered,
        1,
        lambda blob, size: foreign.encrypt(np.zeros(size), ProtocolStats()),
    )
    fails_cleanly(registered, GOOD, f"client 1: {FOREIGN[registered.blinded]}")


def test_server_with_a_foreign_context_rejects_the_clients_ciphertexts(registered):
    key_holder, _ = registered.roles()
    if registered.blinded:
        small = BlindKeyHolder(BFVParameters(4096, (40, 20, 40)), KeyedLabelHash(b"x"))
        server = BlindServer(small.public_context(), T)
    else:
        small = KeyHolder(CKKSParameters(4096, (40, 20, 40), 20), KeyedLabelHash(b"x"))
        server = Server(small.public_context())
    registered._roles = (key_holder, server)
    fails_cleanly(registered, GOOD, "client 0: ciphertext rejected by the server")


BLINDED = [protocol for protocol in PROTOCOLS if protocol.endswith("-blind")]


def aggregation_starts(monkeypatch) -> dict[str, bool]:
    """``{"counts": True}`` once a run starts aggregating counts."""
    phase = {"counts": False}
    for run_class in (protocols_module._NaiveRun, protocols_module._PackedRun):

        def aggregate(self, *args, original=run_class.aggregate):
            phase["counts"] = True
            return original(self, *args)

        monkeypatch.setattr(run_class, "aggregate", aggregate)
    return phase


@pytest.mark.parametrize("protocol", BLINDED)
def test_a_foreign_unique_label_is_traced_to_the_client_that_added_it(protocol, monkeypatch):
    # Client 0's labels become the unique list; every comparison after that is computed
    # from its ciphertexts and fails, but the error names client 0, not client 1.
    registry = CKKSRegistry(seed=0, secrets=fixed_secrets(0), protocol=protocol)
    registry.register(GOOD)
    foreign = foreign_key_holder(registry)
    tamper_client(
        monkeypatch,
        registry,
        0,
        lambda blob, size: foreign.encrypt(np.zeros(size), ProtocolStats()),
    )
    message = fails_cleanly(registry, GOOD, f"^client 0: {FOREIGN[True]}$")
    assert "\n" not in message


@pytest.mark.parametrize("protocol", BLINDED)
@pytest.mark.parametrize("client", [0, 1])
def test_a_foreign_count_is_traced_to_its_client(protocol, client, monkeypatch):
    registry = CKKSRegistry(seed=0, secrets=fixed_secrets(0), protocol=protocol)
    registry.register(GOOD)
    foreign = foreign_key_holder(registry)
    phase = aggregation_starts(monkeypatch)
    server = registry.roles()[1]
    receive = server.receive

    def receive_tampered(blob: bytes, sender: str, size: int):
        if phase["counts"] and sender == f"client {client}":
            blob = foreign.encrypt(np.zeros(size), ProtocolStats())
        return receive(blob, sender, size)

    monkeypatch.setattr(server, "receive", receive_tampered)
    fails_cleanly(registry, GOOD, f"^client {client}: {FOREIGN[True]}$")


@pytest.mark.parametrize("protocol", BLINDED)
def test_a_tampered_ciphertext_in_an_incremental_registration_names_the_client(
    protocol, monkeypatch
):
    registry = CKKSRegistry(seed=0, secrets=fixed_secrets(0), protocol=protocol)
    registry.add_label(0, "a", 2)
    registry.add_label(1, "b", 1)
    before = registry.result
    foreign = foreign_key_holder(registry)
    tamper_client(
        monkeypatch,
        registry,
        2,
        lambda blob, size: foreign.encrypt(np.zeros(size), ProtocolStats()),
    )
    with pytest.raises(RegistryError, match=f"^client 2: {FOREIGN[True]}$"):
        registry.add_label(2, "a", 5)
    assert registry.result is before
    monkeypatch.undo()
    assert registry.add_label(2, "a", 5) == before.client_maps[0]["a"]  # still works after
    plain = PlainRegistry(seed=0, secrets=fixed_secrets(0))
    for arrival in [(0, "a", 2), (1, "b", 1), (2, "a", 5)]:
        plain.add_label(*arrival)
    assert_identical(registry.result, plain.result)


def test_unknown_protocol():
    with pytest.raises(
        RegistryError, match="protocol 'fast'; use one of naive, packed, naive-blind, packed-blind"
    ):
        CKKSRegistry(protocol="fast")
