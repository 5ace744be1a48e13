"""The two roles of the CKKS registry, kept apart so that the server cannot decrypt.

:class:`KeyHolder` stands for the clients and holds the secret key; :class:`Server` holds a
context deserialized from bytes saved *without* the secret key and only adds and subtracts.
Every ciphertext travels serialized between the two, so a tampered or foreign ciphertext
reaches the server as bytes and is rejected with the name of the client that sent it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import tenseal as ts

from stratify.errors import RegistryError
from stratify.registry.ckks.encoding import INTEGER_TOLERANCE, LABEL_HASH_RANGE, CKKSParameters
from stratify.registry.ckks.stats import ProtocolStats


class KeyHolder:
    """The clients' side: secret key, label codes, encryption and decryption.

    In this simulation one object stands for all clients; it never sees a label the
    protocol does not give it, except in :meth:`encode`, where a hash collision between
    two distinct labels is detected and raised instead of silently merging them.

    Parameters
    ----------
    parameters : CKKSParameters
        Encryption parameters.
    label_hash : callable
        ``label -> int`` code in ``[0, hash_range)``.
    hash_range : int
        Exclusive upper bound on codes; out-of-range codes are rejected.
    """

    def __init__(
        self,
        parameters: CKKSParameters,
        label_hash: Callable[[Hashable], int],
        hash_range: int = LABEL_HASH_RANGE,
    ) -> None:
        self.parameters = parameters
        self.label_hash = label_hash
        self.hash_range = hash_range
        self._context = ts.context(
            ts.SCHEME_TYPE.CKKS,
            poly_modulus_degree=parameters.poly_modulus_degree,
            coeff_mod_bit_sizes=list(parameters.coeff_mod_bit_sizes),
        )
        self._context.global_scale = 2.0**parameters.scale_bits

    def public_context(self) -> bytes:
        """The context for the server: parameters and public key, no secret key.

        Relinearization and Galois keys are left out too: the server never multiplies
        or rotates.
        """
        return self._context.serialize(
            save_public_key=True,
            save_secret_key=False,
            save_galois_keys=False,
            save_relin_keys=False,
        )

    def encode(
        self,
        client_labels: Sequence[Mapping[Any, int]],
        owner: dict[int, tuple[Hashable, int]] | None = None,
    ) -> list[list[int]]:
        """Each client's label codes, in its mapping order.

        Parameters
        ----------
        client_labels : sequence of mapping
            Each client's labels (the keys).
        owner : dict, optional
            Filled with code -> (first label, client), for later collision checks.

        Raises
        ------
        RegistryError
            A code outside ``[0, hash_range)``, or two distinct labels with one code.
        """
        owner = {} if owner is None else owner
        return [
            [self.encode_label(client, label, owner) for label in counts]
            for client, counts in enumerate(client_labels)
        ]

    def encode_label(
        self, client: int, label: Hashable, owner: dict[int, tuple[Hashable, int]]
    ) -> int:
        """The code of ``client``'s ``label``, recorded in ``owner`` (code -> first label
        and client), against which a collision between distinct labels is detected.

        Raises
        ------
        RegistryError
            A code outside ``[0, hash_range)``, or a code ``owner`` has for another label.
        """
        code = self.label_hash(label)
        if not isinstance(code, (int, np.integer)) or not 0 <= code < self.hash_range:
            raise RegistryError(
                f"client {client}: label {label!r} hashes to {code!r}, outside "
                f"[0, {self.hash_range}); CKKS comparisons need codes in that range"
            )
        code = int(code)
        seen = owner.setdefault(code, (label, client))
        if seen[0] != label:
            raise RegistryError(
                f"labels {seen[0]!r} (client {seen[1]}) and {label!r} (client {client}) "
                f"hash to the same code {code}; register with another seed or hash key"
            )
        return code

    def encrypt(self, values: np.ndarray, stats: ProtocolStats) -> bytes:
        """Encrypt ``values`` (already padded to the protocol's vector size), serialized."""
        blob = ts.ckks_vector(self._context, np.asarray(values, dtype=float).tolist()).serialize()
        stats.encryptions += 1
        stats.bytes_to_server += len(blob)
        return blob

    def decrypt(
        self, blob: bytes, sender: str, magnitude_limit: float, stats: ProtocolStats
    ) -> np.ndarray:
        """Decrypt a vector the server computed from ``sender``'s ciphertexts and check it.

        Parameters
        ----------
        blob : bytes
            Serialized ciphertext from the server.
        sender : str
            Whose ciphertexts it was computed from, for error messages.
        magnitude_limit : float
            Honest values are integers of at most this magnitude; anything else means a
            tampered ciphertext or one encrypted under another key (those decrypt to
            values near the ciphertext modulus, ~2^59 here).
        stats : ProtocolStats
            Counters to update.
        """
        stats.bytes_to_key_holder += len(blob)
        try:
            values = np.asarray(ts.ckks_vector_from(self._context, blob).decrypt(), dtype=float)
        except Exception as error:  # TenSEAL raises ValueError/RuntimeError on bad bytes
            raise RegistryError(
                f"{sender}: the key holder cannot decrypt the result: {error}"
            ) from None
        stats.decryptions += 1
        largest = float(np.max(np.abs(values))) if values.size else 0.0
        if not np.isfinite(largest) or largest > magnitude_limit + INTEGER_TOLERANCE:
            raise RegistryError(
                f"{sender}: a decrypted value has magnitude {largest:.3g}, above the limit "
                f"{magnitude_limit:.3g}; its ciphertext was tampered with or encrypted under "
                "another key"
            )
        deviation = float(np.max(np.abs(values - np.rint(values)))) if values.size else 0.0
        if deviation > INTEGER_TOLERANCE:
            raise RegistryError(
                f"{sender}: decrypted values are {deviation:.3g} away from integers (tolerance "
                f"{INTEGER_TOLERANCE}); its ciphertext was tampered with"
            )
        stats.max_decryption_error = max(stats.max_decryption_error, deviation)
        return values


class Server:
    """The server's side: a public context, and additions/subtractions only.

    Parameters
    ----------
    public_context : bytes
        A context serialized without its secret key (:meth:`KeyHolder.public_context`).

    Raises
    ------
    RegistryError
        The bytes are not a context, or the context holds a secret key.
    """

    def __init__(self, public_context: bytes) -> None:
        try:
            context = ts.context_from(public_context)
        except Exception as error:
            raise RegistryError(f"server: cannot load the context it was given: {error}") from None
        if context.has_secret_key() or context.is_private():
            raise RegistryError(
                "server: the context it was given holds the secret key; serialize it with "
                "save_secret_key=False"
            )
        self.context = context

    def receive(self, blob: bytes, sender: str, size: int) -> ts.CKKSVector:
        """Load ``sender``'s serialized ciphertext against the server's own context.

        Parameters
        ----------
        blob : bytes
            Serialized CKKS vector.
        sender : str
            Who sent it, for error messages.
        size : int
            Expected vector length (all vectors of a protocol share one size).
        """
        try:
            vector = ts.ckks_vector_from(self.context, blob)
        except Exception as error:
            raise RegistryError(
                f"{sender}: ciphertext rejected by the server (tampered, or made for another "
                f"context): {error}"
            ) from None
        if vector.size() != size:
            raise RegistryError(
                f"{sender}: ciphertext holds {vector.size()} values, expected {size}"
            )
        return vector

    def subtract(
        self, minuend: ts.CKKSVector, subtrahend: ts.CKKSVector, stats: ProtocolStats
    ) -> bytes:
        """``minuend - subtrahend``, serialized for the key holder."""
        try:
            difference = minuend - subtrahend
        except RuntimeError as error:
            if "transparent" not in str(error):
                raise
            # Identical ciphertexts (a client's label against the U entry it created) give
            # an all-zero, "transparent" result that SEAL refuses; a fresh encryption of
            # zero keeps the value and makes it a proper ciphertext.
            fresh_zero = ts.ckks_vector(self.context, [0.0] * minuend.size())
            difference = (minuend + fresh_zero) - subtrahend
        stats.subtractions += 1
        return difference.serialize()

    def add(
        self, total: ts.CKKSVector | None, term: ts.CKKSVector, stats: ProtocolStats
    ) -> ts.CKKSVector:
        """``total + term`` (``term`` itself when there is no total yet)."""
        if total is None:
            return term
        stats.additions += 1
        return total + term
