"""Order-recovery attacks on the secure registry, from what each party sees.

The key holder decrypts, client by client, whether each of the client's labels matches each
unique label ``U_i``; the rows come in the order the client encoded its labels. Were that
order the label order, two consecutive matches ``U_a``, ``U_b`` of one client would say
``label(U_a) < label(U_b)``, and over many clients the ranking of the ``U_i`` is the
labels (with labels ``0..C-1`` the rank is the label). The server sees which client added
how many entries to ``U``, in order, and the placeholders each client holds; knowing the
run's seed it would map ``U_i`` to its placeholder with
:func:`~stratify.registry.base.assign_placeholders`.

Two rankings are tried on every view: the transitive closure of the consecutive pairs
(each ``U_i`` ranked by how many entries it follows minus how many it precedes) and a
Borda count (each ``U_i`` ranked by its average relative position in the lists it appears
in). The score is the share of labels recovered exactly; chance is ``1 / C``.

Run as ``python tests/privacy_attacks.py`` to print the recovery rates of both attackers
on ``iid``, ``dirichlet:0.5`` and ``dirichlet:0.1`` at 10 and 100 classes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from stratify.data.partition import partition
from stratify.federation import Federation
from stratify.registry.base import assign_placeholders
from stratify.registry.ckks import CKKSRegistry
from stratify.registry.ckks.encoding import MATCH_THRESHOLD
from stratify.registry.ckks.protocols import _NaiveRun, _PackedRun, _ProtocolRun
from stratify.registry.client_secrets import OrderKey, RegistrySecrets, SharedSecrets

#: clients that :func:`fixed_secrets` gives an order key
FIXED_CLIENTS = 200


def fixed_secrets(seed: int) -> RegistrySecrets:
    """Clients' secrets fixed by ``seed`` (the shared secret and each client's order key),
    for tests that compare registries exactly (a run draws its own from the OS)."""
    shared = SharedSecrets(hashlib.sha256(b"test secrets %d" % seed).digest())
    order_keys = {
        client: OrderKey(hashlib.sha256(b"test order key %d %d" % (seed, client)).digest())
        for client in range(FIXED_CLIENTS)
    }
    return RegistrySecrets(shared, order_keys)


def federation_labels(spec: str, classes: int, clients: int, seed: int) -> list[dict[int, int]]:
    """Each client's ``{label: count}`` as a run registers it (``Federation.label_counts``)
    for ``classes`` classes of 60 samples split by ``spec``."""
    labels = np.repeat(np.arange(classes), 60)
    indices = partition(labels, clients, spec, seed=seed)
    return Federation(indices, labels).label_counts()


@dataclass
class Views:
    """What the key holder decrypted and what the server saw during one registration."""

    #: key holder, mapping phase: per client, the index in U of each row, in the order seen
    key_holder_rows: list[list[int]] = field(default_factory=list)
    #: server: per client that grew U, the indices it appended, in order
    server_chunks: list[list[int]] = field(default_factory=list)


@contextmanager
def observe() -> Iterator[Views]:
    """Record, during the registrations run inside it, the decrypted match rows of the
    mapping phase (key holder) and the growth of ``U`` (server)."""
    views = Views()
    state = {"mapping": False, "client": None, "search": 0}
    compare, append_unique = _ProtocolRun.compare, _PackedRun.append_unique
    map_labels = {layout: layout.map_labels for layout in (_NaiveRun, _PackedRun)}

    def recording_compare(self, client, vector, unique, compared, parts):
        values = compare(self, client, vector, unique, compared, parts)
        if not state["mapping"]:
            return values
        if state["client"] != client:  # a new client's rows start
            views.key_holder_rows.append([])
            state["client"], state["search"] = client, 0
        rows = views.key_holder_rows[-1]
        if isinstance(self, _PackedRun):
            width, size = self.num_unique, self.block_size
            for row in range(len(compared) // width):
                hits = np.flatnonzero(np.abs(values[row * size : row * size + width]) < 0.5)
                rows.extend(hits[:1].tolist())
        else:  # naive: one comparison at a time, U_0, U_1, ... until the match
            if abs(values[0]) < MATCH_THRESHOLD:
                rows.append(state["search"])
                state["search"] = 0
            else:
                state["search"] += 1
        return values

    def recording_map_labels(self):
        state["mapping"], state["client"] = True, None
        try:
            return map_labels[type(self)](self)
        finally:
            state["mapping"] = False

    def recording_append(self, client, new_codes):
        start = self.num_unique
        views.server_chunks.append(list(range(start, start + len(new_codes))))
        return append_unique(self, client, new_codes)

    _ProtocolRun.compare = recording_compare
    for layout in map_labels:
        layout.map_labels = recording_map_labels
    _PackedRun.append_unique = recording_append
    try:
        yield views
    finally:
        _ProtocolRun.compare = compare
        for layout, original in map_labels.items():
            layout.map_labels = original
        _PackedRun.append_unique = append_unique


def senders_chunks(senders: Sequence[str]) -> list[list[int]]:
    """The naive layout's growth of U as the server sees it: per sender, the indices of
    the entries it added, from the server's list of who sent each entry."""
    return [
        [i for i, sender in enumerate(senders) if sender == name] for name in dict.fromkeys(senders)
    ]


