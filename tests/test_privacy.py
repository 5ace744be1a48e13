"""What the key holder learns: its decrypted view, with and without blinding.

These tests record exactly what the key holder decrypts and run two-sample tests (scipy)
on it over 200 draws of the server's randomness, seeded, so the outcome is fixed.

How a draw is made: one real registration per label set, then the registration's own
comparisons (or count totals) are asked again 200 times: the server blinds (or masks)
afresh and the key holder decrypts, as in the protocol. BFV decrypts exactly, so the
server's factors and masks are the only randomness in what the key holder sees;
repeating just that step samples the same distribution as 200 whole registrations, at
~4 ms a draw instead of ~30 ms (the tests run in CI on 2 cores).
"""

from __future__ import annotations

import numpy as np
import pytest
from privacy_attacks import (
    Recovery,
    attack,
    federation_labels,
    fixed_secrets,
    observe,
    senders_chunks,
)
from scipy import stats

import stratify.registry.ckks.roles as roles_module
from stratify.registry.base import assign_placeholders
from stratify.registry.ckks import (
    BLIND_PLAIN_MODULUS,
    COUNT_LIMIT,
    LABEL_HASH_RANGE,
    CKKSRegistry,
)
from stratify.registry.client_secrets import RegistrySecrets
from stratify.registry.plain import PlainRegistry

DRAWS = 200
ALPHA = 0.01
#: codes of two label sets (the labels are their own codes here): the same match pattern,
#: non-matching differences of 1 and 2 in one, of up to 2^30 in the other
SMALL_CODES = (1, 2, 3)
LARGE_CODES = (5, 2**29 + 17, LABEL_HASH_RANGE - 1)
#: the clients' secrets of every registration here, so both label sets are encoded in one
#: order; one where client 0 encodes the third label last, so a naive search compares
#: client 1's label (the third) with every unique label before it matches
SECRETS = next(
    fixed_secrets(seed) for seed in range(100) if fixed_secrets(seed).client_order(0, 3)[2] == 2
)


def clients_with(codes: tuple[int, int, int]) -> list[dict[int, int]]:
    """Client 0 brings the three labels; client 1 holds the third, which matches."""
    first, second, third = codes
    return [{first: 4, second: 2, third: 7}, {third: 1}]


def record_decryptions(monkeypatch, registry: CKKSRegistry) -> list[tuple[float, np.ndarray]]:
    """Every ``(limit, values)`` the key holder decrypts from now on."""
    key_holder = registry.roles()[0]
    decrypt = key_holder.decrypt
    seen: list[tuple[float, np.ndarray]] = []

    def recording(blob, sender, limit, protocol_stats):
        values = decrypt(blob, sender, limit, protocol_stats)
        seen.append((limit, np.array(values, dtype=float)))
        return values

    monkeypatch.setattr(key_holder, "decrypt", recording)
    return seen


def unique_codes(codes: tuple[int, int, int]) -> list[int]:
    """The unique list U of :func:`clients_with` under :data:`SECRETS`: client 0's labels
    in its secret encoding order (the same for both label sets)."""
    return [codes[position] for position in SECRETS.client_order(0, 3)]


def comparison_views(monkeypatch, protocol: str, codes: tuple[int, int, int]) -> np.ndarray:
    """One row per draw: all the key holder decrypts while client 1's label is compared
    with the unique labels (its discovery step), blinded afresh each draw."""
    registry = CKKSRegistry(
        seed=0, protocol=protocol, label_hash=int, blinding_seed=11, secrets=SECRETS
    )
    registry.register(clients_with(codes))
    run = registry._run
    index = unique_codes(codes).index(codes[2])
    seen = record_decryptions(monkeypatch, registry)
    rows = []
    for _ in range(DRAWS):
        seen.clear()
        if registry.layout == "packed":
            hits = run.matches(1)
        else:
            hits = [run.find(1, vector, run.num_unique) for vector in run.labels_of(1)]
        assert hits in ([[index]], [index])  # client 1's label is client 0's third
        assert all(limit == LABEL_HASH_RANGE for limit, _ in seen)
        rows.append(np.concatenate([values for _, values in seen]))
    monkeypatch.undo()
    return np.array(rows)


def smallest_p_value(first: np.ndarray, second: np.ndarray) -> float:
    """Bonferroni-corrected smallest p-value of a two-sample Kolmogorov-Smirnov test per
    slot, over every slot but those holding one and the same value in all draws of both."""
    same_constant = (first == first[0]).all(axis=0) & (second == first[0]).all(axis=0)
    tested = np.flatnonzero(~same_constant)
    if not tested.size:
        return 1.0
    p_values = [stats.ks_2samp(first[:, i], second[:, i]).pvalue for i in tested]
    return min(1.0, min(p_values) * len(p_values))


