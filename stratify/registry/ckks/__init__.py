"""The encrypted placeholder registry (TenSEAL): docs/architecture.md, the paper's §IV-A.

Two roles, kept in separate objects so that the server provably cannot decrypt:

* The key holder stands for the clients. It creates the context and holds the secret
  key, maps labels to integers with a keyed hash shared by the clients, encrypts,
  decrypts what the server sends back and answers only "matches unique entry *i*" /
  "matches none", and decrypts the aggregated counts.
* The server holds a context deserialized from bytes saved *without* the secret key. It
  loads the clients' ciphertexts against that context and computes on them.

:class:`CKKSRegistry` runs one of four protocols with one interface and identical output:
exactly :class:`~stratify.registry.plain.PlainRegistry`'s result for the same secrets.
``naive`` and ``packed`` are the paper's CKKS protocol and its SIMD layout, where the key
holder decrypts raw differences and counts (:class:`KeyHolder`, :class:`Server`).
``naive-blind`` and ``packed-blind`` run the same layouts in BFV on the same ring, with
the server blinding every difference by random factors and masking every count
(:class:`BlindKeyHolder`, :class:`BlindServer`): the key holder learns only which labels
match. Unique labels are discovered in client order, then each client's secret encoding
order, and placeholders come from the clients' secrets
(:class:`~stratify.registry.client_secrets.RegistrySecrets`).

Modules: :mod:`.encoding` (label codes, parameters, precision), :mod:`.stats` (counters),
:mod:`.roles` (key holders and servers), :mod:`.protocols` (the naive and packed runs) and
:mod:`.registry` (:class:`CKKSRegistry`, :func:`same_result`).
"""

from __future__ import annotations

from stratify.registry.base import PROTOCOLS
from stratify.registry.ckks.encoding import (
    BLIND_PLAIN_MODULUS,
    CHECK_SLOTS,
    COUNT_LIMIT,
    INTEGER_TOLERANCE,
    LABEL_HASH_RANGE,
    MATCH_THRESHOLD,
    BFVParameters,
    CKKSParameters,
    KeyedLabelHash,
    label_bytes,
)
from stratify.registry.ckks.registry import CKKSRegistry, same_result
from stratify.registry.ckks.roles import BlindKeyHolder, BlindServer, KeyHolder, Server
from stratify.registry.ckks.stats import ProtocolStats

__all__ = [
    "BLIND_PLAIN_MODULUS",
    "CHECK_SLOTS",
    "COUNT_LIMIT",
    "INTEGER_TOLERANCE",
    "LABEL_HASH_RANGE",
    "MATCH_THRESHOLD",
    "PROTOCOLS",
    "BFVParameters",
    "BlindKeyHolder",
    "BlindServer",
    "CKKSParameters",
    "CKKSRegistry",
    "KeyHolder",
    "KeyedLabelHash",
    "ProtocolStats",
    "Server",
    "label_bytes",
    "same_result",
]