def closure_ranking(lists: Sequence[Sequence[int]], size: int) -> np.ndarray:
    """Rank of each of ``size`` nodes by the transitive closure of the consecutive pairs of
    ``lists``: (nodes it follows) - (nodes it precedes), ties by index."""
    reach = np.zeros((size, size), dtype=bool)
    for items in lists:
        for first, second in zip(items[:-1], items[1:]):
            reach[first, second] = True
    for middle in range(size):
        reach |= reach[:, middle : middle + 1] & reach[middle : middle + 1, :]
    score = reach.sum(axis=0) - reach.sum(axis=1)
    return ranks(score)


def borda_ranking(lists: Sequence[Sequence[int]], size: int) -> np.ndarray:
    """Rank of each of ``size`` nodes by its average relative position in ``lists``
    (``0`` first, ``1`` last; ``0.5`` where it is never in a list of two or more)."""
    total, seen = np.zeros(size), np.zeros(size)
    for items in lists:
        if len(items) < 2:
            continue
        total[list(items)] += np.arange(len(items)) / (len(items) - 1)
        seen[list(items)] += 1
    average = np.where(seen > 0, total / np.maximum(seen, 1), 0.5)
    return ranks(average)


def ranks(score: np.ndarray) -> np.ndarray:
    order = np.lexsort((np.arange(len(score)), score))
    rank = np.empty(len(score), dtype=np.int64)
    rank[order] = np.arange(len(score))
    return rank


@dataclass(frozen=True)
class Recovery:
    """Share of labels recovered exactly by each attacker and ranking."""

    key_holder_closure: float
    key_holder_borda: float
    server_closure: float
    server_borda: float


def attack(
    client_labels: list[dict[int, int]],
    classes: int,
    seed: int,
    protocol: str = "packed-blind",
    **registry_options,
) -> Recovery:
    """Register ``client_labels`` (labels ``0..classes-1``) with a secure registry of
    ``seed`` and run both attacks on what the key holder and the server saw."""
    registry = CKKSRegistry(seed=seed, protocol=protocol, **registry_options)
    with observe() as views:
        result = registry.register(client_labels, num_classes=classes)
    size = result.num_placeholders
    assert size == classes
    label_of_placeholder = np.empty(size, dtype=np.int64)
    for mapping in result.client_maps:
        for label, placeholder in mapping.items():
            label_of_placeholder[placeholder] = label
    # truth: the label of each entry of U
    label_of_index = label_of_placeholder[np.array(registry.placeholder_of_index)]

    def share(guess: np.ndarray, truth: np.ndarray) -> float:
        return float(np.mean(guess == truth))

    key_rows = views.key_holder_rows
    # the server knowing the seed takes placeholder p for U entry assign_placeholders(...)[i]
    believed = np.asarray(assign_placeholders(size, seed))
    server_truth = label_of_placeholder[believed]  # the real label of what it ranks as U_i
    chunks = views.server_chunks
    if isinstance(registry._run, _NaiveRun):
        chunks = senders_chunks(registry._run.unique_senders)
    return Recovery(
        key_holder_closure=share(closure_ranking(key_rows, size), label_of_index),
        key_holder_borda=share(borda_ranking(key_rows, size), label_of_index),
        server_closure=share(closure_ranking(chunks, size), server_truth),
        server_borda=share(borda_ranking(chunks, size), server_truth),
    )