@pytest.mark.parametrize("protocol", ["packed-blind", "naive-blind"])
def test_blinded_comparisons_look_the_same_whatever_the_non_matching_codes(monkeypatch, protocol):
    small = comparison_views(monkeypatch, protocol, SMALL_CODES)
    large = comparison_views(monkeypatch, protocol, LARGE_CODES)
    # the match is a zero in both, the non-matches are non-zero residues in both
    np.testing.assert_array_equal(small == 0, large == 0)
    varying = small.std(axis=0) > 0
    assert varying.sum() == 2  # the two non-matching comparisons
    assert ((small[:, varying] >= 1) & (small[:, varying] < BLIND_PLAIN_MODULUS)).all()
    assert smallest_p_value(small, large) >= ALPHA
    # and each is uniform over the non-zero residues, as r (l - u) mod t must be
    for column in np.flatnonzero(varying):
        for views in (small, large):
            uniform = stats.uniform(loc=1, scale=BLIND_PLAIN_MODULUS - 1)
            assert stats.kstest(views[:, column], uniform.cdf).pvalue >= ALPHA


def test_the_two_sample_test_catches_factors_drawn_from_too_small_a_range(monkeypatch):
    # Factors in [1, 1024] (as a real-valued blinding within CKKS precision would need)
    # scale the differences instead of hiding them: the same test tells the sets apart.
    def small_factors(size, low, high, rng=None):
        return rng.integers(max(low, 1), min(high, 1025), size=size, dtype=np.int64)

    monkeypatch.setattr(roles_module, "uniform_residues", small_factors)
    small = comparison_views(monkeypatch, "packed-blind", SMALL_CODES)
    monkeypatch.setattr(roles_module, "uniform_residues", small_factors)
    large = comparison_views(monkeypatch, "packed-blind", LARGE_CODES)
    assert smallest_p_value(small, large) < ALPHA


@pytest.mark.parametrize("protocol", ["packed", "naive"])
def test_unblinded_comparisons_give_the_non_matching_codes_away(monkeypatch, protocol):
    small = comparison_views(monkeypatch, protocol, SMALL_CODES)
    large = comparison_views(monkeypatch, protocol, LARGE_CODES)
    assert smallest_p_value(small, large) < ALPHA
    # the key holder reads the differences l - u off (first the comparisons with u_0, u_1,
    # u_2); with its own code l it has the other labels' codes
    for views, codes in ((small, SMALL_CODES), (large, LARGE_CODES)):
        differences = np.rint(views[0, :3]).astype(np.int64)
        expected = [codes[2] - code for code in unique_codes(codes)]
        np.testing.assert_array_equal(differences, expected)


