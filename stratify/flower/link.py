"""The server's end of the messages: which node is which client, bounded waits and
retries, and the traffic the messages carried (docs/flower.md, "A client that does not
answer").

Its own module so that the server app (:mod:`.server`) and the encrypted registry's
messages (:mod:`.registry`) both send through it without importing each other.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

from stratify.config import TrainConfig
from stratify.errors import ConfigError, TrainingError
from stratify.flower.messages import HELLO, config_record

log = logging.getLogger("stratify.flower")

#: seconds between two looks for replies: Flower 1.42's in-memory (simulation) grid's own
#: pull interval; its deployed grid's ``send_and_receive`` looks every 3 s, which a reply
#: waits for on average 1.5 s per exchange (docs/flower.md, "Wall time")
PULL_INTERVAL = 0.1


def send_and_receive(
    grid: Grid,
    messages: Sequence[Message],
    timeout: float | None,
    interval: float = PULL_INTERVAL,
    refused: list[Message] | None = None,
) -> list[Message]:
    """Push ``messages`` through ``grid`` and pull their replies every ``interval`` seconds
    until every one has answered or ``timeout`` seconds have passed (the loop of Flower's
    ``Grid.send_and_receive``, on its public ``push_messages`` and ``pull_messages``).

    Parameters
    ----------
    grid : flwr.serverapp.Grid
        Flower's grid of the run.
    messages : sequence of flwr.app.Message
        The requests, each to its node.
    timeout : float or None
        Seconds to wait for the replies; ``None``: until every one has answered.
    interval : float
        Seconds between two pulls.
    refused : list, optional
        Where to add the messages the grid refused to push (Flower's grid gives them the
        id ``None``: the SuperLink knows no such node, one that left the federation);
        none of them is waited for.

    Returns
    -------
    list of flwr.app.Message
        The replies received in time, in the order they arrived.
    """
    pushed = list(grid.push_messages(messages))
    if refused is not None:
        refused.extend(m for m, pushed_id in zip(messages, pushed) if pushed_id is None)
    waiting = {pushed_id for pushed_id in pushed if pushed_id is not None}
    deadline = time.monotonic() + (math.inf if timeout is None else timeout)
    replies: list[Message] = []
    while waiting:
        pulled = list(grid.pull_messages(waiting))
        replies.extend(pulled)
        waiting.difference_update(reply.metadata.reply_to_message_id for reply in pulled)
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(interval)
    return replies


class ClientLostError(TrainingError):
    """A client did not answer after every retry; the run stopped (no hang), unless it
    drops such a client (``on_lost="drop"``).

    Parameters
    ----------
    message : str
        Which client, which node, what it did not answer and how often it was asked.
    clients : sequence of int
        The clients lost.
    """

    def __init__(self, message: str, clients: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.clients = tuple(clients)


@dataclass
class Traffic:
    """What the server app actually sent and received, counted message by message:
    ``transfers`` model-sized payloads (a model down, a model up), ``uploads``
    parameter-sized ones that are not models (a summed gradient up, SCAFFOLD's offset
    down), ``messages`` every message the server sent."""

    transfers: int = 0
    uploads: int = 0
    messages: int = 0


class NodeLink:
    """The server's end of the messages: client number -> node, bounded waits, retries.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
        Flower's grid of the run (simulated or a SuperLink's).
    config : TrainConfig
        The run's settings, carried by every message so a node knows its data.
    timeout : float
        Seconds to wait for the replies of one exchange.
    retries : int
        Times an unanswered request is sent again before the run stops.
    record : bool
        Keep every message the server sends and receives in :attr:`payloads` (what the
        server sees: the tests of docs/flower.md, "What each party sees").
    """

    def __init__(
        self, grid: Grid, config: TrainConfig, timeout: float, retries: int, record: bool = False
    ) -> None:
        self.grid = grid
        self.config = config
        self.run_record = config_record(config)
        self.timeout = timeout
        self.retries = retries
        self.traffic = Traffic()
        self.nodes: dict[int, int] = {}
        #: with ``record``: (``"sent"`` or ``"received"``, message type, content), in order
        self.payloads: list[tuple[str, str, RecordDict]] | None = [] if record else None

    def keep(self, direction: str, kind: str, content: RecordDict) -> None:
        if self.payloads is not None:
            self.payloads.append((direction, kind, content))

    def connect(self) -> list[RecordDict]:
        """Wait (up to ``timeout``) for the run's clients to answer; returns each client's
        hello (its number of samples and its registry input)."""
        answers: dict[int, RecordDict] = {}
        deadline = time.monotonic() + self.timeout
        while len(answers) < self.config.clients:
            waiting = [node for node in self.grid.get_node_ids() if node not in self.nodes.values()]
            replies = send_and_receive(
                self.grid,
                [self.message(node, HELLO, RecordDict()) for node in waiting],
                timeout=max(1.0, deadline - time.monotonic()),
            )
            for reply in replies:
                if reply.has_error():
                    raise ClientLostError(
                        f"node {reply.metadata.src_node_id} could not load its data: "
                        f"{reply.error.reason}"
                    )
                self.keep("received", HELLO, reply.content)
                client = int(reply.content.config_records["node"]["client"])  # type: ignore[arg-type]
                if client in self.nodes:
                    raise ConfigError(f"two nodes are client {client}: give each its partition-id")
                self.nodes[client] = reply.metadata.src_node_id
                answers[client] = reply.content
            if len(answers) < self.config.clients:
                if time.monotonic() > deadline:
                    missing = sorted(set(range(self.config.clients)) - set(answers))
                    raise ClientLostError(
                        f"clients {missing} did not answer within {self.timeout:g} s "
                        f"({len(list(self.grid.get_node_ids()))} nodes connected)"
                    )
                time.sleep(0.2)
        return [answers[client] for client in range(self.config.clients)]

    def message(self, node: int, kind: str, content: RecordDict) -> Message:
        """A new message to ``node`` (Flower sends a message once), carrying the run's
        settings beside ``content``."""
        content["run"] = self.run_record
        self.traffic.messages += 1
        self.keep("sent", kind, content)
        return Message(content, dst_node_id=node, message_type=kind)

    def exchange(self, requests: Sequence[tuple[int, str, RecordDict]]) -> list[RecordDict]:
        """Send each ``(client, message type, content)`` to its client's node and return
        the replies' contents in the requests' order. A request unanswered within
        :attr:`timeout` (or answered with an error) is sent again up to :attr:`retries`
        times; then :class:`ClientLostError` names the client and what was done."""
        if len({client for client, _, _ in requests}) != len(requests):
            raise AssertionError("an exchange sends one message per node")
        answers: dict[int, RecordDict] = {}
        errors: dict[int, str] = {}
        for attempt in range(self.retries + 1):
            pending = [index for index in range(len(requests)) if index not in answers]
            if not pending:
                break
            if attempt:
                log.warning(
                    "retry %d of %d: clients %s",
                    attempt,
                    self.retries,
                    [requests[index][0] for index in pending],
                )
            messages = []
            for index in pending:
                client, kind, content = requests[index]
                messages.append(self.message(self.nodes[client], kind, RecordDict(dict(content))))
            refused: list[Message] = []
            replies = send_and_receive(self.grid, messages, self.timeout, refused=refused)
            # a reply is matched to its request by the request's id (which pushing it set),
            # not by its sender: the error the SuperLink answers for a node it counts as
            # offline comes from the SuperLink itself
            asked = {
                message.metadata.message_id: index for message, index in zip(messages, pending)
            }
            for message in refused:
                errors[asked[message.metadata.message_id]] = (
                    "the SuperLink refused the message (the node left the federation)"
                )
            for reply in replies:
                answered = asked.get(reply.metadata.reply_to_message_id)
                if answered is None:
                    continue
                if reply.has_error():
                    errors[answered] = reply.error.reason or "no reason given"
                else:
                    self.keep("received", requests[answered][1], reply.content)
                    answers[answered] = reply.content
        lost = [index for index in range(len(requests)) if index not in answers]
        if lost:
            details = "; ".join(
                f"client {requests[index][0]} (node {self.nodes[requests[index][0]]}): "
                + errors.get(index, f"no reply within {self.timeout:g} s")
                for index in lost
            )
            raise ClientLostError(
                f"{details}; sent {self.retries + 1} times ({requests[lost[0]][1]})",
                [requests[index][0] for index in lost],
            )
        return [answers[index] for index in range(len(requests))]
