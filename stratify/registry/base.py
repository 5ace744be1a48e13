"""The registry interface shared by the plain and CKKS registries.

A registry takes each client's label counts and returns placeholders: integers
``0..U-1`` assigned at random to the ``U`` unique labels, each client's own
label -> placeholder map (known to that client only), and the global count per
placeholder. The scheduler and selector see only placeholders.

A stream registers one label at a time (:meth:`LabelRegistry.add_label`): a label new to
every client gets the next unique index, ``U``, so the placeholders already handed out
stay as they are. Its placeholder is ``U`` itself, the label's arrival order, unless the
clients set a keyed placement (:meth:`LabelRegistry.place_stream`, a fresh stream's
default): then it is the ``U``-th entry of a permutation, keyed by the clients' secret,
of the stream's declared class capacity (or of blocks of :data:`STREAM_BLOCK`
placeholders as a stream without one grows), so the placeholder says nothing of when its
label came (docs/streaming.md, "Placeholders").

With :class:`~stratify.registry.client_secrets.RegistrySecrets` (always, in the secure
registry) every client encodes its labels in a secret random order and the placeholders
are a secret permutation; without (the plain registry) the labels go in the order the
caller lists them and the permutation is seeded (docs/architecture.md, "Privacy").
"""

from __future__ import annotations

import hashlib
import hmac
from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stratify.errors import RegistryError
from stratify.registry.client_secrets import RegistrySecrets, keyed_permutation

#: The secure registry's protocols (docs/architecture.md, "Privacy"): the paper's ``naive``
#: and the ``packed`` SIMD layout (CKKS), and each with the server blinding comparisons and
#: masking counts (BFV), so the key holder learns only which labels match.
PROTOCOLS = ("naive", "packed", "naive-blind", "packed-blind")


@dataclass(frozen=True)
class RegistryResult:
    """What a completed registration produces.

    Parameters
    ----------
    num_placeholders : int
        Number of unique labels ``U`` across all clients.
    client_maps : list of dict
        ``client_maps[k][label]`` is the placeholder of ``label`` for client ``k``.
    global_counts : numpy.ndarray
        ``global_counts[p]``: number of samples with placeholder ``p`` over all clients.
    """

    num_placeholders: int
    client_maps: list[dict[Hashable, int]]
    global_counts: np.ndarray

    def client_placeholders(self, client: int) -> set[int]:
        """The placeholders client ``client`` holds: all the server learns of its labels."""
        return set(self.client_maps[client].values())


def assign_placeholders(num_unique: int, seed: int) -> np.ndarray:
    """Placeholder of the i-th discovered unique label: a seeded random permutation.

    The plain registry's: anyone who knows ``seed`` can compute it, so the secure registry
    draws its permutation from the clients' secrets instead
    (:meth:`~stratify.registry.client_secrets.RegistrySecrets.placeholders`).
    """
    return np.random.default_rng([seed, 0x5EED]).permutation(num_unique)


#: placeholders a stream without a declared class capacity draws at a time: its ``U``-th
#: label takes a keyed place in the block of ``U``; a block is all the server can tell of
#: a label's arrival, and the classifier holds at most ``STREAM_BLOCK - 1`` unused rows
STREAM_BLOCK = 8


def stream_placeholder(
    key: bytes, index: int, capacity: int | None = None, block: int = STREAM_BLOCK
) -> int:
    """The placeholder of a stream's ``index``-th unique label under the clients' ``key``.

    Parameters
    ----------
    key : bytes
        The clients' placement key (never sent to the server).
    index : int
        The label's rank in arrival order among the unique labels.
    capacity : int, optional
        The stream's declared number of classes: the placeholder is entry ``index`` of a
        keyed permutation of ``range(capacity)``. Without one, entry ``index % block`` of
        a keyed permutation of the block ``index`` falls in (its own key per block).
    block : int
        Size of a block without ``capacity``.
    """
    if capacity is not None:
        if not 0 <= index < capacity:
            raise RegistryError(f"unique label {index} is beyond the capacity of {capacity}")
        return keyed_permutation(key, capacity)[index]
    start = index - index % block
    block_key = hmac.new(key, b"stream block %d" % start, hashlib.sha256).digest()
    return start + keyed_permutation(block_key, block)[index % block]