def count_views(
    monkeypatch, protocol: str, increments: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per draw, a client adds ``increments[i]`` samples of label 0: the true global
    count after it, and what the key holder decrypted of the total."""
    registry = CKKSRegistry(seed=0, protocol=protocol, label_hash=int, blinding_seed=12)
    registry.register([{0: 1, 1: 1}])
    run = registry._run
    seen = record_decryptions(monkeypatch, registry)
    placeholder = registry.result.client_maps[0][0]
    counts = registry.result.global_counts
    true_counts, views = [], []
    for increment in increments:
        seen.clear()
        counts = run.add_count(0, placeholder, int(increment), counts)
        [(limit, values)] = seen
        assert limit == COUNT_LIMIT
        true_counts.append(counts[placeholder])
        views.append(values[placeholder])
    monkeypatch.undo()
    return np.array(true_counts), np.array(views)


def test_masked_counts_the_key_holder_decrypts_are_independent_of_the_true_counts(
    monkeypatch,
):
    increments = np.random.default_rng(5).integers(1, 5_000_000, DRAWS)
    true_counts, views = count_views(monkeypatch, "packed-blind", increments)
    # the server still gets the exact counts back: the running totals
    np.testing.assert_array_equal(true_counts, 1 + np.cumsum(increments))
    assert stats.spearmanr(true_counts, views).pvalue >= ALPHA
    # the masked values are uniform over [0, t): nothing of the count shows
    uniform = stats.uniform(loc=0, scale=BLIND_PLAIN_MODULUS)
    assert stats.kstest(views, uniform.cdf).pvalue >= ALPHA


def test_unmasked_counts_the_key_holder_decrypts_are_the_true_counts(monkeypatch):
    increments = np.random.default_rng(5).integers(1, 5_000_000, DRAWS)
    true_counts, views = count_views(monkeypatch, "packed", increments)
    np.testing.assert_allclose(views, true_counts, atol=0.01)
    assert stats.spearmanr(true_counts, views).pvalue < ALPHA


# -- order: nothing the key holder or the server receives is in label order ------------

SPLITS = ["iid", "dirichlet:0.5", "dirichlet:0.1"]


def recovery_rates(
    spec: str, classes: int, seeds: range, protocol: str = "packed-blind"
) -> dict[str, float]:
    """Mean share of the labels each attacker recovers, one registration per seed (10
    clients for 10 classes, 20 for 100)."""
    clients = 10 if classes == 10 else 20
    recoveries = [
        attack(
            federation_labels(spec, classes, clients, seed),
            classes,
            seed,
            protocol,
            secrets=fixed_secrets(seed),
        )
        for seed in seeds
    ]
    return {
        name: float(np.mean([getattr(recovery, name) for recovery in recoveries]))
        for name in Recovery.__dataclass_fields__
    }


@pytest.mark.parametrize("spec", SPLITS)
@pytest.mark.parametrize(("classes", "seeds", "bound"), [(10, 20, 0.25), (100, 2, 0.1)])
def test_order_attacks_of_key_holder_and_seed_knowing_server_do_no_better_than_chance(
    spec, classes, seeds, bound
):
    # Were the clients to encode in label order, the key holder would rank the unique
    # labels from the order of each client's decrypted match rows, and a server knowing
    # --seed would do the same from who added which entries to U (tests/privacy_attacks.py).
    # Chance is 1 / classes.
    rates = recovery_rates(spec, classes, range(seeds))
    assert all(rate <= bound for rate in rates.values()), rates


def test_the_naive_layout_shows_the_attackers_what_the_packed_one_does():
    # so the packed layout's attack test covers both
    clients = federation_labels("dirichlet:0.1", 10, 10, seed=0)
    seen = []
    for protocol in ("packed-blind", "naive-blind"):
        registry = CKKSRegistry(seed=0, protocol=protocol, secrets=fixed_secrets(0))
        with observe() as views:
            registry.register(clients, num_classes=10)
        chunks = views.server_chunks
        if protocol == "naive-blind":
            chunks = senders_chunks(registry._run.unique_senders)
        seen.append((views.key_holder_rows, chunks))
    assert seen[0] == seen[1] and len(seen[0][0]) == len(clients)


def test_the_order_attacks_recover_every_label_when_clients_encode_in_label_order(monkeypatch):
    # the attacks have power: with the secret order replaced by the order the clients list
    # their labels (ascending, as a federation lists them), they recover the labels
    monkeypatch.setattr(
        RegistrySecrets, "client_order", lambda self, client, size: list(range(size))
    )
    monkeypatch.setattr(
        RegistrySecrets, "placeholders", lambda self, size: list(assign_placeholders(size, 0))
    )
    for spec in ("iid", "dirichlet:0.5"):
        rates = recovery_rates(spec, 10, range(1))
        assert rates["key_holder_closure"] == 1.0 and rates["key_holder_borda"] >= 0.9, rates
    assert recovery_rates("iid", 10, range(1))["server_closure"] == 1.0


def test_what_the_server_sees_is_the_counts_the_growth_of_u_and_each_clients_placeholders():
    clients = federation_labels("dirichlet:0.5", 10, 6, seed=3)
    registry = CKKSRegistry(seed=3, protocol="packed-blind", secrets=fixed_secrets(3))
    with observe() as views:
        result = registry.register(clients, num_classes=10)
    # the growth of U: each client adds as many entries as it brings labels new to U, at
    # the next indices, and those indices come to be the placeholders it holds among others
    seen: set[int] = set()
    growth = []
    for counts in clients:
        new = set(counts) - seen
        seen |= new
        growth.append(len(new))
    assert [len(chunk) for chunk in views.server_chunks] == [n for n in growth if n]
    # the placeholders and counts: exact (the paper's design), and nothing else
    for client, counts in enumerate(clients):
        assert len(result.client_placeholders(client)) == len(counts)
    assert result.global_counts.sum() == sum(map(sum, (c.values() for c in clients)))


def test_placeholders_are_uniform_over_the_clients_secrets_whatever_the_seed():
    # the placeholder of each label, over 400 draws of the secrets with one seed: uniform
    clients = federation_labels("dirichlet:0.5", 10, 6, seed=0)
    placeholders = np.array(
        [
            [
                PlainRegistry(seed=0, secrets=fixed_secrets(draw))
                .register(clients)
                .client_maps[client][label]
                for client, label in ((0, min(clients[0])), (0, max(clients[0])))
            ]
            for draw in range(400)
        ]
    )
    for column in placeholders.T:
        assert stats.chisquare(np.bincount(column, minlength=10)).pvalue >= ALPHA
    # one draw through the secure registry: its own secrets, not the seed's permutation
    registry = CKKSRegistry(seed=0, protocol="packed-blind")
    secure = registry.register(clients, num_classes=10)
    assert secure.client_maps != PlainRegistry(seed=0).register(clients).client_maps
    assert registry.placeholder_of_index != list(assign_placeholders(10, seed=0))
