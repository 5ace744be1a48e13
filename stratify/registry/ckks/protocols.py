"""The registration protocols' layouts: the messages between key holder and server.

* ``naive`` (the paper): one ciphertext per label and per count, one subtraction per
  comparison, each difference decrypted on its own.
* ``packed`` (SIMD slots): with a block size ``B`` no smaller than the number of unique
  labels, a client's labels are replicated over blocks of ``B`` slots (label ``j`` fills
  block ``j``) and the unique list ``U`` is tiled the same way (``u_i`` at slot ``i`` of
  every block), so one subtraction compares ``slots // B`` labels against all of ``U``. A
  client's counts sit at their placeholder slots of one ciphertext, so aggregation is one
  addition per client. No rotations are needed, hence no Galois keys.

A run works with either pair of roles (:mod:`.roles`): CKKS for ``naive`` and ``packed``,
BFV for ``naive-blind`` and ``packed-blind``, where the server blinds every comparison and
masks every count before the key holder decrypts. The layouts and messages are the same.
When a blinded result fails its check, the run finds which ciphertext was bad by having
the server reveal each one it was computed from on its own (masked, so nothing leaks),
and names that ciphertext's sender.

A run outlives its registration: :meth:`_ProtocolRun.add_label` and
:meth:`_ProtocolRun.add_count` register one more label of one client against the same
``U`` and the same encrypted count totals (the stream's incremental registration).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from stratify.errors import RegistryError
from stratify.registry.ckks.encoding import COUNT_LIMIT, MATCH_THRESHOLD
from stratify.registry.ckks.roles import KeyHolderRole, ServerRole, Vector
from stratify.registry.ckks.stats import ProtocolStats

#: a ciphertext the server holds and who sent it, for naming a tampered one
Part = tuple[Vector, str]
#: Packed block size of a registration that starts empty and has no bound; it doubles
#: (U re-sent in the wider layout) whenever a new label would not fit.
START_BLOCK_SIZE = 16
#: the one slot a naive vector holds
SLOT_ZERO = np.array([0])


def packed_block_size(
    unique_limit: int | None, labels_total: int, data_slots: int
) -> tuple[int, int]:
    """The packed layout's block size ``B`` of a registration, and its bound on unique labels.

    ``B`` must hold every unique label; without a bound (``num_classes`` or
    ``max_unique``), the clients' total number of labels is one the server can know (it
    receives that many labels anyway).

    Parameters
    ----------
    unique_limit : int or None
        The declared bound on unique labels.
    labels_total : int
        Every client's number of labels, added up.
    data_slots : int
        Slots a protocol may fill in one ciphertext.
    """
    block_size = min(unique_limit or labels_total, data_slots)
    return block_size, block_size if unique_limit is None else min(unique_limit, data_slots)


@dataclass(frozen=True)
class PackedLayout:
    """Where the packed protocols put labels, unique labels and counts in a vector's slots.

    Every party computes with it: a client lays out its labels, its additions to ``U`` and
    its counts; the server picks the compared slots; the key holder reads the match rows.
    In-process (:class:`_PackedRun`) and over Flower (docs/flower.md) alike.

    Parameters
    ----------
    block_size : int
        ``B``: slots per block, at least the number of unique labels.
    data_slots : int
        Slots a vector holds (every vector is padded to all of them).
    """

    block_size: int
    data_slots: int

    @property
    def labels_per_vector(self) -> int:
        return self.data_slots // self.block_size

    def chunks(self, codes: Sequence[int]) -> list[list[int]]:
        """``codes`` cut into the runs that one label vector holds each.

        Parameters
        ----------
        codes : sequence of int
            A client's label codes, in its order.
        """
        step = self.labels_per_vector
        return [list(codes[start : start + step]) for start in range(0, len(codes), step)]

    def label_values(self, codes: Sequence[int]) -> np.ndarray:
        """A label vector: code ``j`` replicated over block ``j``.

        Parameters
        ----------
        codes : sequence of int
            At most :attr:`labels_per_vector` codes.
        """
        values = np.zeros(self.data_slots, dtype=np.int64)
        values[: len(codes) * self.block_size] = np.repeat(
            np.asarray(codes, dtype=np.int64), self.block_size
        )
        return values

    def tile_values(self, codes: Sequence[int], first: int) -> np.ndarray:
        """``codes`` at slots ``first, first + 1, ...`` of every block: the unique labels
        ``first..`` of the tile (``first=0`` and all of ``U``: the whole tile).

        Parameters
        ----------
        codes : sequence of int
            Codes of unique labels.
        first : int
            Their index in ``U``.
        """
        block = np.zeros(self.block_size, dtype=np.int64)
        block[first : first + len(codes)] = codes
        values = np.zeros(self.data_slots, dtype=np.int64)
        values[: self.labels_per_vector * self.block_size] = np.tile(block, self.labels_per_vector)
        return values

    def count_values(self, placeholders: Sequence[int], counts: Sequence[int]) -> np.ndarray:
        """A client's counts, each at its placeholder's slot.

        Parameters
        ----------
        placeholders, counts : sequence of int
            Each of its labels' placeholder and count.
        """
        values = np.zeros(self.data_slots, dtype=np.int64)
        values[list(placeholders)] = counts
        return values

    def compared_slots(self, labels: int, num_unique: int) -> np.ndarray:
        """The slots comparing ``labels`` labels with ``U``: the first ``|U|`` of each block.

        Parameters
        ----------
        labels, num_unique : int
            Labels in the compared vector, and ``|U|``.
        """
        starts = np.arange(labels)[:, None] * self.block_size
        return (starts + np.arange(num_unique)[None, :]).ravel()

    def rows(self, values: np.ndarray, labels: int, num_unique: int) -> np.ndarray:
        """A decrypted comparison of ``labels`` labels with ``U``: one row per label, one
        column per entry of ``U`` (zero where they are equal).

        Parameters
        ----------
        values : numpy.ndarray
            The decrypted comparison.
        labels, num_unique : int
            Labels in the compared vector, and ``|U|``.
        """
        blocks = values[: labels * self.block_size].reshape(labels, self.block_size)
        return blocks[:, :num_unique]


def matching(rows: np.ndarray) -> np.ndarray:
    """Which entries of a comparison's :meth:`PackedLayout.rows` are matches.

    Parameters
    ----------
    rows : numpy.ndarray
        Decrypted differences (CKKS) or blinded residues (BFV).
    """
    return np.abs(rows) < MATCH_THRESHOLD


def unique_index(client: int, name: str, hits: Sequence[int], bound: int | None) -> int:
    """The one entry of ``U`` that a client's label matched in the mapping.

    Parameters
    ----------
    client : int
        The client.
    name : str
        How the error names the label: ``label 'x'`` where the client speaks, its position
        in the client's encoding order where the server does (over Flower).
    hits : sequence of int
        The entries of ``U`` that matched.
    bound : int or None
        The bound on unique labels, which a label matching none was above.
    """
    if len(hits) == 0:
        raise RegistryError(
            f"client {client}: {name} matches no discovered unique label; the bound of "
            f"{bound} (num_classes or max_unique) is below the number of distinct labels"
        )
    if len(hits) > 1:  # U entries are distinct codes, so only tampering does this
        raise RegistryError(f"client {client}: {name} matches {len(hits)} unique labels at once")
    return int(hits[0])


class _ProtocolRun:
    """One registration's messages between the key holder and the server.

    Parameters
    ----------
    key_holder, server : KeyHolderRole, ServerRole
        The two roles (CKKS, or BFV for the blinded protocols).
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
    label_vectors: dict[int, list[Vector]]  # server side: each client's label ciphertexts

    def __init__(
        self,
        key_holder: KeyHolderRole,
        server: ServerRole,
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

    def decrypt(self, blob: bytes, sender: str, limit: float, parts: list[Part]) -> np.ndarray:
        """The key holder decrypts ``blob``, computed by the server from ``parts``.

        A blinded result that fails its check is traced to the part that caused it: each
        is revealed on its own, masked, and the first that fails names its sender. When
        none does, the error names ``sender``.
        """
        try:
            return self.key_holder.decrypt(blob, sender, limit, self.stats)
        except RegistryError:
            if self.server.check_slots:
                for vector, part_sender in parts:
                    size = vector.size() - self.server.check_slots
                    part, _ = self.server.reveal(vector, np.arange(size), self.stats)
                    self.key_holder.decrypt(part, part_sender, limit, self.stats)
            raise

    def compare(
        self, client: int, vector: Vector, unique: Vector, compared: np.ndarray, parts: list[Part]
    ) -> np.ndarray:
        """What the key holder decrypts of ``client``'s ``vector`` against ``unique``: zero
        exactly at the ``compared`` slots where they are equal (blinded: only there).

        ``parts`` are the ciphertexts ``unique`` was built from, with their senders.
        """
        sender = f"client {client}"
        blob = self.server.compare(vector, unique, compared, self.stats)
        return self.decrypt(blob, sender, self.key_holder.hash_range, [(vector, sender), *parts])

    def reveal_counts(
        self, total: Vector, positions: np.ndarray, sender: str, parts: list[Part]
    ) -> np.ndarray:
        """The counts at ``positions`` of ``total``, which the server built from ``parts``:
        the key holder decrypts (blinded: masked by the server, which unmasks after)."""
        blob, masks = self.server.reveal(total, positions, self.stats)
        values = self.decrypt(blob, sender, COUNT_LIMIT, parts)
        return self.server.unmask(values, positions, masks)

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
        self.record_labels(client, [code], [label])
        if index is None:
            self.append_code(client, code)
            index = self.num_unique - 1
        return index

    def place_labels(
        self, client: int, codes: list[int], labels: list[Hashable], new: list[bool]
    ) -> list[int]:
        """Labels whose index in ``U`` ``client`` knows (a fresh stream's clients: the
        classifier rows, docs/architecture.md, "Streaming"), so nothing is compared: the
        ``new`` ones (no client holds them) are appended to ``U`` (packed: in one
        ciphertext), the others only recorded; the key holder decrypts nothing. ``client``
        is a known client or the next one. Returns their indices in ``U``; raises before
        changing anything when the new ones would overflow the bound."""
        appended = [code for code, fresh in zip(codes, new) if fresh]
        if appended:
            self.check_unique_limit(client, [label for label, fresh in zip(labels, new) if fresh])
            self.prepare_append(client, labels[new.index(True)], len(appended))
        positions = iter(range(self.num_unique, self.num_unique + len(appended)))
        indices = [
            next(positions) if fresh else self.unique_codes.index(code)
            for code, fresh in zip(codes, new)
        ]
        self.record_labels(client, codes, labels)
        if appended:
            self.append_codes(client, appended)
        return indices

    def record_labels(self, client: int, codes: list[int], labels: list[Hashable]) -> None:
        """``client`` (a known client or the next one) holds ``labels`` (``codes``) now."""
        if client == len(self.codes):
            self.codes.append([])
            self.labels.append([])
        self.codes[client].extend(codes)
        self.labels[client].extend(labels)
        self.forget_label_vectors(client)

    def find_code(self, client: int, code: int) -> int | None:
        """Index of ``client``'s new label (``code``) in ``U``, or ``None``."""
        raise NotImplementedError

    def add_labels(self, client: int, codes: list[int], labels: list[Hashable]) -> list[int]:
        """:meth:`add_label` of several labels ``client`` starts to hold; a layout that
        compares them with ``U`` together overrides it. Returns their indices in ``U``."""
        return [self.add_label(client, code, label) for code, label in zip(codes, labels)]

    def prepare_append(self, client: int, label: Hashable, extra: int = 1) -> None:
        """Make room in ``U`` for ``extra`` more labels (packed: a wider block), or raise."""

    def append_code(self, client: int, code: int) -> None:
        """``client`` appends its label ``code``, just compared with ``U``, to ``U``."""
        raise NotImplementedError

    def append_codes(self, client: int, codes: list[int]) -> None:
        """``client`` appends ``codes``, not compared with ``U``, to ``U``."""
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
        self.unique: list[Vector] = []  # server side: U, one ciphertext per label
        self.unique_senders: list[str] = []  # who sent each entry of U
        self.label_vectors: dict[int, list[Vector]] = {}  # server side, per client
        self.totals: list[Vector | None] = []  # server side: encrypted count per placeholder
        self.new_vector: Vector | None = None  # the last label compared by find_code

    def labels_of(self, client: int) -> list[Vector]:
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

    def find(self, client: int, label: Vector, candidates: int) -> int | None:
        """Index of the first of ``U[:candidates]`` equal to ``label``, comparing one by one."""
        for index in range(candidates):
            part = (self.unique[index], self.unique_senders[index])
            value = self.compare(client, label, self.unique[index], SLOT_ZERO, [part])[0]
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
            self.unique_senders.extend(f"client {client}" for _ in new_positions)
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
        # placeholder by placeholder, so the server holds one placeholder's count
        # ciphertexts at a time
        held: list[list[tuple[int, int]]] = [[] for _ in range(self.num_unique)]
        for client, (placeholders, counts) in enumerate(zip(client_placeholders, client_counts)):
            for placeholder, count in zip(placeholders, counts):
                held[placeholder].append((client, count))
        self.totals = [None] * self.num_unique
        global_counts = np.zeros(self.num_unique, dtype=np.int64)
        for placeholder, owners in enumerate(held):
            parts = [
                self.add_encrypted_count(client, placeholder, count) for client, count in owners
            ]
            sender = "clients " + ",".join(str(client) for client, _ in owners)
            global_counts[placeholder] = self.decrypt_total(placeholder, sender, parts)
        return global_counts

    def add_encrypted_count(self, client: int, placeholder: int, count: int) -> Part:
        """``client`` adds ``count`` to the total of ``placeholder``; its ciphertext."""
        sender = f"client {client}"
        blob = self.key_holder.encrypt(np.array([count]), self.stats)
        vector = self.server.receive(blob, sender, 1)
        self.totals[placeholder] = self.server.add(self.totals[placeholder], vector, self.stats)
        return vector, sender

    def decrypt_total(self, placeholder: int, sender: str, parts: list[Part]) -> int:
        total = self.totals[placeholder]
        assert total is not None  # every placeholder was discovered from some client's label
        return int(self.reveal_counts(total, SLOT_ZERO, sender, parts)[0])

    def find_code(self, client: int, code: int) -> int | None:
        blob = self.key_holder.encrypt(np.array([code]), self.stats)
        self.new_vector = self.server.receive(blob, f"client {client}", 1)
        return self.find(client, self.new_vector, len(self.unique))

    def append_codes(self, client: int, codes: list[int]) -> None:
        for code in codes:
            blob = self.key_holder.encrypt(np.array([code]), self.stats)
            self.new_vector = self.server.receive(blob, f"client {client}", 1)
            self.append_code(client, code)

    def append_code(self, client: int, code: int) -> None:
        assert self.new_vector is not None  # find_code compared it first
        self.unique.append(self.new_vector)
        self.unique_senders.append(f"client {client}")
        self.unique_codes.append(code)
        self.num_unique += 1

    def add_count(
        self, client: int, placeholder: int, count: int, global_counts: np.ndarray
    ) -> np.ndarray:
        self.totals += [None] * (self.num_unique - len(self.totals))
        # the earlier counts in this total passed their check when they were added
        part = self.add_encrypted_count(client, placeholder, count)
        counts = np.zeros(self.num_unique, dtype=np.int64)
        counts[: len(global_counts)] = global_counts
        sender = f"clients holding {placeholder}"
        counts[placeholder] = self.decrypt_total(placeholder, sender, [part])
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
        self.vector_size = self.key_holder.data_slots  # every vector is padded to all slots
        self.layout = PackedLayout(block_size, self.vector_size)
        self.stats.block_size = block_size
        self.unique_tile: Vector | None = None  # server side: U tiled over blocks
        #: the ciphertexts added to the tile since a comparison last checked it
        self.tile_parts: list[Part] = []
        self.label_vectors: dict[int, list[Vector]] = {}  # server side, per client
        self.total: Vector | None = None  # server side: counts at placeholder slots

    @property
    def block_size(self) -> int:
        return self.layout.block_size

    @property
    def labels_per_vector(self) -> int:
        return self.layout.labels_per_vector

    def chunks(self, client: int) -> list[list[int]]:
        return self.layout.chunks(self.codes[client])

    def send(self, client: int, values: np.ndarray) -> Vector:
        """``client`` encrypts ``values`` and the server receives the ciphertext."""
        blob = self.key_holder.encrypt(values, self.stats)
        return self.server.receive(blob, f"client {client}", self.vector_size)

    def labels_of(self, client: int) -> list[Vector]:
        """Client ``client``'s label vectors at the server (label j replicated over block j)."""
        if client not in self.label_vectors:
            self.label_vectors[client] = [
                self.send(client, self.layout.label_values(chunk)) for chunk in self.chunks(client)
            ]
        return self.label_vectors[client]

    def compare_with_unique(self, client: int, vector: Vector, labels: int) -> np.ndarray:
        """``client``'s ``labels`` labels in ``vector`` against ``U``: one row per label."""
        assert self.unique_tile is not None  # U holds a label before anything is compared
        compared = self.layout.compared_slots(labels, self.num_unique)
        values = self.compare(client, vector, self.unique_tile, compared, self.tile_parts)
        self.tile_parts = []  # the tile passed the check: what it holds so far is sound
        return self.layout.rows(values, labels, self.num_unique)

    def matches(self, client: int) -> list[list[int]]:
        """Per label of ``client``: the indices ``i < |U|`` with ``code == u_i``."""
        found: list[list[int]] = []
        for chunk, vector in zip(self.chunks(client), self.labels_of(client)):
            equal = matching(self.compare_with_unique(client, vector, len(chunk)))
            found.extend(np.flatnonzero(row).tolist() for row in equal)
        return found

    def append_unique(self, client: int, new_codes: list[int]) -> None:
        """Client ``client`` adds its new labels to the tile: ``U += Enc(delta)``."""
        vector = self.send(client, self.layout.tile_values(new_codes, self.num_unique))
        self.unique_tile = self.server.add(self.unique_tile, vector, self.stats)
        self.tile_parts.append((vector, f"client {client}"))
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
            labels = self.labels[client]
            indices.append(
                [
                    unique_index(client, f"label {labels[position]!r}", hits, self.unique_limit)
                    for position, hits in enumerate(self.matches(client))
                ]
            )
        return indices

    def aggregate(
        self, client_placeholders: list[list[int]], client_counts: list[list[int]]
    ) -> np.ndarray:
        parts = [
            self.add_encrypted_counts(client, placeholders, counts)
            for client, (placeholders, counts) in enumerate(zip(client_placeholders, client_counts))
        ]
        return self.total_counts("aggregate of all clients", parts)

    def add_encrypted_counts(self, client: int, placeholders: list[int], counts: list[int]) -> Part:
        """``client`` adds its counts to the total; its ciphertext."""
        vector = self.send(client, self.layout.count_values(placeholders, counts))
        self.total = self.server.add(self.total, vector, self.stats)
        return vector, f"client {client}"

    def total_counts(self, sender: str, parts: list[Part]) -> np.ndarray:
        """The global count of every placeholder, from the encrypted total."""
        if self.total is None:  # unreachable: validated input has at least one client
            raise RegistryError("no clients to aggregate")
        return self.reveal_counts(self.total, np.arange(self.num_unique), sender, parts)

    def find_code(self, client: int, code: int) -> int | None:
        if self.unique_tile is None:
            return None
        vector = self.send(client, self.layout.label_values([code]))  # block 0 against U
        hits = np.flatnonzero(matching(self.compare_with_unique(client, vector, 1)[0]))
        if len(hits) > 1:  # U entries are distinct codes, so only tampering does this
            raise RegistryError(
                f"client {client}: a new label matches {len(hits)} unique labels at once"
            )
        return int(hits[0]) if len(hits) else None

    def prepare_append(self, client: int, label: Hashable, extra: int = 1) -> None:
        """Make room in a block for ``extra`` more labels (``label`` the first of them)."""
        if self.num_unique + extra <= self.block_size:
            return
        slots = self.key_holder.data_slots
        if self.num_unique + extra > slots:
            raise RegistryError(
                f"client {client}: label {label!r} would be unique label number "
                f"{self.num_unique + 1}, more than the {slots} slots of a packed ciphertext; "
                "use the naive protocol"
            )
        block_size = self.block_size
        while self.num_unique + extra > block_size:
            block_size = min(2 * block_size, slots)
        self.widen_blocks(block_size)

    def add_labels(self, client: int, codes: list[int], labels: list[Hashable]) -> list[int]:
        # one vector of the new codes (code j over block j) against all of U: one
        # comparison and one decryption for the lot, and one append for the new ones
        if self.unique_tile is None or not 1 < len(codes) <= self.labels_per_vector:
            return super().add_labels(client, codes, labels)
        vector = self.send(client, self.layout.label_values(codes))
        rows = matching(self.compare_with_unique(client, vector, len(codes)))
        found: list[int | None] = []
        for row in rows:
            hits = np.flatnonzero(row)
            if len(hits) > 1:  # U entries are distinct codes, so only tampering does this
                raise RegistryError(
                    f"client {client}: a new label matches {len(hits)} unique labels at once"
                )
            found.append(int(hits[0]) if len(hits) else None)
        new = [position for position, index in enumerate(found) if index is None]
        if new:
            self.check_unique_limit(client, [labels[position] for position in new])
            self.prepare_append(client, labels[new[0]], len(new))
        self.record_labels(client, codes, labels)
        if new:
            first = self.num_unique
            self.append_unique(client, [codes[position] for position in new])
            for offset, position in enumerate(new):
                found[position] = first + offset
        return [int(index) for index in found]  # type: ignore[arg-type]

    def widen_blocks(self, block_size: int) -> None:
        """Lay ``U`` out in blocks of ``block_size`` slots: the clients re-send its codes.

        Every label vector the server holds was laid out for the old block size, so they
        are dropped and re-sent on their next use.
        """
        self.layout = PackedLayout(block_size, self.vector_size)
        self.stats.block_size = block_size
        self.label_vectors.clear()
        blob = self.key_holder.encrypt(self.layout.tile_values(self.unique_codes, 0), self.stats)
        self.unique_tile = self.server.receive(blob, "clients", self.vector_size)
        self.tile_parts = [(self.unique_tile, "clients")]

    def append_code(self, client: int, code: int) -> None:
        self.append_unique(client, [code])

    def append_codes(self, client: int, codes: list[int]) -> None:
        self.append_unique(client, codes)  # one ciphertext for them all

    def add_count(
        self, client: int, placeholder: int, count: int, global_counts: np.ndarray
    ) -> np.ndarray:
        # the counts in the total before this one passed their check when they were added
        part = self.add_encrypted_counts(client, [placeholder], [count])
        return self.total_counts(f"aggregate after client {client}", [part])

    def add_counts(self, counts: dict[int, dict[int, int]]) -> np.ndarray:
        """Every client adds its ``counts[client][placeholder]`` to the encrypted total;
        the global counts after."""
        # one ciphertext per client, each count at its placeholder's slot, one decryption
        parts = [
            self.add_encrypted_counts(client, list(held), list(held.values()))
            for client, held in counts.items()
        ]
        clients = ",".join(map(str, counts))
        return self.total_counts(f"aggregate after clients {clients}", parts)
