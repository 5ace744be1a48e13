"""The two registration protocols: the messages between key holder and server.

* ``naive`` (the paper): one ciphertext per label and per count, one subtraction per
  comparison, each difference decrypted on its own.
* ``packed`` (SIMD slots): with a block size ``B`` no smaller than the number of unique
  labels, a client's labels are replicated over blocks of ``B`` slots (label ``j`` fills
  block ``j``) and the unique list ``U`` is tiled the same way (``u_i`` at slot ``i`` of
  every block), so one subtraction compares ``slots // B`` labels against all of ``U``. A
  client's counts sit at their placeholder slots of one ciphertext, so aggregation is one
  addition per client. No rotations are needed, hence no Galois keys.

A run outlives its registration: :meth:`_ProtocolRun.add_label` and
:meth:`_ProtocolRun.add_count` register one more label of one client against the same
``U`` and the same encrypted count totals (the stream's incremental registration).
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np
import tenseal as ts

from stratify.errors import RegistryError
from stratify.registry.ckks.encoding import COUNT_LIMIT, MATCH_THRESHOLD
from stratify.registry.ckks.roles import KeyHolder, Server
from stratify.registry.ckks.stats import ProtocolStats

PROTOCOLS = ("naive", "packed")
#: Packed block size of a registration that starts empty and has no bound; it doubles
#: (U re-sent in the wider layout) whenever a new label would not fit.
START_BLOCK_SIZE = 16


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
    code_owner : dict, optional
        The key holder's code -> (first label, client) of every label encoded so far, to
        detect a collision with a label registered later.
    """

    vector_size: int
    label_vectors: dict[int, list[ts.CKKSVector]]  # server side: each client's label ciphertexts

    def __init__(
        self,
        key_holder: KeyHolder,
        server: Server,
        codes: list[list[int]],
        labels: list[list[Hashable]],
        unique_limit: int | None,
        stats: ProtocolStats,
        code_owner: dict[int, tuple[Hashable, int]] | None = None,
    ) -> None:
        self.key_holder = key_holder
        self.server = server
        self.codes = codes
        self.labels = labels
        self.unique_limit = unique_limit
        self.stats = stats
        self.code_owner = code_owner if code_owner is not None else {}
        self.num_unique = 0
        #: clients' side: the code of every entry of U, in order, known to the client that
        #: contributed it
        self.unique_codes: list[int] = []

    def check_unique_limit(self, client: int, new_labels: list[Hashable]) -> None:
        """Raise if ``client``'s ``new_labels`` overflow the bound."""
        total = self.num_unique + len(new_labels)
        if self.unique_limit is not None and total > self.unique_limit:
            new_labels_text = ", ".join(map(repr, new_labels))
            raise RegistryError(
                f"client {client} brings unique label number {total} (new: {new_labels_text}), "
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

    def add_label(self, client: int, code: int, label: Hashable) -> int:
        """Discovery and mapping of one label that ``client`` starts to hold.

        The label's ciphertext is compared with all of ``U``; with no match it is appended.
        ``client`` is a known client or the next one. Returns the label's index in ``U``.
        Raises before changing anything when the label would overflow the bound.
        """
        index = self.find_code(client, code)
        if index is None:
            self.check_unique_limit(client, [label])
            self.prepare_append(client, label)
        if client == len(self.codes):
            self.codes.append([])
            self.labels.append([])
        self.codes[client].append(code)
        self.labels[client].append(label)
        self.forget_label_vectors(client)
        if index is None:
            self.append_code(client, code)
            index = self.num_unique - 1
        return index

    def find_code(self, client: int, code: int) -> int | None:
        """Index of ``client``'s new label (``code``) in ``U``, or ``None``."""
        raise NotImplementedError

    def prepare_append(self, client: int, label: Hashable) -> None:
        """Make room in ``U`` for one more label (packed: a wider block), or raise."""

    def append_code(self, client: int, code: int) -> None:
        """``client`` appends its label ``code`` to ``U``."""
        raise NotImplementedError

    def forget_label_vectors(self, client: int) -> None:
        """Drop the server's ciphertexts of ``client``'s labels: its label list changed."""
        self.label_vectors.pop(client, None)

    def add_count(
        self, client: int, placeholder: int, count: int, global_counts: np.ndarray
    ) -> np.ndarray:
        """``client`` adds ``count`` samples of ``placeholder`` to the encrypted totals; the
        global counts after it (``global_counts`` may lack the new placeholder)."""
        raise NotImplementedError


class _NaiveRun(_ProtocolRun):
    """One ciphertext per label and count; a subtraction per comparison (the paper)."""

    vector_size = 1

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.unique: list[ts.CKKSVector] = []  # server side: U, one ciphertext per label
        self.label_vectors: dict[int, list[ts.CKKSVector]] = {}  # server side, per client
        self.totals: list[ts.CKKSVector | None] = []  # server side: encrypted count per placeholder
        self.new_vector: ts.CKKSVector | None = None  # the last label compared by find_code

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
            self.check_unique_limit(client, [self.labels[client][i] for i in new_positions])
            self.unique.extend(labels[position] for position in new_positions)
            self.unique_codes.extend(self.codes[client][i] for i in new_positions)
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
        self.totals = [None] * self.num_unique
        owners: list[list[int]] = [[] for _ in range(self.num_unique)]
        for client, (placeholders, counts) in enumerate(zip(client_placeholders, client_counts)):
            for placeholder, count in zip(placeholders, counts):
                self.add_encrypted_count(client, placeholder, count)
                owners[placeholder].append(client)
        global_counts = np.zeros(self.num_unique, dtype=np.int64)
        for placeholder in range(self.num_unique):
            sender = "clients " + ",".join(map(str, owners[placeholder]))
            global_counts[placeholder] = self.decrypt_total(placeholder, sender)
        return global_counts

    def add_encrypted_count(self, client: int, placeholder: int, count: int) -> None:
        blob = self.key_holder.encrypt(np.array([count]), self.stats)
        vector = self.server.receive(blob, f"client {client}", 1)
        self.totals[placeholder] = self.server.add(self.totals[placeholder], vector, self.stats)

    def decrypt_total(self, placeholder: int, sender: str) -> int:
        total = self.totals[placeholder]
        assert total is not None  # every placeholder was discovered from some client's label
        # a lone client's count is its own ciphertext: re-serialize for the key holder
        return int(self.decrypt_counts(total.serialize(), sender)[0])

    def find_code(self, client: int, code: int) -> int | None:
        blob = self.key_holder.encrypt(np.array([code]), self.stats)
        self.new_vector = self.server.receive(blob, f"client {client}", 1)
        return self.find(client, self.new_vector, len(self.unique))

    def append_code(self, client: int, code: int) -> None:
        assert self.new_vector is not None  # find_code compared it first
        self.unique.append(self.new_vector)
        self.unique_codes.append(code)
        self.num_unique += 1

    def add_count(
        self, client: int, placeholder: int, count: int, global_counts: np.ndarray
    ) -> np.ndarray:
        self.totals += [None] * (self.num_unique - len(self.totals))
        self.add_encrypted_count(client, placeholder, count)
        counts = np.zeros(self.num_unique, dtype=np.int64)
        counts[: len(global_counts)] = global_counts
        counts[placeholder] = self.decrypt_total(placeholder, f"clients holding {placeholder}")
        return counts


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
        self.total: ts.CKKSVector | None = None  # server side: counts at placeholder slots

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
        found: list[list[int]] = []
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
        self.unique_codes.extend(new_codes)

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
                self.check_unique_limit(client, [self.labels[client][i] for i in new_positions])
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
        for client, (placeholders, counts) in enumerate(zip(client_placeholders, client_counts)):
            self.add_encrypted_counts(client, placeholders, counts)
        if self.total is None:  # unreachable: validated input has at least one client
            raise RegistryError("no clients to aggregate")
        global_counts = self.decrypt_counts(self.total.serialize(), "aggregate of all clients")
        return global_counts[: self.num_unique]

    def add_encrypted_counts(self, client: int, placeholders: list[int], counts: list[int]) -> None:
        values = np.zeros(self.vector_size)
        values[placeholders] = counts  # each count at its placeholder's slot
        blob = self.key_holder.encrypt(values, self.stats)
        vector = self.server.receive(blob, f"client {client}", self.vector_size)
        self.total = self.server.add(self.total, vector, self.stats)

    def find_code(self, client: int, code: int) -> int | None:
        if self.unique_tile is None:
            return None
        values = np.zeros(self.vector_size)
        values[: self.block_size] = code  # block 0 against all of U
        blob = self.key_holder.encrypt(values, self.stats)
        vector = self.server.receive(blob, f"client {client}", self.vector_size)
        difference = self.server.subtract(vector, self.unique_tile, self.stats)
        decrypted = self.key_holder.decrypt(
            difference, f"client {client}", self.key_holder.hash_range, self.stats
        )
        hits = np.flatnonzero(np.abs(decrypted[: self.num_unique]) < MATCH_THRESHOLD)
        if len(hits) > 1:  # U entries are distinct codes, so only tampering does this
            raise RegistryError(
                f"client {client}: a new label matches {len(hits)} unique labels at once"
            )
        return int(hits[0]) if len(hits) else None

    def prepare_append(self, client: int, label: Hashable) -> None:
        if self.num_unique < self.block_size:
            return
        slots = self.key_holder.parameters.slots
        if self.block_size >= slots:
            raise RegistryError(
                f"client {client}: label {label!r} would be unique label number "
                f"{self.num_unique + 1}, more than the {slots} slots of a packed ciphertext; "
                "use the naive protocol"
            )
        self.widen_blocks(min(2 * self.block_size, slots))

    def widen_blocks(self, block_size: int) -> None:
        """Lay ``U`` out in blocks of ``block_size`` slots: the clients re-send its codes.

        Every label vector the server holds was laid out for the old block size, so they
        are dropped and re-sent on their next use.
        """
        self.block_size = block_size
        self.labels_per_vector = self.key_holder.parameters.slots // block_size
        self.stats.block_size = block_size
        self.label_vectors.clear()
        block = np.zeros(block_size)
        block[: self.num_unique] = self.unique_codes
        values = np.zeros(self.vector_size)
        values[: self.labels_per_vector * block_size] = np.tile(block, self.labels_per_vector)
        blob = self.key_holder.encrypt(values, self.stats)
        self.unique_tile = self.server.receive(blob, "clients", self.vector_size)

    def append_code(self, client: int, code: int) -> None:
        self.append_unique(client, [code])

    def add_count(
        self, client: int, placeholder: int, count: int, global_counts: np.ndarray
    ) -> np.ndarray:
        self.add_encrypted_counts(client, [placeholder], [count])
        assert self.total is not None  # just added to
        counts = self.decrypt_counts(self.total.serialize(), f"aggregate after client {client}")
        return counts[: self.num_unique]
