"""The CKKS placeholder registry (TenSEAL): DESIGN §5, the paper's §IV-A.

Two roles, kept in separate objects so that the server provably cannot decrypt:

* :class:`KeyHolder` stands for the clients. It creates the CKKS context and holds the
  secret key, maps labels to integers with a keyed hash shared by the clients, encrypts,
  decrypts the differences the server sends back and answers only "matches unique entry
  *i*" / "matches none", and decrypts the aggregated counts.
* :class:`Server` holds a context deserialized from bytes saved *without* the secret key.
  It loads the clients' ciphertexts against that context and only adds and subtracts.

Every ciphertext travels serialized between the two, so a tampered or foreign ciphertext
reaches the server as bytes and is rejected with the name of the client that sent it.

:class:`CKKSRegistry` runs one of two protocols with one interface and identical output:

* ``naive`` (the paper): one ciphertext per label and per count, one subtraction per
  comparison, each difference decrypted on its own.
* ``packed`` (SIMD slots): with a block size ``B`` no smaller than the number of unique
  labels, a client's labels are replicated over blocks of ``B`` slots (label ``j`` fills
  block ``j``) and the unique list ``U`` is tiled the same way (``u_i`` at slot ``i`` of
  every block), so one subtraction compares ``slots // B`` labels against all of ``U``. A
  client's counts sit at their placeholder slots of one ciphertext, so aggregation is one
  addition per client. No rotations are needed, hence no Galois keys.

Both produce exactly :class:`~stratify.registry.plain.PlainRegistry`'s result for the
same seed: unique labels are discovered in client order, then each client's mapping
order, and placeholders come from :func:`~stratify.registry.base.assign_placeholders`.

Precision (measured with the default parameters: ring degree 8192, moduli 60/40/60 bits,
scale 2^40): decrypting a difference of two label codes below ``2^30`` is off by at most
~5e-7 (the error grows with the largest value in the vector: ~1e-8 below 2^20, ~5e-4 at
2^40), so equality is ``|d| < 0.5``, a margin of about 10^6 over the error. Decrypted
values must also lie within 0.01 of an integer, which catches tampered ciphertexts and
parameters too small for the values.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import tenseal as ts

from stratify.errors import RegistryError
from stratify.registry.base import (
    LabelRegistry,
    RegistryResult,
    assign_placeholders,
    validate_client_labels,
)

#: Label codes lie in ``[0, LABEL_HASH_RANGE)``; CKKS separates codes this large by ~10^6
#: times its error, and 100 labels collide with probability ~5e-6 (a collision is raised).
LABEL_HASH_RANGE = 2**30
#: A decrypted difference is a match when its magnitude is below this (codes are integers).
MATCH_THRESHOLD = 0.5
#: Every decrypted value must be an integer up to this; CKKS error is ~1e-6 here.
INTEGER_TOLERANCE = 0.01
#: Largest global count accepted; counts are decrypted exactly far beyond this.
COUNT_LIMIT = 2**30

PROTOCOLS = ("naive", "packed")


@dataclass(frozen=True)
class CKKSParameters:
    """CKKS encryption parameters (only additions and subtractions are ever evaluated).

    Parameters
    ----------
    poly_modulus_degree : int
        Ring degree ``N``; a ciphertext has ``N / 2`` slots.
    coeff_mod_bit_sizes : tuple of int
        Bit sizes of the coefficient moduli; no multiplication means no extra levels.
    scale_bits : int
        ``log2`` of the encoding scale; sets the precision of decrypted values.
    """

    poly_modulus_degree: int = 8192
    coeff_mod_bit_sizes: tuple[int, ...] = (60, 40, 60)
    scale_bits: int = 40

    @property
    def slots(self) -> int:
        return self.poly_modulus_degree // 2


def label_bytes(label: Hashable) -> bytes:
    """Type-tagged canonical bytes of a label, the input of the keyed hash.

    Labels that are equal as dictionary keys (``1``, ``True``, ``1.0``, ``np.int64(1)``)
    give the same bytes, as :class:`PlainRegistry` treats them as one label; the type tag
    keeps ``1`` and ``"1"`` apart.

    Parameters
    ----------
    label : int, float, str, bytes or tuple of these
        A client's label.
    """
    if isinstance(label, (bool, int, np.integer)):
        return b"int:" + str(int(label)).encode()
    if isinstance(label, (float, np.floating)):
        value = float(label)
        if math.isnan(value):
            raise RegistryError("label NaN cannot be registered: it is not equal to itself")
        if value.is_integer():
            return b"int:" + str(int(value)).encode()
        return b"float:" + value.hex().encode()
    if isinstance(label, str):
        return b"str:" + label.encode("utf-8", "surrogatepass")
    if isinstance(label, bytes):
        return b"bytes:" + label
    if isinstance(label, tuple):
        # length-prefixed parts, so ("a", "bc") and ("ab", "c") differ
        parts = [label_bytes(part) for part in label]
        return b"tuple:" + b"".join(len(part).to_bytes(8, "big") + part for part in parts)
    raise RegistryError(
        f"label {label!r} of type {type(label).__name__} cannot be encoded; "
        "use ints, floats, strings, bytes or tuples of them"
    )


class KeyedLabelHash:
    """HMAC-SHA256 of :func:`label_bytes`, reduced into ``[0, hash_range)``.

    Parameters
    ----------
    key : bytes
        Secret shared by the clients (never by the server).
    hash_range : int
        Codes lie in ``[0, hash_range)``; a power of two keeps the reduction unbiased.
    """

    def __init__(self, key: bytes, hash_range: int = LABEL_HASH_RANGE) -> None:
        self.key = key
        self.hash_range = hash_range

    def __call__(self, label: Hashable) -> int:
        digest = hmac.new(self.key, label_bytes(label), hashlib.sha256).digest()
        return int.from_bytes(digest[:8], "big") % self.hash_range


def seeded_hash_key(seed: int) -> bytes:
    """The clients' hash key derived from the registry seed, for reproducible runs.

    A deployment passes a key the clients agreed on in secret instead.
    """
    return hashlib.sha256(b"stratify label hash key:" + repr(seed).encode()).digest()


@dataclass
class ProtocolStats:
    """Counters of one registration, for the benchmark and the README.

    Parameters
    ----------
    encryptions, decryptions, subtractions, additions : int
        Homomorphic work done by the key holder (first two) and the server.
    bytes_to_server, bytes_to_key_holder : int
        Serialized ciphertext bytes sent each way.
    max_decryption_error : float
        Largest distance of a decrypted value from the nearest integer.
    block_size : int
        Packed protocol: slots per block ``B`` (0 for naive).
    """

    encryptions: int = 0
    decryptions: int = 0
    subtractions: int = 0
    additions: int = 0
    bytes_to_server: int = 0
    bytes_to_key_holder: int = 0
    max_decryption_error: float = 0.0
    block_size: int = 0


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

    def encode(self, client_labels: Sequence[Mapping[Hashable, int]]) -> list[list[int]]:
        """Each client's label codes, in its mapping order.

        Raises
        ------
        RegistryError
            A code outside ``[0, hash_range)``, or two distinct labels with one code.
        """
        owner: dict[int, tuple[Hashable, int]] = {}
        codes = []
        for client, counts in enumerate(client_labels):
            client_codes = []
            for label in counts:
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
                client_codes.append(code)
            codes.append(client_codes)
        return codes

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
        error = float(np.max(np.abs(values - np.rint(values)))) if values.size else 0.0
        if error > INTEGER_TOLERANCE:
            raise RegistryError(
                f"{sender}: decrypted values are {error:.3g} away from integers (tolerance "
                f"{INTEGER_TOLERANCE}); its ciphertext was tampered with"
            )
        stats.max_decryption_error = max(stats.max_decryption_error, error)
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


class _ProtocolRun:
    """One registration's messages between the key holder and the server.

    Parameters
    ----------
    key_holder, server : KeyHolder, Server
        The two roles.
    codes : list of list of int
        Each client's label codes, in its mapping order.
    labels : list of list
        Each client's labels in the same order; a client knows its own labels, and names
        them in its error messages.
    unique_limit : int or None
        Most unique labels allowed (``num_classes`` or ``max_unique``); discovery stops
        when it is reached, and one label more is an error.
    stats : ProtocolStats
        Counters to update.
    """

    vector_size: int

    def __init__(
        self,
        key_holder: KeyHolder,
        server: Server,
        codes: list[list[int]],
        labels: list[list[Hashable]],
        unique_limit: int | None,
        stats: ProtocolStats,
    ) -> None:
        self.key_holder = key_holder
        self.server = server
        self.codes = codes
        self.labels = labels
        self.unique_limit = unique_limit
        self.stats = stats
        self.num_unique = 0

    def check_unique_limit(self, client: int, new_positions: list[int]) -> None:
        """Raise if the labels at ``new_positions`` of ``client`` overflow the bound."""
        total = self.num_unique + len(new_positions)
        if self.unique_limit is not None and total > self.unique_limit:
            new_labels = ", ".join(repr(self.labels[client][i]) for i in new_positions)
            raise RegistryError(
                f"client {client} brings unique label number {total} (new: {new_labels}), "
                f"more than the bound of {self.unique_limit} (num_classes, max_unique or the "
                "packing bound); raise the bound"
            )

    def no_match(self, client: int, position: int) -> RegistryError:
        return RegistryError(
            f"client {client}: label {self.labels[client][position]!r} matches no discovered "
            f"unique label; the bound of {self.unique_limit} (num_classes or max_unique) is "
            "below the number of distinct labels"
        )

    def discovery_done(self) -> bool:
        # the paper: once U holds every class, remaining clients' labels are not processed
        return self.unique_limit is not None and self.num_unique >= self.unique_limit

    def discover(self) -> None:
        raise NotImplementedError

    def map_labels(self) -> list[list[int]]:
        """Index in ``U`` of each client's labels, in its mapping order."""
        raise NotImplementedError

    def aggregate(
        self, client_placeholders: list[list[int]], client_counts: list[list[int]]
    ) -> np.ndarray:
        """Global count per placeholder, decrypted by the key holder and rounded."""
        raise NotImplementedError

    def decrypt_counts(self, blob: bytes, sender: str) -> np.ndarray:
        values = self.key_holder.decrypt(blob, sender, COUNT_LIMIT, self.stats)
        return np.rint(values).astype(np.int64)


