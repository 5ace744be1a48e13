"""The encrypted registry over Flower: each party of the packed protocols on its own node.

In-process, :class:`~stratify.registry.ckks.CKKSRegistry` plays every party in one
object. Here the server app is the :class:`~stratify.registry.ckks.roles.ServerRole`
(:class:`SecureRegistration`); every node encodes and encrypts its own labels and counts
(:class:`ClientRegistration`), with the keys the clients share
(:mod:`stratify.flower.keys`) and its own order key, which no other party holds; client
0's node is also the key holder, which decrypts the server's blinded comparisons and
masked total. All of them lay out their vectors with the in-process
:class:`~stratify.registry.ckks.protocols.PackedLayout`, and the result is
:class:`~stratify.registry.ckks.CKKSRegistry`'s for the same shared secret and order keys
(docs/flower.md, "The encrypted registry").
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, cast

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from stratify.errors import RegistryError
from stratify.federation import Federation
from stratify.flower.keys import SCHEMES, FederationKeys
from stratify.flower.messages import (
    COUNTS,
    LABELS,
    MATCHES,
    TOTAL,
    UNIQUE,
    index_record,
    read_indices,
)
from stratify.registry.base import RegistryResult
from stratify.registry.ckks.encoding import (
    CHECK_SLOTS,
    COUNT_LIMIT,
    BFVParameters,
    CKKSParameters,
)
from stratify.registry.ckks.protocols import (
    PackedLayout,
    matching,
    packed_block_size,
    unique_index,
)
from stratify.registry.ckks.roles import BlindServer, Server, ServerRole, Vector
from stratify.registry.ckks.stats import ProtocolStats
from stratify.registry.client_secrets import OrderKey

if TYPE_CHECKING:  # the server imports this module
    from stratify.flower.link import NodeLink

#: the client whose node holds the key and decrypts
KEY_HOLDER = 0


def data_slots(protocol: str) -> int:
    """The slots a vector of ``protocol`` holds (public parameters: the registry's defaults,
    as the key file's contexts are made).

    Parameters
    ----------
    protocol : str
        ``packed-blind`` or ``packed``.
    """
    if SCHEMES[protocol] == "bfv":
        return BFVParameters().slots - CHECK_SLOTS
    return CKKSParameters().slots


class ClientRegistration:
    """One client's side of the registration: it encodes, lays out and encrypts its own
    labels and counts, which no other party sees.

    Parameters
    ----------
    keys : FederationKeys
        The clients' shared keys.
    protocol : str
        ``packed-blind`` or ``packed``.
    client : int
        The client's number.
    labels : numpy.ndarray
        The label of each of its samples.
    order_key : OrderKey, optional
        Its own order key, which it sends to no one; default: drawn now from the OS's
        CSPRNG (:func:`~stratify.registry.client_secrets.node_order_key`).
    """

    def __init__(
        self,
        keys: FederationKeys,
        protocol: str,
        client: int,
        labels: np.ndarray,
        order_key: OrderKey | None = None,
    ) -> None:
        self.keys = keys
        self.client = client
        self.labels = labels
        self.order_key = order_key or OrderKey.draw()
        self.key_holder = keys.key_holder(protocol)
        self.stats = ProtocolStats()
        counts = list(Federation([np.arange(len(labels))], labels).label_counts()[0].items())
        # its own secret order, from its own key only (docs/architecture.md, "Privacy"),
        # as CKKSRegistry.encoding_order gives client k its key in-process
        order = self.order_key.order(len(counts))
        #: (label, count) in the order the client sends them
        self.sent = [counts[position] for position in order]
        owner: dict[int, tuple[object, int]] = {}
        self.codes = [self.key_holder.encode_label(client, label, owner) for label, _ in self.sent]

    def layout(self, block_size: int) -> PackedLayout:
        """The packed layout at block size ``block_size`` of this client's scheme."""
        return PackedLayout(block_size, self.key_holder.data_slots)

    def label_vectors(self, block_size: int) -> list[bytes]:
        """Its labels, encrypted in label vectors of blocks of ``block_size`` slots.

        Parameters
        ----------
        block_size : int
            ``B``, which the server chose from every client's number of labels.
        """
        layout = self.layout(block_size)
        return [
            self.key_holder.encrypt(layout.label_values(chunk), self.stats)
            for chunk in layout.chunks(self.codes)
        ]

    def unique_delta(self, block_size: int, positions: Sequence[int], first: int) -> bytes:
        """``Enc(delta)``: its labels at ``positions`` (new to ``U``) as entries ``first..``
        of the tile of ``U``.

        Parameters
        ----------
        block_size : int
            ``B``.
        positions : sequence of int
            Its labels that matched no entry of ``U``, by position in its order.
        first : int
            ``|U|`` before them.
        """
        codes = [self.codes[position] for position in positions]
        return self.key_holder.encrypt(
            self.layout(block_size).tile_values(codes, first), self.stats
        )

    def counts(
        self, block_size: int, indices: Sequence[int], num_unique: int
    ) -> tuple[bytes, np.ndarray]:
        """Its counts encrypted at their placeholders' slots, and the placeholder of each
        of its samples, from the index in ``U`` of each of its labels: the placeholder
        permutation is the clients' shared secret (:meth:`SharedSecrets.placeholders`).

        Parameters
        ----------
        block_size : int
            ``B``.
        indices : sequence of int
            The index in ``U`` of each of its labels, in its order.
        num_unique : int
            ``|U|``.
        """
        table = self.keys.secrets.placeholders(num_unique)
        placeholders = [table[index] for index in indices]
        counts = [count for _, count in self.sent]
        values = self.layout(block_size).count_values(placeholders, counts)
        of_label = {label: placeholder for (label, _), placeholder in zip(self.sent, placeholders)}
        of_sample = np.array([of_label[label] for label in self.labels.tolist()], dtype=np.int64)
        return self.key_holder.encrypt(values, self.stats), of_sample

    def matches(
        self, blobs: Sequence[bytes], labels: Sequence[int], block_size: int, num_unique: int
    ) -> np.ndarray:
        """The key holder: which compared slots of the server's comparisons are matches,
        one row per label, one column per entry of ``U`` (blinded: all it learns).

        Parameters
        ----------
        blobs : sequence of bytes
            The server's comparisons, one per label vector.
        labels : sequence of int
            How many labels each compared vector holds.
        block_size, num_unique : int
            ``B`` and ``|U|``.
        """
        layout = self.layout(block_size)
        rows = [
            matching(
                layout.rows(
                    self.key_holder.decrypt(
                        blob, "the server", self.key_holder.hash_range, self.stats
                    ),
                    count,
                    num_unique,
                )
            )
            for blob, count in zip(blobs, labels)
        ]
        return np.concatenate(rows) if rows else np.zeros((0, num_unique), dtype=bool)

    def total(self, blob: bytes, num_unique: int) -> np.ndarray:
        """The key holder: the server's total of counts as it decrypts it (blinded:
        masked, uniform residues).

        Parameters
        ----------
        blob : bytes
            The total, masked when blinded.
        num_unique : int
            ``|U|``: the count slots.
        """
        values = self.key_holder.decrypt(blob, "the server", COUNT_LIMIT, self.stats)
        return values[:num_unique]


class SecureRegistration:
    """The server's side of the registration: the public context, the tile of ``U``,
    blinded comparisons and masked counts; the clients' work is asked for by message.

    Parameters
    ----------
    link : NodeLink
        The connected nodes (:class:`stratify.flower.link.NodeLink`).
    protocol : str
        ``packed-blind`` or ``packed``.
    public_context : bytes
        The key holder's context without its secret key.
    label_numbers : sequence of int
        Every client's number of labels (it says them in its hello).
    unique_limit : int or None
        The bound on unique labels (the dataset's number of classes), as in-process.
    blinding_seed : int, optional
        Seed of the blinding factors and masks, for tests only (default the OS's CSPRNG).
    """

    def __init__(
        self,
        link: NodeLink,
        protocol: str,
        public_context: bytes,
        label_numbers: Sequence[int],
        unique_limit: int | None,
        blinding_seed: int | None = None,
    ) -> None:
        self.link = link
        self.server: ServerRole
        if SCHEMES[protocol] == "bfv":
            rng = None if blinding_seed is None else np.random.default_rng(blinding_seed)
            self.server = BlindServer(public_context, BFVParameters().plain_modulus, rng)
        else:
            self.server = Server(public_context)
        slots = data_slots(protocol)
        block_size, self.unique_limit = packed_block_size(
            unique_limit, int(sum(label_numbers)), slots
        )
        self.layout = PackedLayout(block_size, slots)
        self.label_numbers = list(label_numbers)
        self.stats = ProtocolStats(block_size=block_size)
        self.vectors: dict[int, list[Vector]] = {}
        self.tile: Vector | None = None
        self.num_unique = 0

    def chunk_sizes(self, client: int) -> list[int]:
        """How many labels each of ``client``'s label vectors holds.

        Parameters
        ----------
        client : int
            The client.
        """
        return [len(chunk) for chunk in self.layout.chunks(range(self.label_numbers[client]))]

    def label_vectors(self, clients: Sequence[int]) -> None:
        """Ask the clients whose label vectors the server lacks for them, in one exchange.

        Parameters
        ----------
        clients : sequence of int
            The clients whose labels are about to be compared.
        """
        missing = [client for client in clients if client not in self.vectors]
        block = ConfigRecord({"block_size": self.layout.block_size})
        replies = self.link.exchange(
            [(client, LABELS, RecordDict({"registry": block})) for client in missing]
        )
        for client, reply in zip(missing, replies):
            blobs = cast(list[bytes], reply.config_records["labels"]["vectors"])
            if len(blobs) != len(self.chunk_sizes(client)):
                raise RegistryError(
                    f"client {client}: sent {len(blobs)} label vectors, expected "
                    f"{len(self.chunk_sizes(client))}"
                )
            self.vectors[client] = [
                self.server.receive(blob, f"client {client}", self.layout.data_slots)
                for blob in blobs
            ]

    def matches(self, clients: Sequence[int]) -> dict[int, np.ndarray]:
        """Every label of ``clients`` against ``U``: the server compares (blinding each
        difference when blinded), the key holder answers which slots match, in one
        exchange. One row per label, one column per entry of ``U``.

        Parameters
        ----------
        clients : sequence of int
            The clients whose labels to compare.
        """
        self.label_vectors(clients)
        assert self.tile is not None  # U holds client 0's labels before anything is compared
        blobs, sizes = [], []
        for client in clients:
            for vector, size in zip(self.vectors[client], self.chunk_sizes(client)):
                compared = self.layout.compared_slots(size, self.num_unique)
                blobs.append(self.server.compare(vector, self.tile, compared, self.stats))
                sizes.append(size)
        content = RecordDict(
            {
                "compared": ConfigRecord({"vectors": blobs, "labels": sizes}),
                "registry": ConfigRecord(
                    {"block_size": self.layout.block_size, "num_unique": self.num_unique}
                ),
            }
        )
        (reply,) = self.link.exchange([(KEY_HOLDER, MATCHES, content)])
        flat = read_indices(reply.array_records["matched"], "matched").astype(bool)
        rows = flat.reshape(sum(sizes), self.num_unique)
        found, start = {}, 0
        for client in clients:
            found[client] = rows[start : start + self.label_numbers[client]]
            start += self.label_numbers[client]
        return found

    def discover(self) -> None:
        """Build the tile of ``U``, client after client: each compares its labels with it
        and adds those that match none (client 0's are all new)."""
        for client in range(len(self.label_numbers)):
            if self.unique_limit is not None and self.num_unique >= self.unique_limit:
                break  # U holds every class: the remaining clients' labels are all in it
            if self.tile is None:
                new = list(range(self.label_numbers[client]))
            else:
                rows = self.matches([client])[client]
                new = [position for position, row in enumerate(rows) if not row.any()]
            if not new:
                continue
            total = self.num_unique + len(new)
            if self.unique_limit is not None and total > self.unique_limit:
                raise RegistryError(
                    f"client {client} brings unique label number {total}, more than the "
                    f"bound of {self.unique_limit} (the dataset's classes or the packing bound)"
                )
            content = RecordDict(
                {
                    "new": index_record(positions=np.array(new)),
                    "registry": ConfigRecord(
                        {"block_size": self.layout.block_size, "first": self.num_unique}
                    ),
                }
            )
            (reply,) = self.link.exchange([(client, UNIQUE, content)])
            blob = cast(bytes, reply.config_records["unique"]["vector"])
            vector = self.server.receive(blob, f"client {client}", self.layout.data_slots)
            self.tile = self.server.add(self.tile, vector, self.stats)
            self.num_unique = total

    def map_labels(self) -> list[list[int]]:
        """The index in ``U`` of every client's labels, in each client's order."""
        clients = list(range(len(self.label_numbers)))
        found = self.matches(clients)
        return [
            [
                unique_index(
                    client,
                    f"its label number {position}",
                    np.flatnonzero(row).tolist(),
                    self.unique_limit,
                )
                for position, row in enumerate(found[client])
            ]
            for client in clients
        ]

    def aggregate(self, indices: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        """Every client learns its labels' indices in ``U`` and answers with its encrypted
        counts and the placeholder of each of its samples; the server adds the counts,
        masks the total (blinded), the key holder decrypts it and the server unmasks.
        Returns the global counts and the placeholders, client after client.

        Parameters
        ----------
        indices : list of list of int
            The index in ``U`` of every client's labels (:meth:`map_labels`).
        """
        requests = []
        for client, client_indices in enumerate(indices):
            content = RecordDict(
                {
                    "indices": index_record(indices=np.array(client_indices)),
                    "registry": ConfigRecord(
                        {"block_size": self.layout.block_size, "num_unique": self.num_unique}
                    ),
                }
            )
            requests.append((client, COUNTS, content))
        total: Vector | None = None
        placeholders = []
        for client, reply in enumerate(self.link.exchange(requests)):
            blob = cast(bytes, reply.config_records["counts"]["vector"])
            vector = self.server.receive(blob, f"client {client}", self.layout.data_slots)
            total = self.server.add(total, vector, self.stats)
            placeholders.append(read_indices(reply.array_records["placeholders"], "placeholders"))
        positions = np.arange(self.num_unique)
        blob, masks = self.server.reveal(total, positions, self.stats)
        content = RecordDict(
            {
                "total": ConfigRecord({"vector": blob}),
                "registry": ConfigRecord({"num_unique": self.num_unique}),
            }
        )
        (reply,) = self.link.exchange([(KEY_HOLDER, TOTAL, content)])
        values = np.asarray(reply.array_records["total"]["values"].numpy())
        counts = self.server.unmask(values, positions, masks).astype(np.int64)
        return counts, np.concatenate(placeholders)

    def register(self, sizes: Sequence[int]) -> tuple[RegistryResult, np.ndarray]:
        """The whole registration: discovery, mapping, counts.

        Parameters
        ----------
        sizes : sequence of int
            Every client's number of samples.

        Returns
        -------
        RegistryResult, numpy.ndarray
            What the server holds (each client's placeholders mapped to themselves: it
            never holds a label), and the placeholder of every client position.
        """
        self.discover()
        counts, placeholders = self.aggregate(self.map_labels())
        ends = np.cumsum(sizes)
        held: list[dict[Hashable, int]] = [
            {int(p): int(p) for p in np.unique(own)} for own in np.split(placeholders, ends[:-1])
        ]
        return RegistryResult(self.num_unique, held, counts), placeholders


def values_record(values: np.ndarray) -> ArrayRecord:
    """The key holder's decrypted values (residues, or CKKS values) as a record.

    Parameters
    ----------
    values : numpy.ndarray
        What it decrypted.
    """
    return ArrayRecord({"values": Array(np.ascontiguousarray(values))})