def stream_span(unique: int, capacity: int | None = None, block: int = STREAM_BLOCK) -> int:
    """Placeholders a stream with ``unique`` labels spans under a keyed placement: its
    capacity, else the blocks its labels fall in (:func:`stream_placeholder`)."""
    if capacity is not None:
        return capacity
    return -(-unique // block) * block


# client labels are typed Mapping[Any, int]: Mapping is invariant in its key type, so
# Mapping[Hashable, int] would refuse a caller's dict[int, int]
def validate_client_labels(client_labels: Sequence[Mapping[Any, int]]) -> None:
    if len(client_labels) == 0:
        raise RegistryError("no clients to register; give at least one client with labels")
    for client, counts in enumerate(client_labels):
        if len(counts) == 0:
            raise RegistryError(f"client {client} has no labels; drop it or give it data")
        for label, count in counts.items():
            if int(count) != count or count <= 0:
                raise RegistryError(
                    f"client {client}: count {count!r} for label {label!r} "
                    "must be a positive integer"
                )


def check_new_label(result: RegistryResult, client: int, label: Any, count: int) -> None:
    """Refuse an incremental registration that does not fit ``result``.

    ``client`` must be a known client or the next one (clients join one at a time), must
    not hold ``label`` already, and ``count`` must be a positive integer.
    """
    known = len(result.client_maps)
    if isinstance(client, bool) or not isinstance(client, (int, np.integer)):
        raise RegistryError(f"client {client!r} must be an integer index")
    if not 0 <= client <= known:
        raise RegistryError(
            f"client {client} is out of range; clients 0..{known - 1} are registered and the "
            f"next one to join is {known}"
        )
    if client < known and label in result.client_maps[client]:
        raise RegistryError(f"client {client} has already registered label {label!r}")
    if isinstance(count, bool) or int(count) != count or count <= 0:
        raise RegistryError(
            f"client {client}: count {count!r} for label {label!r} must be a positive integer"
        )


EMPTY_RESULT = RegistryResult(0, [], np.zeros(0, dtype=np.int64))


class LabelRegistry(ABC):
    """Maps real labels to placeholders and computes global counts.

    Subclasses implement :meth:`register`, and :meth:`_discover` and :meth:`_count` for
    :meth:`add_label`. :meth:`register` either completes and stores :attr:`result`, or
    raises :class:`~stratify.errors.RegistryError` and leaves the registry unchanged.

    Parameters
    ----------
    seed : int
        Seed of the placeholder assignment when there are no ``secrets``.
    secrets : RegistrySecrets, optional
        The clients' secrets: each client's encoding order and the placeholder
        permutation. Registries given the same secrets (or, without, the same seed) return
        the same result, so a secure and a plain run given them learn identically.
    """

    name: str = "registry"

    def __init__(self, seed: int = 0, secrets: RegistrySecrets | None = None) -> None:
        self.seed = seed
        self.secrets = secrets
        self.result: RegistryResult | None = None
        #: placeholder of the i-th discovered unique label
        self.placeholder_of_index: list[int] = []
        #: counts added with ``defer_count`` and not yet in :attr:`result`: client ->
        #: placeholder -> count (:meth:`flush_counts`)
        self.pending_counts: dict[int, dict[int, int]] = {}
        #: a stream's keyed placement (:meth:`place_stream`): key and capacity
        self.stream_key: bytes | None = None
        self.stream_capacity: int | None = None

    def place_stream(self, key: bytes | None, capacity: int | None = None) -> None:
        """Give the labels :meth:`add_label` appends keyed placeholders
        (:func:`stream_placeholder`) instead of their arrival order; ``key`` ``None``
        puts the arrival order back. Set before the first label is added.

        Parameters
        ----------
        key : bytes or None
            The clients' placement key.
        capacity : int, optional
            The stream's declared number of classes.
        """
        if self.placeholder_of_index:
            raise RegistryError("a stream's placement is set before its first label")
        self.stream_key, self.stream_capacity = key, capacity

    def next_placeholder(self, index: int) -> int:
        """Placeholder of the ``index``-th unique label appended by :meth:`add_labels`."""
        if self.stream_key is None:
            return index
        return stream_placeholder(self.stream_key, index, self.stream_capacity)

    def placeholder_span(self) -> int:
        """Placeholders the registered labels span: their number, or under a keyed
        placement every placeholder it may hand out so far (:func:`stream_span`)."""
        unique = len(self.placeholder_of_index)
        if self.stream_key is None:
            return unique
        return stream_span(unique, self.stream_capacity)

    def encoding_order(self, client_labels: Sequence[Mapping[Any, int]]) -> list[dict[Any, int]]:
        """Each client's ``{label: count}`` in the order the client encodes its labels: a
        secret random order with :attr:`secrets`, else the order given."""
        if self.secrets is None:
            return [dict(counts) for counts in client_labels]
        ordered = []
        for client, counts in enumerate(client_labels):
            items = list(counts.items())
            order = self.secrets.client_order(client, len(items))
            ordered.append(dict(items[position] for position in order))
        return ordered

    def assign_placeholders(self, num_unique: int) -> list[int]:
        """Placeholder of the i-th discovered unique label: from :attr:`secrets`, else
        seeded (:func:`assign_placeholders`)."""
        if self.secrets is not None:
            return self.secrets.placeholders(num_unique)
        return [int(p) for p in assign_placeholders(num_unique, self.seed)]

    @abstractmethod
    def register(
        self, client_labels: Sequence[Mapping[Any, int]], num_classes: int | None = None
    ) -> RegistryResult:
        """Register every client's ``{label: count}``; returns and stores the result.

        Parameters
        ----------
        client_labels : sequence of mapping
            ``client_labels[k]`` maps each label client ``k`` holds to its sample count.
        num_classes : int, optional
            Known number of classes; unique discovery may stop once it is reached.
        """

    def add_label(
        self,
        client: int,
        label: Any,
        count: int = 1,
        *,
        defer_count: bool = False,
        index: int | None = None,
    ) -> int:
        """Client ``client`` registers ``label``, which it did not hold before.

        The incremental form of :meth:`register`, for labels that appear over time: the
        same discovery (is ``label`` one of the unique labels?), mapping and count
        aggregation, for one label. A label new to every client gets placeholder ``U``;
        every placeholder handed out before stays as it was. Starts from an empty
        registration when :meth:`register` has not run.

        Parameters
        ----------
        client : int
            A registered client, or ``len(result.client_maps)`` for a client joining.
        label : hashable
            The label, new to ``client``.
        count : int
            Samples of ``label`` the client registers; added to the global count.
        defer_count : bool
            Keep ``count`` with the client until :meth:`flush_counts`, which aggregates
            every deferred count in one round (one ciphertext per client, one decryption:
            docs/architecture.md, "Streaming"), instead of a round per label now.
            :attr:`result`'s global counts leave it out until then.
        index : int, optional
            Where the client knows ``label`` stands among the unique labels: a stream's
            clients share the label -> classifier-row map, and a fresh stream's rows are
            its discovery order. A label some client registered keeps its index; a label
            no client holds takes the next one (``len(placeholder_of_index)``), appended
            without a comparison. No encrypted discovery runs, so the key holder decrypts
            nothing (docs/architecture.md, "Privacy"). The index is checked against the
            registry's own record. Default: discovered.

        Returns
        -------
        int
            The placeholder of ``label``; :attr:`result` holds the updated registration.

        Raises
        ------
        RegistryError
            A client out of range, a label the client already holds, a bad count, an
            ``index`` that is not the label's, or (CKKS) a label that cannot be encoded or
            exceeds the bound on unique labels; the registry is then unchanged.
        """
        indices = None if index is None else [index]
        placeholders = self.add_labels(
            client, [label], [count], defer_count=defer_count, indices=indices
        )
        return placeholders[0]

    def add_labels(
        self,
        client: int,
        labels: Sequence[Any],
        counts: Sequence[int],
        *,
        defer_count: bool = False,
        indices: Sequence[int] | None = None,
    ) -> list[int]:
        """Client ``client`` registers several labels it did not hold, in one discovery
        round where the protocol allows (the packed CKKS layout compares them all with
        ``U`` in one ciphertext: docs/architecture.md, "Streaming"); otherwise as many
        :meth:`add_label` calls.

        Parameters
        ----------
        client : int
            As :meth:`add_label`.
        labels : sequence of hashable
            Distinct labels, each new to ``client``.
        counts : sequence of int
            Samples of each label.
        defer_count : bool
            As :meth:`add_label`.
        indices : sequence of int, optional
            Each label's ``index`` (:meth:`add_label`); new labels take the next indices
            in their order here.

        Returns
        -------
        list of int
            The placeholder of each label.

        Raises
        ------
        RegistryError
            As :meth:`add_label`, or a label given twice; the registry is then unchanged.
        """
        previous = self.result if self.result is not None else EMPTY_RESULT
        if len(set(labels)) != len(labels) or len(labels) != len(counts):
            raise RegistryError(
                f"client {client}: add_labels takes distinct labels, one count each"
            )
        for label, count in zip(labels, counts):
            self.check_new_label(previous, client, label, count)
        if indices is None:
            indices = self._discover_many(client, list(labels))
        else:
            new = self.check_indices(previous, client, labels, indices)
            indices = self._place_many(client, list(labels), new)
        for index in indices:
            if index == len(self.placeholder_of_index):
                self.placeholder_of_index.append(self.next_placeholder(index))
        placeholders = [self.placeholder_of_index[index] for index in indices]
        num_placeholders = self.placeholder_span()
        global_counts = np.zeros(num_placeholders, dtype=np.int64)
        global_counts[: len(previous.global_counts)] = previous.global_counts
        for placeholder, count in zip(placeholders, counts):
            if defer_count:
                held = self.pending_counts.setdefault(client, {})
                held[placeholder] = held.get(placeholder, 0) + int(count)
            else:
                global_counts = self._count(client, placeholder, int(count), global_counts)
        client_maps = [dict(mapping) for mapping in previous.client_maps]
        if client == len(client_maps):
            client_maps.append({})
        client_maps[client].update(zip(labels, placeholders))
        self.result = RegistryResult(num_placeholders, client_maps, global_counts)
        return placeholders

    def flush_counts(self, public: bool = False) -> RegistryResult | None:
        """Aggregate the counts :meth:`add_label` deferred into :attr:`result`'s global
        counts; returns :attr:`result`.

        Parameters
        ----------
        public : bool
            Every deferred count is 1: each counts the one sample that brought its label to
            its client (a stream's registrations), so the total of a placeholder is the
            number of clients that registered it since the last flush, which the server
            knows (it learns each client's placeholders): added in the clear, no encrypted
            round (docs/architecture.md, "Streaming").

        Raises
        ------
        RegistryError
            ``public`` with a deferred count other than 1; nothing is aggregated.
        """
        if self.pending_counts:
            assert self.result is not None  # a deferred count came with its label
            if public:
                global_counts = self.result.global_counts.copy()
                for client, held in self.pending_counts.items():
                    for placeholder, count in held.items():
                        if count != 1:
                            raise RegistryError(
                                f"client {client}: {count} samples of placeholder {placeholder} "
                                "are not a public count (one per registration)"
                            )
                        global_counts[placeholder] += 1
            else:
                global_counts = self._count_many(self.pending_counts, self.result.global_counts)
            self.result = RegistryResult(
                self.result.num_placeholders, self.result.client_maps, global_counts
            )
            self.pending_counts = {}
        return self.result

    def pending_total(self) -> int:
        """Samples deferred by :meth:`add_label` and not yet aggregated."""
        return sum(sum(held.values()) for held in self.pending_counts.values())

    def check_new_label(self, result: RegistryResult, client: int, label: Any, count: int) -> None:
        """Refuse what :meth:`add_label` cannot register, before anything changes."""
        check_new_label(result, client, label, count)

    @abstractmethod
    def _discover(self, client: int, label: Any) -> int:
        """Index of ``label`` among the unique labels, appended when it is new.

        Raises before changing anything when ``label`` cannot be registered.
        """

    def _discover_many(self, client: int, labels: list[Any]) -> list[int]:
        """:meth:`_discover` of each of ``client``'s new ``labels``; a registry that can
        discover them in one round overrides it (raising before changing anything)."""
        return [self._discover(client, label) for label in labels]

    def check_indices(
        self, result: RegistryResult, client: int, labels: Sequence[Any], indices: Sequence[int]
    ) -> list[bool]:
        """Refuse ``indices`` that are not where ``labels`` stand among the unique labels
        (:meth:`add_label`'s ``index``); whether each label is new to every client."""
        if len(indices) != len(labels):
            raise RegistryError(f"client {client}: one index per label, got {len(indices)}")
        placeholder_of = {
            label: placeholder
            for mapping in result.client_maps
            for label, placeholder in mapping.items()
        }
        unique = len(self.placeholder_of_index)
        new: list[bool] = []
        for label, index in zip(labels, indices):
            if label in placeholder_of:
                expected = self.placeholder_of_index.index(placeholder_of[label])
            else:
                expected = unique + sum(new)
            if index != expected:
                raise RegistryError(
                    f"client {client}: label {label!r} is unique label {expected}, not {index}"
                )
            new.append(label not in placeholder_of)
        return new

    def _place_many(self, client: int, labels: list[Any], new: list[bool]) -> list[int]:
        """Indices of ``labels``, whose place among the unique labels the client knows
        (``new``: those no client holds, appended); a registry whose discovery costs a
        comparison overrides it, to skip it (raising before changing anything)."""
        return self._discover_many(client, labels)

    @abstractmethod
    def _count(
        self, client: int, placeholder: int, count: int, global_counts: np.ndarray
    ) -> np.ndarray:
        """The global counts after ``client`` adds ``count`` samples of ``placeholder``
        (``global_counts`` may be one entry short: the placeholder just discovered)."""

    def _count_many(
        self, counts: dict[int, dict[int, int]], global_counts: np.ndarray
    ) -> np.ndarray:
        """The global counts after every client adds its ``counts[client][placeholder]``
        (``global_counts`` holds every placeholder). One :meth:`_count` each unless a
        registry aggregates them at once."""
        for client, held in counts.items():
            for placeholder, count in held.items():
                global_counts = self._count(client, placeholder, count, global_counts)
        return global_counts