class _NaiveRun(_ProtocolRun):
    """One ciphertext per label and count; a subtraction per comparison (the paper)."""

    vector_size = 1

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.unique: list[ts.CKKSVector] = []  # server side: U, one ciphertext per label
        self.label_vectors: dict[int, list[ts.CKKSVector]] = {}  # server side, per client

    def labels_of(self, client: int) -> list[ts.CKKSVector]:
        """Client ``client``'s label ciphertexts at the server, uploaded on first use."""
        if client not in self.label_vectors:
            sender = f"client {client}"
            self.label_vectors[client] = [
                self.server.receive(
                    self.key_holder.encrypt(np.array([code]), self.stats), sender, 1
                )
                for code in self.codes[client]
            ]
        return self.label_vectors[client]

    def find(self, client: int, label: ts.CKKSVector, candidates: int) -> int | None:
        """Index of the first of ``U[:candidates]`` equal to ``label``, comparing one by one."""
        sender = f"client {client}"
        for index in range(candidates):
            difference = self.server.subtract(label, self.unique[index], self.stats)
            value = self.key_holder.decrypt(
                difference, sender, self.key_holder.hash_range, self.stats
            )[0]
            if abs(value) < MATCH_THRESHOLD:
                return index
        return None

    def discover(self) -> None:
        for client in range(len(self.codes)):
            if self.discovery_done():
                break
            labels = self.labels_of(client)
            known = len(self.unique)  # a client's own labels are distinct: compare with U as before
            new_positions = [
                position
                for position, label in enumerate(labels)
                if self.find(client, label, known) is None
            ]
            self.check_unique_limit(client, new_positions)
            self.unique.extend(labels[position] for position in new_positions)
            self.num_unique = len(self.unique)

    def map_labels(self) -> list[list[int]]:
        indices = []
        for client in range(len(self.codes)):
            client_indices = []
            for position, label in enumerate(self.labels_of(client)):
                index = self.find(client, label, len(self.unique))
                if index is None:
                    raise self.no_match(client, position)
                client_indices.append(index)
            indices.append(client_indices)
        return indices

    def aggregate(
        self, client_placeholders: list[list[int]], client_counts: list[list[int]]
    ) -> np.ndarray:
        totals: list[ts.CKKSVector | None] = [None] * self.num_unique
        owners: list[list[int]] = [[] for _ in range(self.num_unique)]
        for client, (placeholders, counts) in enumerate(zip(client_placeholders, client_counts)):
            for placeholder, count in zip(placeholders, counts):
                blob = self.key_holder.encrypt(np.array([count]), self.stats)
                vector = self.server.receive(blob, f"client {client}", 1)
                totals[placeholder] = self.server.add(totals[placeholder], vector, self.stats)
                owners[placeholder].append(client)
        global_counts = np.zeros(self.num_unique, dtype=np.int64)
        for placeholder, total in enumerate(totals):
            sender = "clients " + ",".join(map(str, owners[placeholder]))
            # a lone client's count is its own ciphertext: re-serialize for the key holder
            global_counts[placeholder] = self.decrypt_counts(total.serialize(), sender)[0]
        return global_counts


