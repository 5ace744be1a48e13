"""The registry interface: plain registry, make_registry, and secure == no-secure.

Training with ``--secure`` learns exactly as ``--no-secure`` given the same clients'
secrets because every registry returns the same :class:`RegistryResult`; without them the
secure registry's placeholders are a secret permutation, and what it registers (each
label's count and the clients holding it) is still the plain registry's. These tests pin
both down.
"""

from __future__ import annotations

import numpy as np
import pytest
from privacy_attacks import federation_labels, fixed_secrets
from scipy import stats

from stratify.errors import RegistryError, StratifyError
from stratify.registry import (
    PROTOCOLS,
    LabelRegistry,
    PlainRegistry,
    RegistryResult,
    make_registry,
)
from stratify.registry.base import assign_placeholders
from stratify.registry.ckks import CKKSRegistry, same_result
from stratify.registry.client_secrets import RegistrySecrets, keyed_permutation


def dirichlet_clients(num_clients: int, num_classes: int, alpha: float, seed: int) -> list[dict]:
    """Label counts as a Dirichlet partition gives them (what ``Federation.label_counts``
    returns: int labels in ascending order, clients without a label leave it out)."""
    rng = np.random.default_rng(seed)
    shares = rng.dirichlet([alpha] * num_clients, size=num_classes)  # class -> client shares
    counts = np.floor(shares * 200).astype(int)
    clients = []
    for client in range(num_clients):
        held = {
            label: int(counts[label, client])
            for label in range(num_classes)
            if counts[label, client] > 0
        }
        clients.append(held or {0: 1})
    return clients


def all_registries(seed: int, shared: bool = True) -> list[LabelRegistry]:
    """The plain registry, then one secure registry per protocol; ``shared``: all with the
    same fixed secrets, else the plain one seeded and each secure one with fresh secrets."""
    secrets = fixed_secrets(seed) if shared else None
    return [
        make_registry(False, seed=seed, secrets=secrets),
        *(
            make_registry(True, seed=seed, protocol=protocol, secrets=secrets)
            for protocol in PROTOCOLS
        ),
    ]


def what_is_registered(result: RegistryResult) -> dict:
    """Per real label: its global count and the clients holding it (what a registration
    means, whatever the placeholder numbers)."""
    label_of = {p: label for mapping in result.client_maps for label, p in mapping.items()}
    holders = {label: set() for label in label_of.values()}
    for client, mapping in enumerate(result.client_maps):
        for label in mapping:
            holders[label].add(client)
    return {label: (int(result.global_counts[p]), holders[label]) for p, label in label_of.items()}


def test_make_registry_picks_the_implementation():
    plain = make_registry(False, seed=4)
    assert isinstance(plain, PlainRegistry) and plain.seed == 4 and plain.secrets is None
    for protocol in PROTOCOLS:
        secure = make_registry(True, seed=4, protocol=protocol)
        assert isinstance(secure, CKKSRegistry)
        assert secure.seed == 4 and secure.protocol == protocol and secure.result is None
    assert make_registry(True).protocol == "packed-blind"
    with pytest.raises(RegistryError, match="unknown registry protocol"):
        make_registry(True, protocol="fast")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_secure_and_plain_results_are_identical_on_a_dirichlet_federation(seed):
    clients = dirichlet_clients(num_clients=6, num_classes=10, alpha=0.5, seed=seed)
    plain, *secure = (
        registry.register(clients, num_classes=10) for registry in all_registries(seed)
    )
    assert len(secure) == len(PROTOCOLS) == 4
    for result in secure:
        assert same_result(plain, result)
        assert [list(m.items()) for m in plain.client_maps] == [
            list(m.items()) for m in result.client_maps
        ]


@pytest.mark.parametrize("spec", ["iid", "dirichlet:0.5", "dirichlet:0.1"])
def test_every_protocol_with_its_own_secrets_registers_what_the_plain_registry_does(spec):
    clients = federation_labels(spec, classes=10, clients=8, seed=1)
    plain, *secure = (
        registry.register(clients, num_classes=10)
        for registry in all_registries(seed=1, shared=False)
    )
    expected = what_is_registered(plain)
    assert len(expected) == 10
    for result in secure:
        assert what_is_registered(result) == expected
        # the same labels mean other placeholders: the seed does not give them
        assert result.client_maps != plain.client_maps


