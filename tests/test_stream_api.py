"""The stream learner's per-event API and its checks: one input check for every path
(JSON, lists, NumPy, tensors, named features), scaling, divergence, the prequential
metrics against independent computations, and bad configuration values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import f1_score, log_loss, recall_score

from stratify.errors import ConfigError, StratifyError
from stratify.stream import DivergenceError, Event, EventError, StreamConfig, StreamLearner
from stratify.stream.prequential import Prequential
from stratify.stream.scaling import RunningScaler


def config(**values) -> StreamConfig:
    return StreamConfig(**{"secure": False, "device": "cpu", "mlp_hidden": (8,), **values})


def learned(learner: StreamLearner) -> tuple:
    state = [np.array(p, copy=True) for p in learner.model.network.parameters()]
    return learner.stats.events, learner.buffers.size, state


def unchanged(after: tuple, before: tuple) -> bool:
    """Whether two :func:`learned` states are equal."""
    return after[:2] == before[:2] and all(map(np.array_equal, after[2], before[2]))


@pytest.mark.parametrize(
    "bad",
    [
        np.array([1.0, np.nan, 0.0]),
        np.array([1.0, np.inf, 0.0], dtype=np.float64),
        np.array([1e39, 0.0, 0.0]),  # beyond float32
        [1.0, float("nan"), 0.0],
        [1.0, 0.0, float("-inf")],
        torch.tensor([1.0, float("nan"), 0.0]),
        torch.tensor([float("inf"), 0.0, 0.0], dtype=torch.float64),
    ],
    ids=[
        "numpy-nan",
        "numpy-inf",
        "numpy-overflow",
        "list-nan",
        "list-inf",
        "tensor-nan",
        "tensor-inf",
    ],  # fmt: skip
)
def test_non_finite_features_are_refused_whatever_they_come_as(bad):
    learner = StreamLearner(config())
    learner.learn_one([0.0, 1.0, 2.0], 0)
    before = learned(learner)
    for call in (
        lambda: learner.ingest(Event("a", 1, bad, 2)),
        lambda: learner.learn_one(bad, 1),
        lambda: learner.predict_one(bad),
    ):
        with pytest.raises(EventError, match="NaN or infinity"):
            call()
    after = learned(learner)
    assert after[:2] == before[:2] and all(
        np.array_equal(a, b) for a, b in zip(after[2], before[2])
    )


@pytest.mark.parametrize(
    ("x", "y", "reason"),
    [
        ([1.0, 2.0, 3.0], None, "missing label"),
        ([1.0, 2.0, 3.0], 2.5, "label must be an integer, a string or a boolean"),
        ([1.0, 2.0, 3.0], [1], "label must be"),
        ([1.0, 2.0, 3.0], 2**64, "outside the 64-bit range"),
        ([1.0, 2.0, 3.0], "x" * 300, "at most 256"),
        ("abc", 1, "a list of numbers"),
        (None, 1, "a list of numbers"),
        ([1.0, "2", 3.0], 1, "must be numbers"),
        ([[1.0, 2.0], [3.0]], 1, "nested lists of equal length"),
        ([10**400, 0, 0], 1, "integer too large"),
        (np.array(["a", "b", "c"]), 1, "must be numbers"),
        (np.array([1 + 2j, 0, 0]), 1, "must be numbers"),
        (torch.tensor([1 + 2j, 0, 0]), 1, "real numbers"),
        ([], 1, "empty"),
        ([1.0, 2.0], 1, "2 features, the stream's samples have 3"),
        ({"a": 1.0}, 1, "features are a list, not named"),
        (Event("a", 1, [1.0, 2.0, 3.0]), 1, "give the event's features"),
    ],
)
def test_every_bad_value_is_an_event_error_that_changes_nothing(x, y, reason):
    learner = StreamLearner(config())
    learner.learn_one([0.0, 1.0, 2.0], 0)
    before = learned(learner)
    with pytest.raises(EventError, match=reason):
        learner.learn_one(x, y)
    with pytest.raises(StratifyError):
        learner.ingest(Event([1], 1, [1.0, 2.0, 3.0]))  # an unhashable client
    with pytest.raises(EventError, match="ingest takes an Event"):
        learner.ingest((1, 2, 3))  # type: ignore[arg-type]
    after = learned(learner)
    assert after[:2] == before[:2] and all(
        np.array_equal(a, b) for a, b in zip(after[2], before[2])
    )


@pytest.mark.parametrize(
    "x",
    [
        torch.empty(3, device="meta"),
        torch.tensor([1.0, 0.0, 2.0]).to_sparse(),
        torch.tensor([[1.0, 0.0, 2.0]]).to_sparse_csr(),
        torch.nested.nested_tensor([torch.ones(3)]),
    ],
    ids=["meta", "sparse-coo", "sparse-csr", "nested"],
)
def test_every_per_event_method_refuses_tensors_without_values_as_event_errors(x):
    learner = StreamLearner(config())
    learner.learn_one([0.0, 1.0, 2.0], 0)
    before = learned(learner)
    for call in (
        lambda: learner.ingest(Event("a", 1, x, 2)),
        lambda: learner.learn_one(x, 1),
        lambda: learner.predict_one(x),
        lambda: learner.predict_proba_one(x),
        lambda: learner.predict(x),
    ):
        with pytest.raises(EventError, match="must be a dense tensor of values"):
            call()
    after = learned(learner)
    assert after[:2] == before[:2] and all(
        np.array_equal(a, b) for a, b in zip(after[2], before[2])
    )


def test_the_per_event_api_learns_named_features_and_boolean_labels():
    learner = StreamLearner(config(lr=0.1))
    assert learner.predict_one({"size": 1.0, "ratio": 0.5}) is None  # nothing learned yet
    assert learner.predict_proba_one({"size": 1.0, "ratio": 0.5}) == {}
    rng = np.random.default_rng(0)
    for _ in range(300):
        label = bool(rng.integers(2))
        x = {"size": 1000.0 * (3.0 if label else 1.0) + rng.normal(0, 100), "ratio": rng.random()}
        learner.learn_one(x, label, client=int(rng.integers(3)))
    assert learner.classes and set(learner.classes) == {True, False}
    assert learner.predict_one({"ratio": 0.5, "size": 3100.0}) is True  # keys in any order
    assert learner.predict_one({"size": 900.0, "ratio": 0.5}) is False
    probabilities = learner.predict_proba_one({"size": 3000.0, "ratio": 0.1})
    assert set(probabilities) == {True, False} and sum(probabilities.values()) == pytest.approx(
        1.0, abs=1e-6
    )
    assert probabilities[True] > 0.5
    with pytest.raises(EventError, match="feature 'ratio' is missing .*--missing zero"):
        learner.learn_one({"size": 1.0}, True)
    with pytest.raises(EventError, match="feature 'colour' is not among the stream's features"):
        learner.learn_one({"size": 1.0, "ratio": 0.0, "colour": 2.0}, True)
    with pytest.raises(EventError, match="feature 'size' must be a number"):
        learner.learn_one({"size": "big", "ratio": 0.0}, True)
    with pytest.raises(
        EventError, match=r"label 1 \(int\) equals the stream's label True \(bool\)"
    ):
        learner.learn_one({"size": 1.0, "ratio": 0.0}, 1)  # never merged with True
    numbers = StreamLearner(config())
    numbers.learn_one([1.0], 1)
    with pytest.raises(EventError, match="label False .* equals the stream's label 0"):
        numbers.learn_one([2.0], 0) or numbers.learn_one([2.0], False)
    assert numbers.classes == [1, 0] and numbers.stats.events == 2
    zero = StreamLearner(config(missing="zero"))
    zero.learn_one({"a": 1.0, "b": 2.0}, "yes")
    zero.learn_one({"a": 5.0, "b": None}, "no")
    zero.learn_one({"b": 3.0}, "no")
    assert zero.buffers.x[zero.buffers.occupied].tolist() == [[1.0, 2.0], [5.0, 0.0], [0.0, 3.0]]


def test_named_features_come_and_go_as_river_takes_them_with_missing_zero():
    learner = StreamLearner(config(missing="zero", momentum=0.5))
    learner.learn_one({"a": 1.0, "b": 2.0}, "x")
    learner.learn_one({"a": 3.0, "b": 1.0}, "y")
    before = learner.predict_proba_one({"a": 1.0, "b": 2.0})
    # an unknown key in a prediction is left out (its weights would be 0)
    assert learner.predict_proba_one({"a": 1.0, "b": 2.0, "c": 9.0}) == before
    assert learner.features.input_shape == (2,)
    with pytest.warns(UserWarning, match=r"new feature\(s\) 'c': the input grows to 3"):
        learner.learn_one({"a": 1.0, "b": 2.0, "c": 7.0}, "x")
    assert learner.features.schema.names == ["a", "b", "c"] and learner.features.input_shape == (3,)
    assert learner.buffers.x[learner.buffers.occupied][:2].tolist() == [[1, 2, 0], [3, 1, 0]]
    with pytest.warns(UserWarning, match="feature 'b' is missing .* read as 0") as caught:
        learner.learn_one({"a": 1.0, "c": 0.0}, "y")
        learner.learn_one({"a": 2.0, "c": 0.0}, "y")  # warned once per feature
    assert len(caught) == 1
    rng = np.random.default_rng(0)
    for _ in range(200):  # only the new feature tells the classes apart
        label = int(rng.integers(2))
        learner.learn_one({"a": rng.normal(), "b": rng.normal(), "c": 3.0 * label}, "xy"[label])
    assert learner.predict_one({"a": 0.0, "b": 0.0, "c": 3.0}) == "y"
    assert learner.predict_one({"a": 0.0, "b": 0.0, "c": 0.0}) == "x"
    again = StreamLearner(config(missing="zero", momentum=0.5))
    again.load_state_dict(learner.state_dict())
    sample = {"a": 0.5, "b": -1.0, "c": 1.5}
    assert again.predict_proba_one(sample) == learner.predict_proba_one(sample)
    fixed = StreamLearner(config(missing="zero", model="mlp", input_shape=(2,)))
    fixed.learn_one({"a": 1.0, "b": 2.0}, "x")
    with pytest.raises(EventError, match="feature 'c' is new, and the model's input is fixed"):
        fixed.learn_one({"a": 1.0, "b": 2.0, "c": 7.0}, "x")


def test_running_standardisation_uses_earlier_events_for_predictions():
    scaler = RunningScaler((2,))
    data = torch.tensor([[1.0, 1000.0], [3.0, 3000.0], [5.0, 2000.0]], dtype=torch.float64)
    for row in data:
        scaler.update(row)
    mean = data.mean(dim=0)
    std = data.std(dim=0, unbiased=False)
    expected = ((torch.tensor([4.0, 2500.0], dtype=torch.float64) - mean) / std).float()
    torch.testing.assert_close(scaler.transform(torch.tensor([4.0, 2500.0])), expected)
    assert scaler.transform(torch.tensor([1e9, 0.0]))[0] == 10.0  # clipped
    learner = StreamLearner(config())
    learner.learn_one([1.0, 1000.0], 0)
    x = learner.features.row([3.0, 3000.0])
    # before the second event is learned, it is standardised with the first one only
    np.testing.assert_allclose(learner.features.array(x), [10.0, 10.0])


def test_a_diverging_step_stops_learning_or_is_undone():
    rng = np.random.default_rng(1)
    events = [
        Event(f"c{i % 3}", int(label), rng.normal(0, 1, 4) * [1e4, 1, 1, 1] + 3 * label, i + 1)
        for i, label in enumerate(rng.integers(0, 3, 200))
    ]
    stopping = StreamLearner(config(scale="none", lr=50.0, momentum=0.9))
    with pytest.raises(DivergenceError, match=r"diverged at event \d+ \(line \d+\).*--lr 50"):
        for event in events:
            stopping.ingest(event)
    with pytest.raises(DivergenceError):  # learning is over
        stopping.learn_one(events[0].x, 0)
    skipping = StreamLearner(config(scale="none", lr=50.0, momentum=0.9, on_diverge="skip"))
    learned_after_a_skip = 0
    for event in events:
        undone, steps = skipping.stats.undone, skipping.stats.steps
        before = skipping.model.save_weights() if skipping.started else []
        skipping.ingest(event)
        if skipping.stats.undone == undone and 0 < undone:  # kept, after an undone one
            after = skipping.model.save_weights()
            changed = any(not np.array_equal(a, b) for a, b in zip(before, after))
            learned_after_a_skip += changed and skipping.stats.steps > steps
    assert skipping.stats.undone > 0 and skipping.stats.events == 200
    # learning goes on after an undone update: nothing non-finite was kept (the momentum)
    assert learned_after_a_skip > 0
    assert all(np.isfinite(p).all() for p in skipping.model.network.parameters())
    assert skipping.snapshot()["train_loss"] is not None
    scaled = StreamLearner(config(lr=0.05))
    for event in events:
        scaled.ingest(event)
    assert scaled.stats.undone == 0 and math.isfinite(scaled.snapshot()["train_loss"])


def test_a_prequential_prediction_uses_only_the_events_before_it():
    """Each event is scored by the prediction the learner would have made before it
    came: its log-loss term is the one of predict() just before ingest()."""
    rng = np.random.default_rng(4)
    learner = StreamLearner(config(lr=0.05))
    for number in range(60):
        label = int(rng.integers(3))
        x = (rng.normal(0, 1, 4) + 2 * label) * [1000.0, 1.0, 0.01, 10.0]
        event = Event(f"c{number % 2}", label, x, number + 1)
        before = learner.predict(x)
        loss = learner.prequential.log_loss_sum
        learner.ingest(event)
        if before is not None and label in learner.classes[: len(before.probabilities)]:
            probability = before.probability(learner.class_rows.class_of[label])
            assert learner.prequential.log_loss_sum - loss == pytest.approx(
                -math.log(max(probability, 1e-15)), rel=1e-6, abs=1e-9
            )


def test_prequential_metrics_match_scikit_learn():
    rng = np.random.default_rng(3)
    labels = ["a", "b", "c"]
    truth = rng.integers(0, 3, 400)
    prequential = Prequential(window=50)
    predicted, probabilities, majority = [], [], []
    counts = np.zeros(3)
    for target in truth:
        guess = int(target) if rng.random() < 0.6 else int(rng.integers(3))
        p = rng.dirichlet([1, 1, 1])
        majority.append(int(np.argmax(counts)) == target if counts.any() else False)
        counts[target] += 1
        prequential.record(guess == target, int(target), guess, float(p[target]))
        predicted.append(guess)
        probabilities.append(p)
    metrics = prequential.metrics(labels)
    assert metrics["macro_f1"] == pytest.approx(f1_score(truth, predicted, average="macro"))
    recalls = recall_score(truth, predicted, average=None)
    assert metrics["class_recall"] == pytest.approx(dict(zip(labels, recalls)))
    picked = [p[t] for p, t in zip(probabilities, truth)]
    assert metrics["log_loss"] == pytest.approx(-np.mean(np.log(picked)))
    assert metrics["log_loss"] == pytest.approx(log_loss(truth, probabilities))
    assert metrics["majority_accuracy"] == pytest.approx(np.mean(majority))
    assert prequential.accuracy == pytest.approx(np.mean(np.array(predicted) == truth))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"capacity": 0}, "--capacity must be a positive integer"),
        ({"capacity": 10**10}, "would need at least"),
        ({"num_classes": 10**9}, "would need at least"),
        ({"mlp_hidden": (10**5, 10**5)}, "would need at least"),
        ({"lr": float("nan")}, "--lr must be a positive finite number"),
        ({"secure": "yes"}, "--secure must be true or false"),
        ({"model": "vgg"}, "unknown --model"),
        ({"norm": "sumbn"}, "unknown --norm"),
        ({"scale": "minmax"}, "unknown --scale"),
        ({"on_diverge": "retry"}, "unknown --on-diverge"),
        ({"source": 5}, "--source must name a file"),
        ({"out": ""}, "--out must name a file"),
        ({"window": True}, "--window must be a positive integer"),
        ({"local_epochs": 2}, "--local-epochs applies to --algorithm fedavg-periodic"),
        ({"algorithm": "fedprox"}, "unknown --algorithm"),
        ({"checkpoint_seconds": 0}, "--checkpoint-seconds must be a positive"),
        ({"model": "cnn", "mlp_hidden": (4,)}, "--mlp-hidden applies to --model mlp"),
    ],
)
def test_a_bad_config_value_is_one_config_error(values, message):
    with pytest.raises(ConfigError, match=message):
        config(**values)


def test_a_model_too_large_for_memory_is_refused_before_it_is_built():
    learner = StreamLearner(config(mlp_hidden=(10**6,)))  # fits one feature, not 10,000
    with pytest.raises(ConfigError, match=r"shape 10000 \(10,002,000,001 weights\) would need"):
        learner.learn_one([1.0] * 10_000, 0)
    assert not learner.started


def test_the_stream_modules_import_in_one_direction():
    """No import cycle inside stratify.stream, TYPE_CHECKING imports included, and no
    policy knows the learner (issue 28)."""
    import ast
    from pathlib import Path

    import stratify.stream

    folder = Path(stratify.stream.__file__).parent
    imports: dict[str, set[str]] = {}
    for path in folder.glob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "stratify.stream."
            ):
                names.add(node.module.rsplit(".", 1)[1])
            elif isinstance(node, ast.Import):
                names |= {
                    a.name.rsplit(".", 1)[1]
                    for a in node.names
                    if a.name.startswith("stratify.stream.")
                }
        imports[path.stem] = names - {"__init__"}
    assert "learner" not in imports["policies"] and "run" not in imports["learner"]

    def reaches(start: str, target: str, seen: set[str]) -> bool:
        for name in imports.get(start, ()):
            if name == target or (name not in seen and reaches(name, target, seen | {name})):
                return True
        return False

    cyclic = sorted(module for module in imports if reaches(module, module, set()))
    assert cyclic == []


@pytest.mark.parametrize(
    ("x", "reason"),
    [
        ({"a": "1.5", "b": 2.0}, "must be a number"),  # NumPy would read the string as 1.5
        ({"a": 10**400, "b": 2.0}, "too large"),
        ({"a": float("nan"), "b": 2.0}, "NaN"),
        ({"a": None, "b": 2.0}, "missing"),
        ({"a": 1.0, "c": 2.0}, "not among"),
    ],
)
def test_an_event_with_exactly_the_schemas_names_is_still_checked_value_by_value(x, reason):
    """The lookup-only reading of an event with the schema's names (FeatureSchema's
    plain_values) hands every value that is not a plain float or int to the full check."""
    from stratify.stream.events import FeatureSchema

    schema = FeatureSchema(["a", "b"])
    assert schema.vector({"b": 2, "a": np.float64(1.5)}).tolist() == [1.5, 2.0]
    with pytest.raises(EventError, match=reason):
        schema.vector(x)
    numbered = FeatureSchema([0, 1])
    assert numbered.vector({0: 1.0, 1: 2.0}).tolist() == [1.0, 2.0]
    with pytest.raises(EventError, match="strings or integers"):
        numbered.vector({True: 1.0, 0: 2.0})  # True would find the name 1