class _PackedRun(_ProtocolRun):
    """SIMD slots: a block of labels against all of ``U`` in one subtraction.

    Parameters
    ----------
    block_size : int
        ``B``: slots per block, at least the number of unique labels.
    *args, **kwargs
        As :class:`_ProtocolRun`.
    """

    def __init__(self, *args, block_size: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        slots = self.key_holder.parameters.slots
        self.vector_size = slots  # every vector is padded to all slots
        self.block_size = block_size
        self.labels_per_vector = slots // block_size
        self.stats.block_size = block_size
        self.unique_tile: ts.CKKSVector | None = None  # server side: U tiled over blocks
        self.label_vectors: dict[int, list[ts.CKKSVector]] = {}  # server side, per client

    def chunks(self, client: int) -> list[list[int]]:
        step = self.labels_per_vector
        codes = self.codes[client]
        return [codes[start : start + step] for start in range(0, len(codes), step)]

    def labels_of(self, client: int) -> list[ts.CKKSVector]:
        """Client ``client``'s label vectors at the server (label j replicated over block j)."""
        if client not in self.label_vectors:
            vectors = []
            for chunk in self.chunks(client):
                values = np.zeros(self.vector_size)
                values[: len(chunk) * self.block_size] = np.repeat(chunk, self.block_size)
                blob = self.key_holder.encrypt(values, self.stats)
                vectors.append(self.server.receive(blob, f"client {client}", self.vector_size))
            self.label_vectors[client] = vectors
        return self.label_vectors[client]

    def matches(self, client: int) -> list[list[int]]:
        """Per label of ``client``: the indices ``i < |U|`` with ``code == u_i``."""
        sender = f"client {client}"
        found = []
        for chunk, vector in zip(self.chunks(client), self.labels_of(client)):
            difference = self.server.subtract(vector, self.unique_tile, self.stats)
            values = self.key_holder.decrypt(
                difference, sender, self.key_holder.hash_range, self.stats
            )
            blocks = values[: len(chunk) * self.block_size].reshape(len(chunk), self.block_size)
            equal = np.abs(blocks[:, : self.num_unique]) < MATCH_THRESHOLD
            found.extend(np.flatnonzero(row).tolist() for row in equal)
        return found

    def append_unique(self, client: int, new_codes: list[int]) -> None:
        """Client ``client`` adds its new labels to the tile: ``U += Enc(delta)``."""
        delta = np.zeros(self.block_size)
        delta[self.num_unique : self.num_unique + len(new_codes)] = new_codes
        values = np.zeros(self.vector_size)
        values[: self.labels_per_vector * self.block_size] = np.tile(delta, self.labels_per_vector)
        blob = self.key_holder.encrypt(values, self.stats)
        vector = self.server.receive(blob, f"client {client}", self.vector_size)
        self.unique_tile = self.server.add(self.unique_tile, vector, self.stats)
        self.num_unique += len(new_codes)

    def discover(self) -> None:
        for client, client_codes in enumerate(self.codes):
            if self.discovery_done():
                break
            if self.unique_tile is None:
                new_positions = list(range(len(client_codes)))  # the first client's are all new
            else:
                found = self.matches(client)
                new_positions = [position for position, hits in enumerate(found) if not hits]
            if new_positions:
                self.check_unique_limit(client, new_positions)
                self.append_unique(client, [client_codes[i] for i in new_positions])

    def map_labels(self) -> list[list[int]]:
        indices = []
        for client in range(len(self.codes)):
            found = self.matches(client)
            for position, hits in enumerate(found):
                if not hits:
                    raise self.no_match(client, position)
                if len(hits) > 1:  # U entries are distinct codes, so only tampering does this
                    raise RegistryError(
                        f"client {client}: label {self.labels[client][position]!r} matches "
                        f"{len(hits)} unique labels at once"
                    )
            indices.append([hits[0] for hits in found])
        return indices

    def aggregate(
        self, client_placeholders: list[list[int]], client_counts: list[list[int]]
    ) -> np.ndarray:
        total = None
        for client, (placeholders, counts) in enumerate(zip(client_placeholders, client_counts)):
            values = np.zeros(self.vector_size)
            values[placeholders] = counts  # each count at its placeholder's slot
            blob = self.key_holder.encrypt(values, self.stats)
            vector = self.server.receive(blob, f"client {client}", self.vector_size)
            total = self.server.add(total, vector, self.stats)
        if total is None:  # unreachable: validated input has at least one client
            raise RegistryError("no clients to aggregate")
        counts = self.decrypt_counts(total.serialize(), "aggregate of all clients")
        return counts[: self.num_unique]


class CKKSRegistry(LabelRegistry):
    """Placeholder registry over CKKS (TenSEAL), ``naive`` or ``packed`` protocol.

    Gives exactly :class:`~stratify.registry.plain.PlainRegistry`'s result for the same
    seed and input. :meth:`register` either completes or raises
    :class:`~stratify.errors.RegistryError` with :attr:`result`, :attr:`timings` and
    :attr:`stats` unchanged.

    Parameters
    ----------
    seed : int
        Seed of the placeholder assignment (and of the default hash key).
    protocol : {"packed", "naive"}
        How labels and counts are laid out in ciphertexts.
    hash_key : bytes, optional
        Key of the clients' keyed label hash; default derived from ``seed``.
    label_hash : callable, optional
        Replaces the keyed hash (``label -> int`` in ``[0, LABEL_HASH_RANGE)``); codes
        are range-checked.
    max_unique : int, optional
        Bound on the number of unique labels when ``num_classes`` is not given; sets the
        packed block size. Default: the clients' total label count, capped at the slots.
    parameters : CKKSParameters, optional
        Encryption parameters.

    Attributes
    ----------
    timings : dict
        Seconds of the last registration: ``setup_s`` (key generation, when it happened
        in that call), ``unique_s``, ``mapping_s``, ``aggregation_s`` (client and server
        work both counted).
    stats : ProtocolStats or None
        Counters of the last registration.
    """

    name = "ckks"

    def __init__(
        self,
        seed: int = 0,
        protocol: str = "packed",
        *,
        hash_key: bytes | None = None,
        label_hash: Callable[[Hashable], int] | None = None,
        max_unique: int | None = None,
        parameters: CKKSParameters | None = None,
    ) -> None:
        super().__init__(seed=seed)
        if protocol not in PROTOCOLS:
            raise RegistryError(
                f"unknown CKKS protocol {protocol!r}; use one of {', '.join(PROTOCOLS)}"
            )
        if max_unique is not None and (int(max_unique) != max_unique or max_unique < 1):
            raise RegistryError(f"max_unique must be a positive integer, got {max_unique!r}")
        self.protocol = protocol
        self.name = f"ckks-{protocol}"
        self.max_unique = max_unique
        self.parameters = parameters or CKKSParameters()
        self.label_hash = label_hash or KeyedLabelHash(hash_key or seeded_hash_key(seed))
        self.timings: dict[str, float] = {}
        self.stats: ProtocolStats | None = None
        self._roles: tuple[KeyHolder, Server] | None = None

    def roles(self) -> tuple[KeyHolder, Server]:
        """The key holder and the server, created on first use (key generation ~30 ms)."""
        if self._roles is None:
            key_holder = KeyHolder(self.parameters, self.label_hash)
            self._roles = (key_holder, Server(key_holder.public_context()))
        return self._roles

    def register(
        self, client_labels: Sequence[Mapping[Hashable, int]], num_classes: int | None = None
    ) -> RegistryResult:
        validate_client_labels(client_labels)
        if num_classes is not None and (
            isinstance(num_classes, bool)
            or not isinstance(num_classes, (int, np.integer))
            or num_classes < 1
        ):
            raise RegistryError(f"num_classes must be a positive integer, got {num_classes!r}")
        client_counts = [[int(count) for count in counts.values()] for counts in client_labels]
        total_count = sum(map(sum, client_counts))
        if total_count > COUNT_LIMIT:
            raise RegistryError(
                f"{total_count} samples in all; the CKKS registry counts at most {COUNT_LIMIT}"
            )
        stats = ProtocolStats()
        start = time.perf_counter()
        key_holder, server = self.roles()
        setup_s = time.perf_counter() - start

        start = time.perf_counter()
        codes = key_holder.encode(client_labels)  # each client hashes its own labels
        labels = [list(counts) for counts in client_labels]
        unique_limit = num_classes if num_classes is not None else self.max_unique
        run: _ProtocolRun
        if self.protocol == "naive":
            run = _NaiveRun(key_holder, server, codes, labels, unique_limit, stats)
        else:
            slots = self.parameters.slots
            # B must hold every unique label; without a bound, the clients' total label
            # count is one the server can know (it receives that many labels anyway)
            block_size = min(unique_limit or sum(map(len, codes)), slots)
            unique_limit = block_size if unique_limit is None else min(unique_limit, slots)
            run = _PackedRun(
                key_holder, server, codes, labels, unique_limit, stats, block_size=block_size
            )
        run.discover()
        unique_s = time.perf_counter() - start

        start = time.perf_counter()
        unique_indices = run.map_labels()
        placeholder_of_index = assign_placeholders(run.num_unique, self.seed)
        client_placeholders = [
            [int(placeholder_of_index[index]) for index in indices] for indices in unique_indices
        ]
        client_maps = [
            dict(zip(counts, placeholders))
            for counts, placeholders in zip(client_labels, client_placeholders)
        ]
        mapping_s = time.perf_counter() - start

        start = time.perf_counter()
        global_counts = run.aggregate(client_placeholders, client_counts)
        aggregation_s = time.perf_counter() - start

        result = RegistryResult(run.num_unique, client_maps, global_counts)
        self.timings = {
            "setup_s": setup_s,
            "unique_s": unique_s,
            "mapping_s": mapping_s,
            "aggregation_s": aggregation_s,
        }
        self.stats = stats
        self.result = result
        return result


def same_result(first: RegistryResult, second: RegistryResult) -> bool:
    """Whether two registrations are identical: placeholder count, every client map
    (labels and placeholders) and the global counts."""
    return (
        first.num_placeholders == second.num_placeholders
        and first.client_maps == second.client_maps
        and np.array_equal(first.global_counts, second.global_counts)
    )
