"""Drift (docs/streaming.md, "river"): river's ADWIN on the prequential errors fires on a
planted abrupt change and ages the clients' buffers out; a change to fewer errors keeps
them."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("river")

from stratify.stream import StreamConfig, StreamLearner  # noqa: E402
from stratify.stream.buffers import ClientBuffers  # noqa: E402
from stratify.stream.drift import DriftAging  # noqa: E402
from stratify.stream.river import StreamClassifier  # noqa: E402

CHANGE, AFTER = 1500, 400


def flipped_stream() -> list[tuple[dict[str, float], bool]]:
    """``x0 > 0`` for :data:`CHANGE` events, then its opposite: an abrupt label flip."""
    points = np.random.default_rng(0).normal(size=(CHANGE + AFTER, 2))
    return [
        ({"a": float(a), "b": float(b)}, bool(a > 0) == (number < CHANGE))
        for number, (a, b) in enumerate(points)
    ]


def learn(model: StreamClassifier) -> list[bool]:
    right = []
    for number, (x, y) in enumerate(flipped_stream()):
        right.append(model.predict_one(x) == y)
        model.learn_one(x, y, client=number % 10)
    return right


def old_samples(model: StreamClassifier) -> int:
    buffers = model.learner.buffers
    return int((buffers.occupied & (buffers.arrival < CHANGE)).sum())


def test_a_planted_abrupt_drift_is_detected_and_the_buffers_aged_out() -> None:
    plain = StreamClassifier(secure=False, drift=False)
    right_plain = learn(plain)
    # 10 clients of 100 samples: 600 samples of the old concept are still buffered
    assert old_samples(plain) == 600

    model = StreamClassifier(secure=False)  # drift detection by default
    right = learn(model)
    drift = model.learner.drift
    assert drift is not None and drift.detections >= 1 and drift.aged_out > 0
    assert old_samples(model) < 60
    # the new concept is learned sooner: events +100 to +400 after the flip
    after = slice(CHANGE + 100, CHANGE + AFTER)
    assert np.mean(right[after]) > 0.8 > 0.5 > np.mean(right_plain[after])


def test_fewer_errors_is_a_change_that_keeps_the_buffers() -> None:
    buffers = ClientBuffers(capacity=1000, sample_shape=(1,), device="cpu")
    buffers.add_client()
    buffers.add_placeholder(0)
    drift = DriftAging()
    for number in range(1000):
        buffers.insert(0, np.zeros(1, dtype=np.float32), 0, 0, number)
        drift.update(number < 500, buffers)  # every prediction wrong, then every one right
    assert drift.detections >= 1
    assert drift.aged_out == 0 and buffers.size == 1000


def test_the_learner_feeds_its_errors_to_the_detector() -> None:
    # disconnected (no update per learned event), nothing would be detected
    seen: list[bool] = []

    class Recording(DriftAging):
        def update(self, wrong: bool, buffers: ClientBuffers) -> bool:
            seen.append(wrong)
            return super().update(wrong, buffers)

    learner = StreamLearner(StreamConfig(secure=False), drift=Recording())
    for number, (x, y) in enumerate(flipped_stream()[:50]):
        learner.learn_one(x, y, client=number % 3)
    assert len(seen) == 50 and seen[0] is True  # the first event had nothing to predict
    assert 0 < sum(seen) < 50


def test_learn_one_after_predict_one_of_the_same_features_predicts_once() -> None:
    # river's progressive validation: predict_one(x), then learn_one(x, y) with x itself
    model = StreamClassifier(secure=False)
    model.learn_one({"a": 1.0, "b": 0.0}, True)
    learner = model.learner
    forward = learner.model.probabilities
    calls: list[int] = []

    def counting(*args: object) -> object:
        calls.append(1)
        return forward(*args)

    learner.model.probabilities = counting  # type: ignore[method-assign]
    x = {"a": -1.0, "b": 0.5}
    model.predict_one(x)
    model.learn_one(x, False)
    assert len(calls) == 1
    model.predict_one(x)
    model.learn_one(dict(x), False)  # equal features, another object: predicted again
    assert len(calls) == 3
    model.predict_one(x)
    model.learn_one({"a": 2.0, "b": 0.0}, True)  # something else learned in between
    model.learn_one(x, False)
    assert len(calls) == 6


def test_learn_one_reads_a_predicted_dictionary_once_and_anything_else_again() -> None:
    """The row predict_one read from a dictionary is the one learn_one of the same object
    learns; a dictionary whose new names the prediction left out, and an array (a caller
    may refill it in between), are read again."""
    model = StreamClassifier(secure=False)
    model.learn_one({"a": 1.0, "b": 0.0}, True)
    learner = model.learner
    read = learner.features.vector
    reads: list[object] = []

    def counting(x: object, *args: object, **kwargs: object) -> object:
        reads.append(x)
        return read(x, *args, **kwargs)

    learner.features.vector = counting  # type: ignore[method-assign]
    x = {"a": -1.0, "b": 0.5}
    model.predict_one(x)
    model.learn_one(x, False)
    assert len(reads) == 1
    assert learner.buffers.x_array[learner.buffers.occupied][-1].tolist() == [-1.0, 0.5]
    wider = {"a": 2.0, "b": 1.0, "c": 4.0}
    model.predict_one(wider)  # "c" is new: left out of the prediction
    with pytest.warns(UserWarning, match="new feature"):
        model.learn_one(wider, True)
    assert len(reads) == 3 and learner.features.input_shape == (3,)
    assert learner.buffers.x_array[learner.buffers.occupied][-1].tolist() == [2.0, 1.0, 4.0]
    plain = StreamLearner(StreamConfig(secure=False))
    plain.learn_one(np.array([1.0, 0.0]), "p")
    sample = np.array([0.5, 0.5])  # float64: the learner reads a float32 copy
    plain.predict_one(sample)
    sample[:] = [3.0, -2.0]  # refilled with the next event before it is learned
    plain.learn_one(sample, "q")
    assert plain.buffers.x_array[plain.buffers.occupied][-1].tolist() == [3.0, -2.0]


def test_a_detected_change_to_more_errors_boosts_the_training_rounds() -> None:
    """After a change to more errors, each of the next ``boost_events`` events trains
    ``1 + boost_rounds`` rounds (one step each, the default policy): the steps taken are
    the events plus the boost's extra rounds, no more."""
    model = StreamClassifier(secure=False)
    model.learner.drift = DriftAging(boost_events=50, boost_rounds=2)
    learn(model)
    drift, stats = model.learner.drift, model.learner.stats
    assert drift.aged_out > 0  # a change to more errors was detected
    boosted = stats.steps - stats.events
    # each such detection (re)starts a boost of 50 events; the last one may run to the end
    assert boosted > 0 and boosted % 2 == 0 and boosted <= 2 * 50 * drift.detections
    unboosted = StreamClassifier(secure=False)
    unboosted.learner.drift = DriftAging(boost_events=0)
    learn(unboosted)
    assert unboosted.learner.stats.steps == unboosted.learner.stats.events


