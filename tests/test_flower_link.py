"""The server's own wait for replies (``stratify.flower.link.send_and_receive``): Flower's
``Grid.send_and_receive`` loop on the grid's public ``push_messages`` and
``pull_messages``, pulling every ``PULL_INTERVAL`` seconds instead of the deployed grid's
3 s (docs/flower.md, "Wall time")."""

from __future__ import annotations

from collections.abc import Iterable
from types import SimpleNamespace

import pytest

pytest.importorskip(
    "flwr", reason="the flower extra is not installed (pip install -e '.[flower]' in the checkout)"
)

from flwr.app import Message, RecordDict  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from stratify.config import TrainConfig  # noqa: E402
from stratify.flower.link import ClientLostError, NodeLink, send_and_receive  # noqa: E402


def message(**metadata: object) -> SimpleNamespace:
    """What the wait reads of a Flower message: its metadata."""
    return SimpleNamespace(metadata=SimpleNamespace(**metadata))


class ScriptedGrid:
    """A grid whose node ``k`` answers at the pull numbered ``answer_at[k]`` (never if
    absent); it counts the pulls and remembers which message ids each pull asked for."""

    def __init__(self, answer_at: dict[int, int]) -> None:
        self.answer_at = answer_at
        self.pushed: dict[str, SimpleNamespace] = {}
        self.pulls: list[set[str]] = []

    def push_messages(self, messages: Iterable[SimpleNamespace]) -> list[str]:
        ids = []
        for number, message in enumerate(messages):
            self.pushed[f"m{number}"] = message
            ids.append(f"m{number}")
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[SimpleNamespace]:
        asked = set(message_ids)
        self.pulls.append(asked)
        replies = []
        for message_id in sorted(asked):
            node = self.pushed[message_id].metadata.dst_node_id
            if self.answer_at.get(node) == len(self.pulls):
                replies.append(message(reply_to_message_id=message_id))
        return replies


def requests(nodes: Iterable[int]) -> list[SimpleNamespace]:
    return [message(dst_node_id=node) for node in nodes]


def answered(replies: list[SimpleNamespace]) -> list[str]:
    return [reply.metadata.reply_to_message_id for reply in replies]


def test_every_reply_is_collected_however_many_pulls_it_takes() -> None:
    grid = ScriptedGrid({1: 1, 2: 3, 3: 2})
    replies = send_and_receive(grid, requests([1, 2, 3]), timeout=60.0, interval=0.0)  # type: ignore[arg-type]
    assert answered(replies) == ["m0", "m2", "m1"]
    # a pull asks only for what is still unanswered, and none follows the last reply
    assert grid.pulls == [{"m0", "m1", "m2"}, {"m1", "m2"}, {"m1"}]


def test_a_silent_node_ends_the_wait_at_the_timeout_with_the_others_replies() -> None:
    grid = ScriptedGrid({1: 2})
    replies = send_and_receive(grid, requests([1, 2]), timeout=0.3, interval=0.01)  # type: ignore[arg-type]
    assert answered(replies) == ["m0"]
    assert len(grid.pulls) > 2 and grid.pulls[-1] == {"m1"}


class OfflineGrid(ScriptedGrid):
    """A grid whose nodes answer at once, but for a node in ``offline``, whose requests the
    SuperLink answers itself, as Flower's does for a node that stopped sending heartbeats:
    an error reply from the SuperLink's node id 0, naming the request it answers."""

    def __init__(self, offline: set[int]) -> None:
        super().__init__({})
        self.offline = offline

    def push_messages(self, messages: Iterable[Message]) -> list[str]:  # type: ignore[override]
        ids = []
        for message in messages:
            number = f"m{len(self.pushed)}"
            message.metadata.__dict__["_message_id"] = number  # as Flower's grids set it
            self.pushed[number] = message
            ids.append(number)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[SimpleNamespace]:
        self.pulls.append(set(message_ids))
        replies = []
        for message_id in sorted(self.pulls[-1]):
            node = self.pushed[message_id].metadata.dst_node_id
            offline = node in self.offline
            replies.append(
                SimpleNamespace(
                    metadata=SimpleNamespace(
                        reply_to_message_id=message_id, src_node_id=0 if offline else node
                    ),
                    content=RecordDict(),
                    error=SimpleNamespace(reason=NODE_UNAVAILABLE if offline else None),
                    has_error=lambda offline=offline: offline,
                )
            )
        return replies


def client_1_lost(grid: OfflineGrid, monkeypatch: pytest.MonkeyPatch) -> ClientLostError:
    """The error of an exchange asking clients 0 and 1 (nodes 11 and 12) over ``grid``,
    one retry, in which client 1 must be the one lost."""
    for name in ("_run_id", "_task_id", "_node_id"):  # a message is made inside a task
        monkeypatch.setattr(TaskIdentity, name, 1)
    link = NodeLink(grid, TrainConfig(dataset="digits", clients=2), timeout=3600.0, retries=1)  # type: ignore[arg-type]
    link.nodes = {0: 11, 1: 12}
    with pytest.raises(ClientLostError) as lost:
        link.exchange([(0, "train", RecordDict()), (1, "train", RecordDict())])
    assert lost.value.clients == (1,) and "sent 2 times" in str(lost.value)
    assert "no reply within" not in str(lost.value)
    return lost.value


NODE_UNAVAILABLE = "Error: Node Unavailable — The destination node failed to report a heartbeat"


def test_the_superlinks_error_for_an_offline_node_is_that_clients_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Flower's SuperLink answers a request to a node it counts as offline with an error
    of its own (sender: the SuperLink, node 0); the exchange reads it as that client's
    answer, retries, and names the reason, rather than dropping the reply as from no
    client and reporting a silence it did not wait for."""
    grid = OfflineGrid(offline={12})
    lost = client_1_lost(grid, monkeypatch)
    assert "client 1 (node 12): Error: Node Unavailable" in str(lost)
    # the first try asked both nodes, the retry only the offline one
    assert [grid.pushed[m].metadata.dst_node_id for m in sorted(grid.pushed)] == [11, 12, 12]


class UnregisteredGrid(OfflineGrid):
    """A grid on which node ``gone`` has left the federation: Flower's grid gives a message
    to it the id ``None`` (the SuperLink refused it) and nothing answers it."""

    def __init__(self, gone: int) -> None:
        super().__init__(offline=set())
        self.gone = gone

    def push_messages(self, messages: Iterable[Message]) -> list[str | None]:  # type: ignore[override]
        messages = list(messages)
        ids = super().push_messages(messages)
        return [None if m.metadata.dst_node_id == self.gone else i for m, i in zip(messages, ids)]


def test_a_message_the_superlink_refuses_is_that_clients_answer_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node that left the federation (stopped, unregistered): the push of its request is
    refused, which the exchange reads as the client's answer rather than waiting out its
    timeout for a message that was never queued."""
    grid = UnregisteredGrid(gone=12)
    lost = client_1_lost(grid, monkeypatch)
    assert "client 1 (node 12): the SuperLink refused" in str(lost)
    # no pull asked for a refused message (it has no id to ask with): one pull, for node
    # 11's reply; the retry pushed only node 12's, refused again
    assert grid.pulls == [{"m0"}]
