"""A class the clients buffer fewer samples of than half a class's share is scarce (its
samples are registered and trained at once); one at exactly half a share is not
(docs/streaming.md)."""

from __future__ import annotations

import numpy as np
from test_stream_learner import cluster, config

from stratify.stream import Event, StreamLearner


def test_a_class_at_exactly_half_a_share_is_not_scarce():
    learner = StreamLearner(config())
    rng = np.random.default_rng(0)
    # class 0 once, classes 1 and 2 alternately: 1 of 6 buffered samples is exactly half
    # of a class's share (6 / 3 classes = 2)
    for line, label in enumerate([0, 1, 2, 1, 2, 1], start=1):
        learner.ingest(Event("a", label, cluster(label, rng), line))
    held = np.bincount(learner.buffers.targets()[learner.buffers.occupied])
    assert sorted(held[held > 0].tolist()) == [1, 2, 3]
    assert not learner.class_rows.scarce(0, learner.buffers)
    # one more sample of another class: 1 of 7 is less than half a share
    learner.ingest(Event("a", 2, cluster(2, rng), 7))
    assert learner.class_rows.scarce(0, learner.buffers)
    assert not learner.class_rows.scarce(1, learner.buffers)
    assert not learner.class_rows.scarce(2, learner.buffers)