def main() -> None:
    clients = {10: 10, 100: 20}
    print("classes  split           protocol      KH-closure  KH-Borda  srv-closure  srv-Borda")
    for classes in (10, 100):
        for spec in ("iid", "dirichlet:0.5", "dirichlet:0.1"):
            protocols = ("packed-blind", "naive-blind") if classes == 10 else ("packed-blind",)
            for protocol in protocols:
                results = [
                    attack(federation_labels(spec, classes, clients[classes], seed), classes, seed)
                    if protocol == "packed-blind"
                    else attack(
                        federation_labels(spec, classes, clients[classes], seed),
                        classes,
                        seed,
                        protocol,
                    )
                    for seed in range(3)
                ]
                mean = {
                    name: np.mean([getattr(r, name) for r in results])
                    for name in Recovery.__dataclass_fields__
                }
                print(
                    f"{classes:7d}  {spec:14s}  {protocol:12s}  "
                    f"{mean['key_holder_closure']:10.2f}  {mean['key_holder_borda']:8.2f}  "
                    f"{mean['server_closure']:11.2f}  {mean['server_borda']:9.2f}"
                )

    print()
    print("the key holder with its party's secrets (closure, mean of 3 seeds; leaky: format 1)")
    print("classes  split           defended  leaky")
    for classes in (10, 100):
        for spec in ("iid", "dirichlet:0.5", "dirichlet:0.1"):
            rates = {
                leaky: np.mean([in_process_key_holder(spec, classes, s, leaky) for s in range(3)])
                for leaky in (False, True)
            }
            print(f"{classes:7d}  {spec:14s}  {rates[False]:8.2f}  {rates[True]:5.2f}")


# -- the key holder over Flower, with everything its own node holds ------------------------


@dataclass(frozen=True)
class KeyHolderView:
    """What client 0's node (the key holder) holds after a secure registration over the
    nodes' real message handlers, and the truth to score it against.

    Parameters
    ----------
    rows : list of list of int
        Per client, the index in ``U`` of each of its labels, in the order the key holder
        decrypted them (the mapping phase's match rows).
    own_order : list of int
        The key holder's own encoding order (its own order key).
    derived_orders : dict
        Client -> its encoding order as the key holder can derive it from what its node
        holds: every client's on the leaky variant, none on the defended one.
    label_of_index : numpy.ndarray
        The real label of each entry of ``U`` (the truth, from the nodes).
    own_labels : set of int
        The labels the key holder holds itself.
    """

    rows: list[list[int]]
    own_order: list[int]
    derived_orders: dict[int, list[int]]
    label_of_index: np.ndarray
    own_labels: set[int]


def ascending(rows: Sequence[int], order: Sequence[int]) -> list[int]:
    """``rows`` (a client's labels in the order ``order`` sent them) put back in the order
    the client lists its labels, ascending: row ``i`` is its label number ``order[i]``."""
    listed = [0] * len(rows)
    for row, position in zip(rows, order):
        listed[position] = row
    return listed