def test_the_boost_learns_a_flip_sooner_and_a_stationary_stream_never_boosts() -> None:
    right_boosted = learn(StreamClassifier(secure=False))  # the default boost
    unboosted = StreamClassifier(secure=False)
    unboosted.learner.drift = DriftAging(boost_events=0)
    right_unboosted = learn(unboosted)
    # events +100 to +250 after the flip are right more often
    after = slice(CHANGE + 100, CHANGE + 250)
    assert np.mean(right_boosted[after]) > np.mean(right_unboosted[after])
    # no change at all: x0 > 0 throughout; nothing boosted
    steady = StreamClassifier(secure=False)
    points = np.random.default_rng(1).normal(size=(CHANGE, 2))
    for number, (a, b) in enumerate(points):
        x = {"a": float(a), "b": float(b)}
        steady.predict_one(x)
        steady.learn_one(x, bool(a > 0), client=number % 10)
    assert steady.learner.stats.steps == steady.learner.stats.events == CHANGE


def test_the_command_lines_drift_option_detects_the_flip(tmp_path) -> None:
    """``stratify stream --drift adwin`` learns the flipped concept sooner than the
    default ``--drift off``, which never detects (the option changes the run)."""
    import json

    from stratify.cli.main import main

    source = tmp_path / "events.jsonl"
    lines = [
        json.dumps({"client": f"c{number % 10}", "label": int(y), "x": [x["a"], x["b"]]})
        for number, (x, y) in enumerate(flipped_stream())
    ]
    source.write_text("\n".join(lines) + "\n")
    accuracies = {}
    for drift in ("off", "adwin"):
        out = tmp_path / drift
        argv = ["stream", "--source", str(source), "--out", str(out), "--no-secure"]
        main([*argv, "--drift", drift, "--window", str(AFTER - 100)])
        last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
        accuracies[drift] = last["window_accuracy"]
    # the last 300 events, +100 to +400 after the flip
    assert accuracies["adwin"] > 0.8 > 0.5 > accuracies["off"]
