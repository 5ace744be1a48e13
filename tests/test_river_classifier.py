"""The stream learner under river's tooling (docs/streaming.md, "river"):
``progressive_val_score``, pipelines, ``clone()``, integer feature names, river's
missing/extra-key habits, uncapped clients, pickling with the secure registry, and the
process's BLAS threads left as they were."""

from __future__ import annotations

import itertools
import json
import pickle
from pathlib import Path

import pytest

pytest.importorskip("river")

from river import datasets, evaluate, metrics, preprocessing  # noqa: E402
from river.datasets import synth  # noqa: E402
from threadpoolctl import threadpool_info, threadpool_limits  # noqa: E402

from stratify.stream import EventError, StreamConfig  # noqa: E402
from stratify.stream.river import StreamClassifier  # noqa: E402
from stratify.stream.run import StreamRun  # noqa: E402


def correct_count(metric: metrics.Accuracy) -> int:
    return round(metric.get() * metric.cm.n_samples)


def test_progressive_val_score_matches_the_command_line(tmp_path: Path) -> None:
    # the same stream, one client, plain registry, seed 0: the command line's run and
    # river's progressive validation predict every event alike
    source = tmp_path / "phishing.jsonl"
    with source.open("w") as handle:
        for x, y in datasets.Phishing():
            handle.write(json.dumps({"client": 0, "label": y, "x": x}) + "\n")
    config = StreamConfig(source=str(source), out=str(tmp_path / "run"), secure=False)
    summary = StreamRun(config).run()

    metric = evaluate.progressive_val_score(
        datasets.Phishing(), StreamClassifier(secure=False), metrics.Accuracy()
    )
    assert summary["events"] == 1250
    # river leaves out the first event, predicted before any label (None); the command
    # line counts it wrong: the same 1,108 right predictions
    assert metric.cm.n_samples == 1249
    assert correct_count(metric) == round(summary["prequential_accuracy"] * 1250) == 1108


def test_pipeline_clone_and_metrics() -> None:
    model = preprocessing.StandardScaler() | StreamClassifier(secure=False, seed=3, lr=0.02)
    first = evaluate.progressive_val_score(datasets.Phishing(), model, metrics.Accuracy())
    fresh = model.clone()
    learner = fresh["StreamClassifier"]
    assert learner.learner.stats.events == 0
    assert learner.learner.config.seed == 3 and learner.learner.config.lr == 0.02
    again = evaluate.progressive_val_score(datasets.Phishing(), fresh, metrics.Accuracy())
    assert again.get() == first.get() > 0.8  # the majority class so far is 55%
    scores = evaluate.progressive_val_score(
        datasets.Phishing(), StreamClassifier(secure=False), metrics.LogLoss()
    )
    assert 0 < scores.get() < 0.5


def test_sea_with_integer_feature_names() -> None:
    model = StreamClassifier(secure=False)
    stream = synth.SEA(seed=0)
    for x, y in stream.take(1000):
        model.learn_one(x, y)
    assert list(x) == [0, 1, 2]
    held_out = list(itertools.islice(stream, 500))
    right = sum(model.predict_one(x) == y for x, y in held_out)
    assert right / 500 > 0.85  # SEA's concept is linear; its majority class is about 60%
    assert set(model.predict_proba_one(held_out[0][0])) == {False, True}


def test_a_bool_is_not_a_feature_name() -> None:
    model = StreamClassifier(secure=False)
    with pytest.raises(EventError, match="strings or integers"):
        model.learn_one({True: 1.0}, "a")


def test_missing_and_new_keys_as_river_reads_them_or_strict() -> None:
    model = StreamClassifier(secure=False)
    model.learn_one({"a": 1.0, "b": 2.0}, "x")
    with pytest.warns(UserWarning):
        model.learn_one({"a": 1.0}, "y")  # b is 0
    with pytest.warns(UserWarning, match="grows to 3"):
        model.learn_one({"a": 1.0, "b": 0.5, "c": 3.0}, "x")
    assert model.learner.features.schema.names == ["a", "b", "c"]
    assert set(model.predict_proba_one({"a": 1.0, "d": 9.0})) == {"x", "y"}

    strict = StreamClassifier(secure=False, strict=True)
    strict.learn_one({"a": 1.0, "b": 2.0}, "x")
    with pytest.raises(EventError, match="missing"):
        strict.learn_one({"a": 1.0}, "y")
    with pytest.raises(EventError, match="not among"):
        strict.learn_one({"a": 1.0, "b": 0.5, "c": 3.0}, "x")


def test_clients_are_not_capped_unless_asked() -> None:
    model = StreamClassifier(secure=False)
    for client in range(150):
        model.learn_one({"a": float(client)}, client % 2, client=f"site-{client}")
    assert len(model.learner.clients) == 150
    capped = StreamClassifier(secure=False, max_clients=2)
    capped.learn_one({"a": 0.0}, 0, client=0)
    capped.learn_one({"a": 1.0}, 1, client=1)
    with pytest.raises(EventError, match="2 clients"):
        capped.learn_one({"a": 2.0}, 1, client=2)


def test_a_secure_learner_pickles_and_goes_on_identically() -> None:
    events = list(datasets.ImageSegments())
    model = StreamClassifier()  # the CKKS registry, its secrets drawn from the OS
    for number, (x, y) in enumerate(events[:400]):
        model.learn_one(x, y, client=number % 3)
    blob = pickle.dumps(model)
    back = pickle.loads(blob)
    # the pickle holds no registry: the copy has its own keys, and the same placement
    assert back.learner.registry is not model.learner.registry
    assert back.learner.registry.secrets.hash_key != model.learner.registry.secrets.hash_key
    assert back.learner.class_rows.model_rows == model.learner.class_rows.model_rows
    for number, (x, y) in enumerate(events[400:800]):
        assert back.predict_proba_one(x) == model.predict_proba_one(x)
        client = number % 5  # two clients new to both
        model.learn_one(x, y, client=client)
        back.learn_one(x, y, client=client)
    assert back.learner.snapshot()["steps"] == model.learner.snapshot()["steps"]


def blas_threads() -> list[int]:
    return [
        library["num_threads"] for library in threadpool_info() if library["user_api"] == "blas"
    ]


def test_the_process_blas_threads_are_left_as_they_were() -> None:
    with threadpool_limits(2, user_api="blas"):
        before = blas_threads()
        assert set(before) == {2}
        model = StreamClassifier(secure=False)
        inside: list[list[int]] = []
        learn = model.learner.train

        def recording_train(line: int) -> None:
            inside.append(blas_threads())
            learn(line)

        model.learner.train = recording_train  # type: ignore[method-assign]
        for x, y in itertools.islice(datasets.Phishing(), 20):
            model.learn_one(x, y)
            model.predict_one(x)
        assert inside and all(set(threads) == {1} for threads in inside)
        assert blas_threads() == before


#: river's estimator checks this classifier does not pass: the first event's key order
#: fixes the input layout, as on the command line (docs/streaming.md, "river")
KNOWN_FAILING_CHECKS = {"check_shuffle_features_no_impact"}


def test_rivers_own_estimator_checks_pass() -> None:
    from river import checks

    model = StreamClassifier(secure=False)
    ran = set()
    for check in checks.yield_checks(model):
        name = getattr(check, "__name__", None) or check.func.__name__
        if name in KNOWN_FAILING_CHECKS:
            continue
        check(model.clone())  # an AssertionError names the check in its traceback
        ran.add(name)
    assert {"check_pickling", "check_clone_is_idempotent", "check_predict_proba_one"} <= ran
    assert len(ran) >= 20