def flower_key_holder_view(
    spec: str, seed: int, key_file, leaky: bool, order_dir=None
) -> KeyHolderView:
    """Register digits over ten nodes, each message delivered to the node's own handler
    (``stratify.flower.node``), and return what the key holder's node holds.

    Parameters
    ----------
    spec : str
        The split.
    seed : int
        The run's seed (the split).
    key_file : path
        The federation key file every node loads.
    leaky : bool
        Every node derives its order from the shared secret as format 1 did (the key
        holder can derive them all), instead of using its own order key.
    order_dir : path, optional
        A folder of the nodes' order-key files (``client-K.json``, ``--node-config
        order-key``), so that a test is repeatable; default: each node draws its own.
    """
    from flwr.app import Context, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from stratify.config import TrainConfig
    from stratify.flower import node
    from stratify.flower.keys import read_federation_keys
    from stratify.flower.link import NodeLink
    from stratify.flower.messages import HELLO, MATCHES, config_json
    from stratify.flower.server import register_over_flower
    from stratify.registry.client_secrets import LegacyOrderKey

    keys = read_federation_keys(key_file)
    job = TrainConfig(
        dataset="digits",
        clients=10,
        partition=spec,
        seed=seed,
        mode="batch",
        secure=True,
        protocol="packed-blind",
        device="cpu",
    )
    handlers = {
        "query.hello": node.hello,
        "query.labels": node.labels,
        "query.unique": node.unique,
        "query.matches": node.matches,
        "query.counts": node.counts,
        "query.total": node.total,
    }
    seen: list[tuple[list[int], np.ndarray]] = []

    class Link(NodeLink):
        """Each message straight to its node's handler, as a deployed SuperNode runs it."""

        def exchange(self, requests):
            replies = []
            for client, kind, content in requests:
                message = self.message(client, kind, RecordDict(dict(content)))
                settings = {"partition-id": client, "registry-keys": str(key_file)}
                if order_dir is not None:
                    settings["order-key"] = str(Path(order_dir) / f"client-{client}.json")
                context = Context(
                    run_id=1, node_id=client, node_config=settings, state=RecordDict(),
                    run_config={},
                )  # fmt: skip
                answer = handlers[kind](message, context).content
                if kind == MATCHES:  # what the key holder's node decrypted
                    sizes = [int(size) for size in content.config_records["compared"]["labels"]]
                    matched = np.asarray(answer.array_records["matched"]["matched"].numpy())
                    seen.append((sizes, matched))
                replies.append(answer)
            return replies

    registration = node.ClientRegistration
    identity = {
        name: getattr(TaskIdentity, name, None) for name in ("_run_id", "_task_id", "_node_id")
    }
    nodes = node._NODES
    try:
        node._NODES = {}
        for name in identity:
            setattr(TaskIdentity, name, 1)
        if leaky:

            def derived(keys, protocol, client, labels, order_key=None):
                return registration(
                    keys, protocol, client, labels, LegacyOrderKey(keys.secrets.secret, client)
                )

            node.ClientRegistration = derived
        link = Link(None, job, timeout=1.0, retries=0)
        hellos = link.exchange([(client, HELLO, RecordDict()) for client in range(job.clients)])
        register_over_flower(link, job, hellos, num_classes=10)
        own = {
            client: node._NODES[(client, config_json(job))].registration
            for client in range(job.clients)
        }
    finally:
        node._NODES = nodes
        node.ClientRegistration = registration
        for name, value in identity.items():
            setattr(TaskIdentity, name, value)
    sizes, matched = seen[-1]  # the mapping phase: every client's labels against U
    assert sizes == [len(own[client].sent) for client in range(job.clients)], sizes
    flat = matched.reshape(sum(sizes), -1)
    rows, start = [], 0
    for size in sizes:
        rows.append([int(np.flatnonzero(row)[0]) for row in flat[start : start + size]])
        start += size
    label_of_index = np.full(flat.shape[1], -1)
    for client, client_rows in enumerate(rows):
        for index, (label, _) in zip(client_rows, own[client].sent):
            label_of_index[index] = int(label)
    derived_orders = {}
    if leaky:  # from the key file alone, as format 1 let every node derive them
        for client, client_rows in enumerate(rows):
            derived_orders[client] = LegacyOrderKey(keys.secrets.secret, client).order(
                len(client_rows)
            )
    return KeyHolderView(
        rows=rows,
        own_order=own[0].order_key.order(len(rows[0])),
        derived_orders=derived_orders,
        label_of_index=label_of_index,
        own_labels={int(label) for label, _ in own[0].sent},
    )


