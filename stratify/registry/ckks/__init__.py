"""The CKKS placeholder registry (TenSEAL): docs/architecture.md, the paper's §IV-A.

Two roles, kept in separate objects so that the server provably cannot decrypt:

* :class:`KeyHolder` stands for the clients. It creates the CKKS context and holds the
  secret key, maps labels to integers with a keyed hash shared by the clients, encrypts,
  decrypts the differences the server sends back and answers only "matches unique entry
  *i*" / "matches none", and decrypts the aggregated counts.
* :class:`Server` holds a context deserialized from bytes saved *without* the secret key.
  It loads the clients' ciphertexts against that context and only adds and subtracts.

:class:`CKKSRegistry` runs one of two protocols (``naive``, ``packed``) with one interface
and identical output: exactly :class:`~stratify.registry.plain.PlainRegistry`'s result for
the same seed. Unique labels are discovered in client order, then each client's mapping
order, and placeholders come from :func:`~stratify.registry.base.assign_placeholders`.

Modules: :mod:`.encoding` (label codes, parameters, precision), :mod:`.stats` (counters),
:mod:`.roles` (key holder and server), :mod:`.protocols` (the naive and packed runs) and
:mod:`.registry` (:class:`CKKSRegistry`, :func:`same_result`).
"""

from __future__ import annotations

from stratify.registry.ckks.encoding import (
    COUNT_LIMIT,
    INTEGER_TOLERANCE,
    LABEL_HASH_RANGE,
    MATCH_THRESHOLD,
    CKKSParameters,
    KeyedLabelHash,
    label_bytes,
    seeded_hash_key,
)
from stratify.registry.ckks.protocols import PROTOCOLS
from stratify.registry.ckks.registry import CKKSRegistry, same_result
from stratify.registry.ckks.roles import KeyHolder, Server
from stratify.registry.ckks.stats import ProtocolStats

__all__ = [
    "COUNT_LIMIT",
    "INTEGER_TOLERANCE",
    "LABEL_HASH_RANGE",
    "MATCH_THRESHOLD",
    "PROTOCOLS",
    "CKKSParameters",
    "CKKSRegistry",
    "KeyHolder",
    "KeyedLabelHash",
    "ProtocolStats",
    "Server",
    "label_bytes",
    "same_result",
    "seeded_hash_key",
]