def test_every_registry_keeps_the_interface_contract():
    clients = [{"cat": 3, "dog": 1}, {"dog": 2, "fox": 5}, {"cat": 1}]
    for registry in all_registries(seed=8):
        result = registry.register(clients, num_classes=3)
        assert registry.result is result
        assert isinstance(result, RegistryResult) and result.num_placeholders == 3
        assert sorted({p for m in result.client_maps for p in m.values()}) == [0, 1, 2]
        assert [set(m) for m in result.client_maps] == [set(c) for c in clients]
        placeholder = result.client_maps[0]
        assert result.global_counts.dtype == np.int64
        assert result.global_counts[placeholder["cat"]] == 4
        assert result.global_counts[placeholder["dog"]] == 3
        assert result.global_counts.sum() == 12
        assert result.client_placeholders(2) == {placeholder["cat"]}


def test_plain_discovers_in_client_then_mapping_order():
    clients = [{5: 1, 2: 1}, {9: 1, 5: 1}, {2: 1, 0: 1}]
    result = PlainRegistry(seed=3).register(clients)
    order = assign_placeholders(4, seed=3)
    assert result.client_maps[0] == {5: int(order[0]), 2: int(order[1])}
    assert result.client_maps[1] == {9: int(order[2]), 5: int(order[0])}
    assert result.client_maps[2] == {2: int(order[1]), 0: int(order[3])}


def test_with_secrets_clients_discover_in_their_secret_order_and_placeholders_are_secret():
    clients = [{label: 1 for label in range(12)}, {20: 1, 3: 1, 21: 1}]
    secrets = fixed_secrets(3)
    result = PlainRegistry(seed=3, secrets=secrets).register(clients)
    first = [list(clients[0])[i] for i in secrets.client_order(0, 12)]
    second = [list(clients[1])[i] for i in secrets.client_order(1, 3)]
    discovered = first + [label for label in second if label not in first]
    placeholders = secrets.placeholders(14)
    expected = {label: placeholders[i] for i, label in enumerate(discovered)}
    assert result.client_maps == [{label: expected[label] for label in c} for c in clients]
    assert first != sorted(first)  # not in the order the client listed them
    assert placeholders != list(assign_placeholders(14, seed=3))


def test_placeholders_are_a_seeded_permutation():
    first, again, other = (assign_placeholders(30, seed) for seed in (1, 1, 2))
    assert sorted(first) == list(range(30))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


@pytest.mark.parametrize("registry_index", range(1 + len(PROTOCOLS)))
@pytest.mark.parametrize(
    ("clients", "message"),
    [
        ([], "no clients to register"),
        ([{0: 1}, {}], "client 1 has no labels"),
        ([{0: -2}], "client 0: count -2 for label 0 must be a positive integer"),
        ([{0: 1}, {"a": 1.5}], "client 1: count 1.5 for label 'a'"),
    ],
)
def test_bad_input_is_rejected_the_same_way_by_every_registry(registry_index, clients, message):
    registry = all_registries(seed=0)[registry_index]
    previous = registry.register([{0: 1}])
    with pytest.raises(RegistryError, match=message) as caught:
        registry.register(clients)
    assert isinstance(caught.value, StratifyError)  # the CLI prints it as one line
    assert registry.result is previous


def test_keyed_permutations_are_exact_per_key_and_uniform_over_keys():
    first, again = keyed_permutation(b"k", 30), keyed_permutation(b"k", 30)
    assert sorted(first) == list(range(30)) and first == again
    assert keyed_permutation(b"other", 30) != first
    # where item 0 lands, and which item lands first, over 3,000 keys: uniform over 6
    draws = np.array([keyed_permutation(b"key %d" % i, 6) for i in range(3000)])
    assert stats.chisquare(np.bincount(np.argmax(draws == 0, axis=1), minlength=6)).pvalue > 0.01
    assert stats.chisquare(np.bincount(draws[:, 0], minlength=6)).pvalue > 0.01
    # secrets survive their file, and their repr does not show them
    secrets = RegistrySecrets.draw(clients=2)
    assert RegistrySecrets.from_bytes(secrets.to_bytes(), "file") == secrets
    for hidden in (secrets.shared.secret, secrets.order_keys[0].key, secrets.order_keys[1].key):
        assert hidden.hex() not in repr(secrets)
