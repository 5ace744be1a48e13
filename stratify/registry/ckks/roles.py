"""The two roles of the registry, kept apart so that the server cannot decrypt.

The key holder stands for the clients and holds the secret key; the server holds a context
deserialized from bytes saved *without* the secret key. Every ciphertext travels
serialized between the two, so a tampered or foreign ciphertext reaches the server as
bytes and is rejected with the name of the client that sent it.

Two pairs share one interface, so a protocol run (:mod:`.protocols`) works with either:

* :class:`KeyHolder` and :class:`Server` (CKKS, the paper): the server only adds and
  subtracts, and the key holder sees what it computed: raw differences ``l - u``, counts.
* :class:`BlindKeyHolder` and :class:`BlindServer` (BFV on the same ring): before the
  key holder decrypts, the server multiplies each compared difference by a fresh uniform
  factor in ``[1, t)`` and adds a uniform mask in ``[0, t)`` to each count, which it
  removes afterwards. Modulo the prime ``t``, ``r (l - u)`` is uniform over the non-zero
  residues whatever ``l - u`` is, and ``c + m`` is uniform whatever ``c`` is: the key holder
  learns which comparisons matched, and no count.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import tenseal as ts

from stratify.errors import RegistryError
from stratify.registry.ckks.encoding import (
    CHECK_SLOTS,
    INTEGER_TOLERANCE,
    LABEL_HASH_RANGE,
    BFVParameters,
    CKKSParameters,
)
from stratify.registry.ckks.stats import ProtocolStats

#: a ciphertext as TenSEAL gives it (``CKKSVector`` or ``BFVVector``)
Vector = Any
#: TenSEAL's native (C++) vector types. Its Python wrappers turn a list of values into a
#: ``PlainTensor`` and back into a list before the native constructor or operator takes it,
#: about 0.5 ms per 8,192-slot vector (a fifth of an encryption, a third of a plaintext
#: multiplication); the roles give the native types the list directly. Same values, same
#: ciphertexts (docs/architecture.md, "Privacy": the cost of a round).
NATIVE = ts._ts_cpp


class KeyHolderRole(ABC):
    """The clients' side: secret key, label codes, encryption and decryption.

    In this simulation one object stands for all clients; it never sees a label the
    protocol does not give it, except in :meth:`encode`, where a hash collision between
    two distinct labels is detected and raised instead of silently merging them.

    Parameters
    ----------
    context : tenseal.Context
        The scheme's context with its secret key (made by the subclass).
    label_hash : callable
        ``label -> int`` code in ``[0, hash_range)``.
    hash_range : int
        Exclusive upper bound on codes; out-of-range codes are rejected.
    """

    #: slots a protocol may fill in one ciphertext
    data_slots: int

    def __init__(
        self, context: ts.Context, label_hash: Callable[[Hashable], int], hash_range: int
    ) -> None:
        self._context = context
        self.label_hash = label_hash
        self.hash_range = hash_range

    def secret_context(self) -> bytes:
        """The context with its secret key: what the clients share (never the server)."""
        return self._context.serialize(save_secret_key=True)

    def public_context(self) -> bytes:
        """The context for the server: parameters and public key, no secret key.

        Relinearization and Galois keys are left out too: the server multiplies only by
        plaintexts and never rotates.
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
                f"[0, {self.hash_range}); encrypted comparisons need codes in that range"
            )
        code = int(code)
        seen = owner.setdefault(code, (label, client))
        if seen[0] != label:
            raise RegistryError(
                f"labels {seen[0]!r} (client {seen[1]}) and {label!r} (client {client}) "
                f"hash to the same code {code}; register again with other clients' secrets (a new "
                "run draws its own) or another hash key"
            )
        return code

    @abstractmethod
    def encrypt(self, values: np.ndarray, stats: ProtocolStats) -> bytes:
        """Encrypt ``values`` (already padded to the protocol's vector size), serialized."""

    @abstractmethod
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
            Largest magnitude of an honest unblinded value (codes: ``hash_range``; counts:
            ``COUNT_LIMIT``).
        stats : ProtocolStats
            Counters to update.

        Raises
        ------
        RegistryError
            The bytes do not decrypt, or the values show a tampered or foreign ciphertext;
            the message starts with ``sender``.
        """

    def _load(
        self, blob: bytes, sender: str, load: Callable[[ts.Context, bytes], Vector]
    ) -> Vector:
        try:
            return load(self._context, blob)
        except Exception as error:  # TenSEAL raises ValueError/RuntimeError on bad bytes
            raise RegistryError(
                f"{sender}: the key holder cannot decrypt the result: {error}"
            ) from None


class KeyHolder(KeyHolderRole):
    """The CKKS key holder (the paper): decrypts raw differences and counts.

    Parameters
    ----------
    parameters : CKKSParameters
        Encryption parameters.
    label_hash : callable
        ``label -> int`` code in ``[0, hash_range)``.
    hash_range : int
        Exclusive upper bound on codes; out-of-range codes are rejected.
    context : tenseal.Context, optional
        The clients' context with its secret key, made with ``parameters`` and shared by
        them (a Flower federation's key file: docs/flower.md); default a fresh one.
    """

    def __init__(
        self,
        parameters: CKKSParameters,
        label_hash: Callable[[Hashable], int],
        hash_range: int = LABEL_HASH_RANGE,
        context: ts.Context | None = None,
    ) -> None:
        if context is None:
            context = ts.context(
                ts.SCHEME_TYPE.CKKS,
                poly_modulus_degree=parameters.poly_modulus_degree,
                coeff_mod_bit_sizes=list(parameters.coeff_mod_bit_sizes),
            )
            context.global_scale = 2.0**parameters.scale_bits
        super().__init__(context, label_hash, hash_range)
        self.parameters = parameters
        self.data_slots = parameters.slots

    def encrypt(self, values: np.ndarray, stats: ProtocolStats) -> bytes:
        plain = np.asarray(values, dtype=float).tolist()
        blob = NATIVE.CKKSVector(self._context.data, plain).serialize()
        stats.encryptions += 1
        stats.bytes_to_server += len(blob)
        return blob

    def decrypt(
        self, blob: bytes, sender: str, magnitude_limit: float, stats: ProtocolStats
    ) -> np.ndarray:
        """Decrypt and check: honest values are integers of magnitude at most
        ``magnitude_limit``; a tampered ciphertext or one encrypted under another key
        decrypts to values near the ciphertext modulus (~2^59 here) or off the integers."""
        stats.bytes_to_key_holder += len(blob)
        values = np.asarray(self._load(blob, sender, ts.ckks_vector_from).decrypt(), dtype=float)
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


class BlindKeyHolder(KeyHolderRole):
    """The BFV key holder of the blinded protocols: decrypts residues mod ``t``.

    Every vector it encrypts ends in :data:`CHECK_SLOTS` zeros after the protocol's
    values; :meth:`decrypt` refuses a result whose check slots are not zero, and returns
    the other slots. What it decrypts is blinded or masked by the server, so no magnitude
    can be checked: a blinded non-match is any residue in ``[1, t)``.

    Parameters
    ----------
    parameters : BFVParameters
        Encryption parameters.
    label_hash : callable
        ``label -> int`` code in ``[0, hash_range)``.
    hash_range : int
        Exclusive upper bound on codes; out-of-range codes are rejected.
    context : tenseal.Context, optional
        The clients' context with its secret key, made with ``parameters`` and shared by
        them (a Flower federation's key file: docs/flower.md); default a fresh one.
    """

    def __init__(
        self,
        parameters: BFVParameters,
        label_hash: Callable[[Hashable], int],
        hash_range: int = LABEL_HASH_RANGE,
        context: ts.Context | None = None,
    ) -> None:
        if hash_range > parameters.plain_modulus:
            raise RegistryError(
                f"codes up to {hash_range} do not fit the plain modulus {parameters.plain_modulus}"
            )
        if context is None:
            context = ts.context(
                ts.SCHEME_TYPE.BFV,
                poly_modulus_degree=parameters.poly_modulus_degree,
                plain_modulus=parameters.plain_modulus,
                coeff_mod_bit_sizes=list(parameters.coeff_mod_bit_sizes),
            )
        super().__init__(context, label_hash, hash_range)
        self.parameters = parameters
        self.data_slots = parameters.slots - CHECK_SLOTS

    def encrypt(self, values: np.ndarray, stats: ProtocolStats) -> bytes:
        padded = np.zeros(len(values) + CHECK_SLOTS, dtype=np.int64)
        padded[: len(values)] = np.asarray(values, dtype=np.int64)
        blob = NATIVE.BFVVector(self._context.data, padded.tolist()).serialize()
        stats.encryptions += 1
        stats.bytes_to_server += len(blob)
        return blob

    def decrypt(
        self, blob: bytes, sender: str, magnitude_limit: float, stats: ProtocolStats
    ) -> np.ndarray:
        """Residues in ``[0, t)`` of the data slots, once the check slots are zero
        (``magnitude_limit`` is not applied: blinded values span all of ``[0, t)``)."""
        stats.bytes_to_key_holder += len(blob)
        decrypted = self._load(blob, sender, ts.bfv_vector_from).decrypt()
        stats.decryptions += 1
        values = np.mod(np.asarray(decrypted, dtype=np.int64), self.parameters.plain_modulus)
        if len(values) <= CHECK_SLOTS or np.any(values[-CHECK_SLOTS:]):
            raise RegistryError(
                f"{sender}: the check slots of a result did not decrypt to zero; a ciphertext "
                "was tampered with or encrypted under another key"
            )
        return values[:-CHECK_SLOTS]


class ServerRole(ABC):
    """The server's side: a public context, and what it may compute without the secret key.

    Parameters
    ----------
    public_context : bytes
        A context serialized without its secret key (:meth:`KeyHolderRole.public_context`).

    Raises
    ------
    RegistryError
        The bytes are not a context, or the context holds a secret key.
    """

    #: zero slots every received vector ends in, beyond the protocol's size
    check_slots = 0

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

    @abstractmethod
    def _load(self, blob: bytes) -> Vector:
        """A serialized vector loaded against the server's context."""

    @abstractmethod
    def _encrypt_zeros(self, size: int) -> Vector:
        """A fresh encryption of ``size`` zeros under the public key."""

    def receive(self, blob: bytes, sender: str, size: int) -> Vector:
        """Load ``sender``'s serialized ciphertext against the server's own context.

        Parameters
        ----------
        blob : bytes
            Serialized vector.
        sender : str
            Who sent it, for error messages.
        size : int
            Expected number of protocol values (all vectors of a protocol share one size).
        """
        try:
            vector = self._load(blob)
        except Exception as error:
            raise RegistryError(
                f"{sender}: ciphertext rejected by the server (tampered, or made for another "
                f"context): {error}"
            ) from None
        if vector.size() != size + self.check_slots:
            raise RegistryError(
                f"{sender}: ciphertext holds {vector.size() - self.check_slots} values, "
                f"expected {size}"
            )
        return vector

    def difference(self, minuend: Vector, subtrahend: Vector, stats: ProtocolStats) -> Vector:
        """``minuend - subtrahend``, a proper ciphertext even when it is all zero."""
        try:
            difference = minuend - subtrahend
        except RuntimeError as error:
            if "transparent" not in str(error):
                raise
            # Identical ciphertexts (a client's label against the U entry it created) give
            # an all-zero, "transparent" result that SEAL refuses; a fresh encryption of
            # zero keeps the value and makes it a proper ciphertext.
            fresh_zero = self._encrypt_zeros(minuend.size())
            difference = (minuend + fresh_zero) - subtrahend
        stats.subtractions += 1
        return difference

    def add(self, total: Vector | None, term: Vector, stats: ProtocolStats) -> Vector:
        """``total + term`` (``term`` itself when there is no total yet)."""
        if total is None:
            return term
        stats.additions += 1
        return total + term

    @abstractmethod
    def compare(
        self, minuend: Vector, subtrahend: Vector, compared: np.ndarray, stats: ProtocolStats
    ) -> bytes:
        """What the key holder decrypts to compare ``minuend`` with ``subtrahend``, serialized:
        zero exactly at the ``compared`` slots where they are equal.

        Parameters
        ----------
        minuend, subtrahend : vector
            A client's labels and the unique labels, laid out by the protocol.
        compared : numpy.ndarray
            Indices of the slots whose equality the protocol needs.
        stats : ProtocolStats
            Counters to update.
        """

    @abstractmethod
    def reveal(
        self, total: Vector, positions: np.ndarray, stats: ProtocolStats
    ) -> tuple[bytes, np.ndarray]:
        """``total`` as the key holder decrypts it, and what :meth:`unmask` needs after.

        Parameters
        ----------
        total : vector
            Encrypted counts.
        positions : numpy.ndarray
            Indices of the slots holding counts.
        stats : ProtocolStats
            Counters to update.
        """

    @abstractmethod
    def unmask(self, values: np.ndarray, positions: np.ndarray, masks: np.ndarray) -> np.ndarray:
        """The counts at ``positions`` from the key holder's decryption of :meth:`reveal`."""


class Server(ServerRole):
    """The CKKS server (the paper): additions and subtractions only.

    The key holder decrypts its differences and totals as they are.
    """

    def _load(self, blob: bytes) -> Vector:
        return ts.ckks_vector_from(self.context, blob)

    def _encrypt_zeros(self, size: int) -> Vector:
        return ts.ckks_vector(self.context, [0.0] * size)

    def subtract(self, minuend: Vector, subtrahend: Vector, stats: ProtocolStats) -> bytes:
        """``minuend - subtrahend``, serialized for the key holder."""
        return self.difference(minuend, subtrahend, stats).serialize()

    def compare(
        self, minuend: Vector, subtrahend: Vector, compared: np.ndarray, stats: ProtocolStats
    ) -> bytes:
        return self.subtract(minuend, subtrahend, stats)

    def reveal(
        self, total: Vector, positions: np.ndarray, stats: ProtocolStats
    ) -> tuple[bytes, np.ndarray]:
        return total.serialize(), np.zeros(len(positions), dtype=np.int64)

    def unmask(self, values: np.ndarray, positions: np.ndarray, masks: np.ndarray) -> np.ndarray:
        return np.rint(values[positions]).astype(np.int64)


def uniform_residues(
    size: int, low: int, high: int, rng: np.random.Generator | None = None
) -> np.ndarray:
    """``size`` integers uniform in ``[low, high)``, from the OS's CSPRNG unless ``rng``.

    From 64 random bits reduced modulo ``high - low``: the bias is below
    ``(high - low) / 2^64``, 2^-33 for the blinding modulus.

    Parameters
    ----------
    size : int
        How many.
    low, high : int
        Range; ``high - low`` below 2^63.
    rng : numpy.random.Generator, optional
        A seeded generator, for reproducible tests only: whoever knows its seed can undo
        the blinding.
    """
    if rng is not None:
        return rng.integers(low, high, size=size, dtype=np.int64)
    raw = np.frombuffer(os.urandom(8 * size), dtype=np.uint64)
    return (raw % np.uint64(high - low)).astype(np.int64) + low


class BlindServer(ServerRole):
    """The BFV server of the blinded protocols: it blinds differences and masks counts.

    Parameters
    ----------
    public_context : bytes
        A BFV context serialized without its secret key.
    plain_modulus : int
        The context's plain modulus ``t`` (public).
    rng : numpy.random.Generator, optional
        Source of blinding factors and masks; default the OS's CSPRNG. A seeded one is
        for reproducible tests: whoever knows its seed can undo the blinding.
    """

    check_slots = CHECK_SLOTS

    def __init__(
        self, public_context: bytes, plain_modulus: int, rng: np.random.Generator | None = None
    ) -> None:
        super().__init__(public_context)
        self.plain_modulus = plain_modulus
        self.rng = rng

    def _load(self, blob: bytes) -> Vector:
        return ts.bfv_vector_from(self.context, blob)

    def _encrypt_zeros(self, size: int) -> Vector:
        return ts.bfv_vector(self.context, [0] * size)

    def compare(
        self, minuend: Vector, subtrahend: Vector, compared: np.ndarray, stats: ProtocolStats
    ) -> bytes:
        """``r * (minuend - subtrahend)``: a fresh factor ``r`` uniform in ``[1, t)`` per
        compared slot and per check slot, 0 at every other slot (so the key holder sees
        only the comparisons the protocol needs)."""
        difference = self.difference(minuend, subtrahend, stats)
        size = difference.size()
        factors = np.zeros(size, dtype=np.int64)
        factors[compared] = uniform_residues(len(compared), 1, self.plain_modulus, self.rng)
        factors[size - CHECK_SLOTS :] = uniform_residues(
            CHECK_SLOTS, 1, self.plain_modulus, self.rng
        )
        stats.multiplications += 1
        return (difference.data * factors.tolist()).serialize()

    def reveal(
        self, total: Vector, positions: np.ndarray, stats: ProtocolStats
    ) -> tuple[bytes, np.ndarray]:
        """``total + m``: a fresh mask uniform in ``[0, t)`` at each count slot (none on the
        check slots); the masks stay with the server."""
        masks = uniform_residues(len(positions), 0, self.plain_modulus, self.rng)
        plain = np.zeros(total.size(), dtype=np.int64)
        plain[positions] = masks
        stats.maskings += 1
        return (total.data + plain.tolist()).serialize(), masks

    def unmask(self, values: np.ndarray, positions: np.ndarray, masks: np.ndarray) -> np.ndarray:
        return np.mod(values[positions] - masks, self.plain_modulus)
