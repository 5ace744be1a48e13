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

from stratify.flower.link import send_and_receive  # noqa: E402


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
