"""The clients' side of a stream's labels: which clients and labels the stream knows,
each label's classifier row, and the registrations that give them placeholders.

Real labels stay with the clients (docs/architecture.md, "Streaming"): in their label
maps and in the map from labels to classifier rows kept here. In a fresh stream a
label's row is its placeholder, placed by a key the clients hold
(:meth:`~stratify.registry.base.LabelRegistry.place_stream`; the plain registry's key
follows from ``--seed``), not its arrival order (docs/streaming.md, "Placeholders"). A
label new to the whole federation is registered when it arrives; a label the federation
knows waits at the client that brings it for the first time, its samples buffered but
not scheduled, until that client registers all such labels of its own in one round.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from stratify.errors import ConfigError, RegistryError
from stratify.registry import PlainRegistry
from stratify.registry.base import LabelRegistry
from stratify.stream.buffers import ClientBuffers
from stratify.stream.config import StreamConfig
from stratify.stream.events import EventError, Identifier, check_identifier, check_label

#: events a client receives after a label the federation already knows arrived there for
#: the first time before it registers it: its new labels are then registered together, one
#: encrypted comparison for all of them (docs/architecture.md, "Streaming"); at most half
#: its buffer's capacity, so the sample that brought the label is still there. A label new
#: to the federation is registered at once.
REGISTRATION_ARRIVALS = 20
#: the placeholder of a buffered sample whose label its client has not registered yet
UNREGISTERED = -1


def placement_key(registry: LabelRegistry, seed: int) -> bytes:
    """The key placing a fresh stream's labels: derived from the clients' secrets (the
    secure registry draws them from the OS), else from ``seed`` (the plain registry's
    placement, like its placeholders, is seeded: anyone knowing ``--seed`` can undo it)."""
    if registry.secrets is not None:
        # what the clients share (all of them hold the label -> row map), never a client's
        # own order key
        return registry.secrets.shared.derive(b"stream placeholders")
    return hashlib.sha256(b"stratify stream placeholders %d" % seed).digest()


def make_stream_registry(config: StreamConfig) -> LabelRegistry:
    """The registry of ``config``: CKKS bounded by ``--num-classes``, or the plain one."""
    if not config.secure:
        return PlainRegistry(seed=config.seed)
    from stratify.registry.ckks import CKKSRegistry

    return CKKSRegistry(seed=config.seed, protocol=config.protocol, max_unique=config.num_classes)


class ClassRows:
    """A stream's clients and classes, their registrations and the classes' rows.

    Parameters
    ----------
    config : StreamConfig
        The stream's settings (registry, seed, class and client bounds, capacity).
    registry : LabelRegistry, optional
        A registry to continue (default: a fresh one by ``config.secure``).
    classes : sequence, optional
        The labels a given model's classifier rows stand for, in row order.
    clients : sequence, optional
        The clients ``registry`` already holds, in index order.
    """

    def __init__(
        self,
        config: StreamConfig,
        registry: LabelRegistry | None = None,
        classes: Sequence[Identifier] = (),
        clients: Sequence[Identifier] = (),
    ) -> None:
        self.config = config
        #: whether the classifier rows are the registry's discovery order, which the clients
        #: then know (they hold the label -> row map): a fresh stream's, where a label
        #: takes the next row as it takes the next unique index; its registrations need no
        #: encrypted comparison (docs/architecture.md, "Streaming")
        self.rows_are_indices = registry is None and not classes
        self.registry = registry if registry is not None else make_stream_registry(config)
        self.row_key: bytes | None = None
        if self.rows_are_indices:
            self.row_key = placement_key(self.registry, config.seed)
            self.registry.place_stream(self.row_key, config.num_classes)
        if self.joined != len(clients):
            raise ConfigError(
                f"the registry holds {self.joined} clients but {len(clients)} were named"
            )
        self.classes: list[Identifier] = [check_label(label) for label in classes]
        self.class_of = {label: row for row, label in enumerate(self.classes)}
        #: the model's row of each class (by index in :attr:`classes`): the keyed
        #: placeholder in a fresh stream, else the index itself
        self.model_rows = list(range(len(self.classes)))
        self.clients: list[Identifier] = [check_identifier(c, "client") for c in clients]
        self.client_of = {client: index for index, client in enumerate(self.clients)}
        if len(self.class_of) != len(self.classes) or len(self.client_of) != len(self.clients):
            raise ConfigError("classes and clients must be distinct")
        #: (client, label) in the order the clients registered them
        self.registrations: list[tuple[int, Identifier]] = []
        #: client -> labels it holds and has not registered yet (:data:`REGISTRATION_ARRIVALS`)
        self.unregistered: dict[int, list[Identifier]] = {}
        #: client -> events it received since the first of them
        self.waiting: dict[int, int] = {}

    @property
    def joined(self) -> int:
        """Clients the registry holds."""
        return len(self.registry.result.client_maps) if self.registry.result else 0

    def client_index(self, client_id: Identifier) -> int:
        """The index of ``client_id``, the next one for a new client.

        Raises
        ------
        EventError
            A new client beyond ``--max-clients``.
        """
        client = self.client_of.get(client_id)
        if client is not None:
            return client
        if len(self.clients) >= self.config.max_clients:
            raise EventError(
                f"client {client_id!r} is new and --max-clients "
                f"{self.config.max_clients} clients are registered"
            )
        return len(self.clients)

    def class_index(self, label: Identifier) -> int | None:
        """The index of ``label`` among the classes (``None``: new).

        Raises
        ------
        EventError
            A label equal to a known one of another type, or a new one beyond
            ``--num-classes``.
        """
        row = self.class_of.get(label)
        if row is not None and type(self.classes[row]) is not type(label):
            # Python takes 1 and True (0 and False) for one key: refused, never merged
            raise EventError(
                f"label {label!r} ({type(label).__name__}) equals the stream's label "
                f"{self.classes[row]!r} ({type(self.classes[row]).__name__}); give every "
                "label as one type"
            )
        if row is None and self.config.num_classes is not None:
            if len(self.classes) >= self.config.num_classes:
                raise EventError(
                    f"label {label!r} would be class {len(self.classes) + 1} of "
                    f"--num-classes {self.config.num_classes}"
                )
        return row

    def add_client(self, client_id: Identifier) -> int:
        """Give ``client_id`` the next index."""
        self.client_of[client_id] = len(self.clients)
        self.clients.append(client_id)
        return self.client_of[client_id]

    def add_class(self, label: Identifier) -> tuple[int, int]:
        """Give ``label`` the next class index; returns it and the class's model row."""
        row = len(self.classes)
        self.classes.append(label)
        self.class_of[label] = row
        self.model_rows.append(self.model_row(row))
        return row, self.model_rows[row]

    def placeholder(
        self, client: int, label: Identifier, row: int | None, buffers: ClientBuffers
    ) -> int:
        """The placeholder of ``label`` (class ``row``, ``None``: new) at ``client``: a
        label new to the federation is registered now (the learner must know its
        placeholder to train it, and only such a label can be refused); a known one new
        to this client is :data:`UNREGISTERED` until the client's next batch of
        registrations."""
        if row is not None:
            return self.known(client, label)
        return self.register_new(client, label, buffers)

    def admit(
        self,
        client_id: Identifier,
        client: int,
        label: Identifier,
        row: int | None,
        buffers: ClientBuffers,
    ) -> int:
        """Take a checked event's client and label (class ``row``, ``None``: new): its
        label's placeholder (:meth:`placeholder`; the only step that can still refuse the
        event), then a new client joins and the buffers learn the placeholder; returns
        it (:data:`UNREGISTERED` for a label the client holds unregistered)."""
        is_new_client = client == len(self.clients)
        placeholder = self.placeholder(client, label, row, buffers)
        if is_new_client:
            self.add_client(client_id)
            buffers.add_client()
        self.hold(client, label, placeholder)
        if placeholder != UNREGISTERED:
            buffers.add_placeholder(placeholder)
        return placeholder

    def arrived(self, client: int, row: int, placeholder: int, buffers: ClientBuffers) -> None:
        """After an event of class ``row`` was buffered at ``client``: a waiting client
        registers the labels it holds once it waited long enough, or at once when this
        one is unregistered and scarce (:meth:`scarce`)."""
        if client in self.waiting and (
            self.waited(client) or (placeholder == UNREGISTERED and self.scarce(row, buffers))
        ):
            self.register_held([client], buffers)

    def known(self, client: int, label: Identifier) -> int:
        """The placeholder ``client`` registered for ``label``, or :data:`UNREGISTERED`."""
        maps = self.registry.result.client_maps if self.registry.result is not None else []
        if client < len(maps):
            return maps[client].get(label, UNREGISTERED)
        return UNREGISTERED

    def register_new(self, client: int, label: Identifier, buffers: ClientBuffers) -> int:
        """Register ``label``, new to the federation, at ``client``: the labels the
        clients hold unregistered are registered first (clients join the registry in
        their order), then this one.

        Raises
        ------
        EventError
            The registry refuses ``label`` (too many classes, a hash collision); nothing
            changed but for the labels registered first.
        """
        self.register_held(range(self.joined, client), buffers)
        try:
            # the count waits for the next flush_counts (public: added in the clear)
            placeholder = self.registry.add_label(
                client, label, 1, defer_count=True, index=self.index_of(label)
            )
        except RegistryError as error:
            raise EventError(f"the registry refused it: {error}") from None
        self.registrations.append((client, label))
        return placeholder

    def hold(self, client: int, label: Identifier, placeholder: int) -> None:
        """Note a label ``client`` holds unregistered (:data:`UNREGISTERED`)."""
        if placeholder == UNREGISTERED and label not in self.unregistered.get(client, ()):
            self.waiting.setdefault(client, 0)
            self.unregistered.setdefault(client, []).append(label)

    def waited(self, client: int) -> bool:
        """Count an event at a waiting ``client``; whether it has now waited long enough
        (:data:`REGISTRATION_ARRIVALS`, at most half its buffer)."""
        self.waiting[client] += 1
        return self.waiting[client] >= min(REGISTRATION_ARRIVALS, self.config.capacity // 2)

    def scarce(self, row: int, buffers: ClientBuffers) -> bool:
        """Whether the clients buffer fewer samples of class ``row`` than half a class's
        share of all they buffer: a class that appeared late, whose every sample should
        be trained at once (its client then registers it without waiting)."""
        minlength = self.model_rows[row] + 1  # the class's row counted, even at 0
        held = np.bincount(buffers.targets()[buffers.occupied], minlength=minlength)
        return 2 * len(self.classes) * int(held[self.model_rows[row]]) < int(held.sum())

    def register_held(self, clients: Sequence[int] | range, buffers: ClientBuffers) -> None:
        """Register the labels ``clients`` hold unregistered: each client all of its own
        in one round (:meth:`~stratify.registry.base.LabelRegistry.add_labels`), and make
        their buffered samples available to the schedule. A client that has not joined
        the registry has every client before it join first."""
        joined = self.joined
        wanted = set(clients)
        if wanted and max(wanted) >= joined:
            wanted.update(range(joined, max(wanted)))
        for client in sorted(wanted & set(self.unregistered)):
            labels = self.unregistered.pop(client)
            del self.waiting[client]
            indices = [self.class_of[label] for label in labels] if self.rows_are_indices else None
            placeholders = self.registry.add_labels(
                client, labels, [1] * len(labels), defer_count=True, indices=indices
            )
            for label, placeholder in zip(labels, placeholders):
                self.registrations.append((client, label))
                buffers.add_placeholder(placeholder)
                buffers.assign(client, self.model_rows[self.class_of[label]], placeholder)

    def index_of(self, label: Identifier) -> int | None:
        """Where the clients know ``label`` stands among the registry's unique labels: its
        classifier row (the next one for a new label) when :attr:`rows_are_indices`, else
        unknown (``None``: the registry discovers it)."""
        if not self.rows_are_indices:
            return None
        row = self.class_of.get(label)
        return len(self.classes) if row is None else row

    def model_row(self, index: int) -> int:
        """The model's row of the ``index``-th class: its keyed placeholder in a fresh
        stream (registered before its class is added), else ``index``."""
        if self.rows_are_indices and self.registry.stream_key is not None:
            return self.registry.placeholder_of_index[index]
        return index

    def state_dict(self) -> dict[str, Any]:
        """The classes, clients, placement key and registrations (replayed on load)."""
        return {
            "classes": list(self.classes),
            # the clients' placement key: resuming needs the same placeholders and rows
            "row_key": self.row_key.hex() if self.row_key is not None else None,
            "clients": list(self.clients),
            "registrations": [[client, label] for client, label in self.registrations],
            "unregistered": [
                [client, label] for client, labels in self.unregistered.items() for label in labels
            ],
            "waiting": [[client, events] for client, events in self.waiting.items()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replay :meth:`state_dict`'s registrations into this fresh registry."""
        rows = {label: row for row, label in enumerate(state["classes"])}
        if self.rows_are_indices:
            # a checkpoint of an earlier version placed labels in arrival order
            key = state.get("row_key")
            self.row_key = bytes.fromhex(key) if key is not None else None
            self.registry.place_stream(self.row_key, self.config.num_classes)
        for client, label in state["registrations"]:
            index = rows[label] if self.rows_are_indices else None
            self.registry.add_label(int(client), label, 1, defer_count=True, index=index)
            self.registrations.append((int(client), label))
        self.registry.flush_counts(public=True)
        # a checkpoint of an earlier version registered every label at once
        for client, label in state.get("unregistered", []):
            self.unregistered.setdefault(int(client), []).append(label)
        self.waiting = {int(client): int(events) for client, events in state.get("waiting", [])}
        self.classes = list(state["classes"])
        self.class_of = {label: row for row, label in enumerate(self.classes)}
        self.model_rows = [self.model_row(index) for index in range(len(self.classes))]
        self.clients = list(state["clients"])
        self.client_of = {client: index for index, client in enumerate(self.clients)}