@dataclass(frozen=True)
class KeyHolderRecovery:
    """The order attacks of the key holder on the others' match rows (each put back in
    label order where it can derive that client's order), and what it knows by itself.

    ``closure``, ``borda``: share of the entries of ``U`` whose label the ranking from the
    other clients' rows gets exactly (chance ``1 / C``). ``unheld_closure``: the same with
    its own rows added in its own label order, over the entries it does not hold itself.
    ``own_share``: the share of ``U`` it names because it holds those labels itself (not
    an order attack: no order key hides that)."""

    closure: float
    borda: float
    unheld_closure: float
    own_share: float


def key_holder_recovery(view: KeyHolderView) -> KeyHolderRecovery:
    """Score the key holder's order attacks on ``view``.

    Parameters
    ----------
    view : KeyHolderView
        What its node held (:func:`flower_key_holder_view`).
    """
    size = len(view.label_of_index)
    others = [
        ascending(rows, view.derived_orders[client]) if client in view.derived_orders else rows
        for client, rows in enumerate(view.rows)
        if client != 0
    ]
    truth = view.label_of_index
    with_own = [ascending(view.rows[0], view.own_order), *others]
    unheld = np.array([label not in view.own_labels for label in truth])
    closure_all = closure_ranking(with_own, size)
    return KeyHolderRecovery(
        closure=float(np.mean(closure_ranking(others, size) == truth)),
        borda=float(np.mean(borda_ranking(others, size) == truth)),
        unheld_closure=float(np.mean(closure_all[unheld] == truth[unheld]))
        if unheld.any()
        else 0.0,
        own_share=float(1 - unheld.mean()),
    )


def in_process_key_holder(spec: str, classes: int, seed: int, leaky: bool) -> float:
    """The key holder's closure attack in-process, with what its party holds: the shared
    secret and its own order key (defended), or, on the leaky variant, format 1's one
    secret every client's order derives from. Returns the share of ``U``'s labels ranked
    exactly from the other clients' match rows (10 clients for 10 classes, 20 for 100).

    Parameters
    ----------
    spec : str
        The split.
    classes : int
        Labels ``0..classes-1``.
    seed : int
        The split's seed and the secrets' (:func:`fixed_secrets`).
    leaky : bool
        Every order derived from the shared secret (format 1).
    """
    clients = federation_labels(spec, classes, 10 if classes == 10 else 20, seed)
    fixed = fixed_secrets(seed)
    secrets = RegistrySecrets.legacy(fixed.shared.secret) if leaky else fixed
    registry = CKKSRegistry(seed=seed, protocol="packed-blind", secrets=secrets)
    with observe() as views:
        result = registry.register(clients, num_classes=classes)
    label_of_placeholder = np.empty(result.num_placeholders, dtype=np.int64)
    for mapping in result.client_maps:
        for label, placeholder in mapping.items():
            label_of_placeholder[placeholder] = label
    truth = label_of_placeholder[np.array(registry.placeholder_of_index)]
    assert len(views.key_holder_rows) == len(clients)
    others = [
        # leaky: the key holder derives client k's order from the shared secret
        ascending(rows, secrets.client_order(client, len(rows))) if leaky else rows
        for client, rows in enumerate(views.key_holder_rows)
        if client != 0
    ]
    return float(np.mean(closure_ranking(others, len(truth)) == truth))


if __name__ == "__main__":
    main()
