"""The stream learner: test-then-train, bounded storage, max uses, new labels registered
and learned, refused events that change nothing, and the periodic FedAvg baseline."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from stratify.errors import ConfigError
from stratify.registry import PlainRegistry
from stratify.registry.base import STREAM_BLOCK
from stratify.registry.ckks import CKKSRegistry, same_result
from stratify.stream import Event, EventError, PeriodicFedAvg, StreamConfig, StreamLearner
from stratify.stream.buffers import ClientBuffers

FEATURES = 6


def cluster(label: int, rng: np.random.Generator) -> np.ndarray:
    """A sample of Gaussian cluster ``label`` (centre 3·e_(label mod 6)), easy to tell apart."""
    x = rng.normal(0.0, 0.5, size=FEATURES).astype(np.float32)
    x[label % FEATURES] += 3.0
    return x


def events(labels, clients, count: int, seed: int, first_line: int = 1) -> list[Event]:
    rng = np.random.default_rng(seed)
    chosen = rng.choice(labels, size=count)
    return [
        Event(
            client=clients[int(rng.integers(len(clients)))],
            label=int(label),
            x=cluster(int(label), rng),
            line=first_line + i,
        )
        for i, label in enumerate(chosen)
    ]


def config(**values) -> StreamConfig:
    values = {"secure": False, "device": "cpu", "lr": 0.05, "mlp_hidden": (16,), **values}
    return StreamConfig(**values)


def class_accuracy(learner: StreamLearner, label: int, seed: int = 99) -> float:
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(np.stack([cluster(label, rng) for _ in range(50)]))
    return learner.test_accuracy(x, [label] * 50)


@pytest.mark.parametrize("secure", [False, True])
def test_a_new_label_mid_stream_is_registered_and_learned(secure, monkeypatch):
    from stratify.stream import learner as learner_module

    monkeypatch.setattr(learner_module, "COUNT_ROUND_EVENTS", 50)
    learner = StreamLearner(config(secure=secure, protocol="packed"))
    for event in events([0, 1, 2], ["a", "b", "c"], 300, seed=0):
        learner.ingest(event)
    # keyed placeholders, each the row of its class: a block of STREAM_BLOCK rows
    # (docs/streaming.md, "Placeholders")
    assert learner.registry.result.num_placeholders == STREAM_BLOCK == learner.model.rows
    assert class_accuracy(learner, 3) == 0.0  # no row for it yet: always wrong
    # the counts were flushed, each one sample of one registration
    assert learner.registry.result.global_counts.sum() == len(learner.class_rows.registrations)
    if secure:  # the clients know each label's row (no comparison), the counts are public
        assert learner.registry.stats.decryptions == 0
        assert (
            len(learner.class_rows.registrations) > learner.model.rows
        )  # labels the federation knew too
    novel = events([3], ["a"], 1, seed=1, first_line=301)[0]
    assert learner.ingest(novel) is False  # predicted before it could be known
    result = learner.registry.result
    assert result.num_placeholders == STREAM_BLOCK == learner.model.rows  # still in its block
    assert learner.classes == [0, 1, 2, 3] or sorted(learner.classes) == [0, 1, 2, 3]
    placeholder = result.client_maps[learner.class_rows.client_of["a"]][3]
    # the keyed place of the fourth label, its row; the older ones did not move
    assert (
        placeholder == learner.registry.placeholder_of_index[3] == learner.class_rows.model_rows[3]
    )
    assert learner.class_rows.model_rows[:3] == [
        result.client_maps[0][label] for label in learner.classes[:3]
    ]
    for event in events([0, 1, 2, 3], ["a", "b"], 400, seed=2, first_line=302):
        learner.ingest(event)
    assert learner.registry.result.client_maps[learner.class_rows.client_of["b"]][3] == placeholder
    if secure:
        assert learner.registry.stats.decryptions == 0
    assert class_accuracy(learner, 3) > 0.8
    assert min(class_accuracy(learner, label) for label in (0, 1, 2)) > 0.8
    if secure:
        assert isinstance(learner.registry, CKKSRegistry)


def test_no_sample_is_trained_more_often_than_max_uses_and_buffers_stay_bounded(monkeypatch):
    trained: list[int] = []
    learner = StreamLearner(config(capacity=5, max_uses=2, steps_per_event=3))
    use = ClientBuffers.use

    def recording_use(buffers, slot, times=1):
        trained.append(int(buffers.sample_id[slot]))
        return use(buffers, slot, times)

    monkeypatch.setattr(ClientBuffers, "use", recording_use)
    arrived: dict[str, list[int]] = {}
    for event in events([0, 1, 2, 3], ["a", "b", "c"], 400, seed=3):
        learner.ingest(event)
        arrived.setdefault(event.client, []).append(event.line)
        for client, lines in arrived.items():
            held = learner.buffers.client_slots(learner.class_rows.client_of[client])
            assert len(held) <= 5
            assert set(learner.buffers.sample_id[held]) <= set(lines[-5:])
    uses = Counter(trained)
    assert max(uses.values()) == 2 and len(trained) == learner.stats.steps
    assert learner.buffers.evicted_used == sum(1 for count in uses.values() if count == 2)
    assert set(uses) <= {event.line for event in events([0, 1, 2, 3], ["a", "b", "c"], 400, 3)}


def test_each_event_is_predicted_before_it_is_learned():
    learner = StreamLearner(config())
    outcomes = []
    predict = learner._predict
    seen_parameters = []

    def spying_predict(x):
        seen_parameters.append(
            np.concatenate([p.ravel() for p in learner.model.network.parameters()])
        )
        return predict(x)

    learner._predict = spying_predict  # type: ignore[method-assign]
    stream = events([0, 1], ["a", "b"], 120, seed=4)
    for event in stream:
        before = (
            np.concatenate([p.ravel() for p in learner.model.network.parameters()])
            if learner.started
            else None
        )
        calls = len(seen_parameters)
        outcomes.append(learner.ingest(event))
        if len(seen_parameters) > calls and before is not None:
            assert np.array_equal(seen_parameters[-1], before)  # the model before this event
    assert learner.prequential.seen == 120 == learner.stats.events
    assert learner.prequential.accuracy == pytest.approx(np.mean(outcomes))
    window = learner.config.window
    assert learner.prequential.window_accuracy == pytest.approx(np.mean(outcomes[-window:]))
    assert outcomes[0] is False  # the first label of a stream cannot be known


def learner_state(learner: StreamLearner):
    return (
        learner.stats.events,
        learner.buffers.size,
        learner.registry.result,
        list(learner.clients),
        list(learner.classes),
        learner.prequential.seen,
        [np.array(p, copy=True) for p in learner.model.network.parameters()],
    )


def assert_unchanged(learner: StreamLearner, before) -> None:
    after = learner_state(learner)
    assert after[:6] == before[:6] and after[2] is before[2]
    assert all(np.array_equal(a, b) for a, b in zip(after[6], before[6]))


def test_refused_events_change_nothing_and_the_stream_goes_on():
    learner = StreamLearner(config(max_clients=2, num_classes=3))
    for event in events([0, 1], ["a", "b"], 50, seed=5):
        learner.ingest(event)
    before = learner_state(learner)
    rng = np.random.default_rng(0)
    refused = [
        (Event("a", 0, np.ones(FEATURES + 1, dtype=np.float32), 51), "7 features, the stream's"),
        (Event("a", 0, torch.tensor([1.0, float("nan"), 0, 0, 0, 0]), 52), "NaN or infinity"),
        (Event("a", 0, torch.tensor([float("inf")] + [0.0] * 5), 53), "NaN or infinity"),
        (Event("c", 0, cluster(0, rng), 54), "client 'c' is new and --max-clients 2"),
    ]
    learner.ingest(Event("b", 2, cluster(2, rng), 55))  # the third and last class
    before = learner_state(learner)
    refused.append(
        (Event("a", 5, cluster(5, rng), 56), "label 5 would be class 4 of --num-classes 3")
    )
    for event, reason in refused:
        with pytest.raises(EventError, match=reason):
            learner.ingest(event)
        assert_unchanged(learner, before)
    learner.ingest(Event("b", 1, cluster(1, rng), 57))
    assert learner.stats.events == before[0] + 1 and learner.model.rows == 3


def test_a_fixed_classifier_fills_its_rows_in_arrival_order():
    learner = StreamLearner(config(num_classes=4, input_shape=(2, 3)))
    for event in events([7, 3], ["a"], 20, seed=6):
        learner.ingest(event)
    assert learner.model.rows == 4 and set(learner.classes) == {3, 7}
    assert learner.features.input_shape == (2, 3) and learner.buffers.x.shape[1:] == (2, 3)
    with pytest.raises(EventError, match="5 features do not fit --input-shape 2,3"):
        StreamLearner(config(input_shape=(2, 3))).ingest(Event("a", 0, np.ones(5), 1))


def test_a_learner_continues_a_registry_with_stable_placeholders():
    registry = PlainRegistry(seed=3)
    first = registry.register([{0: 5, 1: 5}, {1: 4, 2: 2}])
    learner = StreamLearner(config(), registry=registry, clients=["p", "q"], classes=[0, 1, 2])
    for event in events([0, 1, 2, 4], ["q", "r"], 60, seed=7):
        learner.ingest(event)
    result = learner.registry.result
    assert result.client_maps[1][1] == first.client_maps[1][1]
    assert result.client_maps[1].get(0) == first.client_maps[0][0]
    assert result.client_maps[1][4] == 3 and learner.classes[:3] == [0, 1, 2]
    with pytest.raises(ConfigError, match="holds 3 clients but 1 were named"):
        StreamLearner(config(), registry=registry, clients=["p"])


def test_the_periodic_fedavg_baseline_retrains_on_the_same_buffers():
    baseline = PeriodicFedAvg(every=50, local_epochs=2, local_batch_size=8, lr=0.05)
    learner = StreamLearner(config(capacity=20), policy=baseline)
    stream = events([0, 1, 2], ["a", "b", "c"], 300, seed=8)
    for event in stream[:49]:
        learner.ingest(event)
    assert learner.stats.steps == 0
    for event in stream[49:]:
        learner.ingest(event)
    assert baseline.rounds == 6
    assert baseline.transfers == 2 * 3 * 6  # download and upload per client and round
    assert learner.buffers.size == 60 and learner.stats.steps > 0
    assert min(class_accuracy(learner, label) for label in (0, 1, 2)) > 0.8
    with pytest.raises(ConfigError, match="--max-uses applies to single-sample updates"):
        StreamLearner(config(max_uses=3), policy=PeriodicFedAvg()).ingest(stream[0])


def test_a_parsed_event_has_its_features_checked_once_and_a_hand_made_one_in_the_learner(
    monkeypatch,
):
    from stratify.stream import events
    from stratify.stream import features as features_module

    calls = []
    original = events.check_features

    def counting(x):
        calls.append(x)
        return original(x)

    monkeypatch.setattr(events, "check_features", counting)
    monkeypatch.setattr(features_module, "check_features", counting)
    learner = StreamLearner(config())
    parsed = events.parse_line(b'{"client": "a", "label": 1, "x": [1, 2, 3]}', 1, None)
    assert parsed.checked
    learner.ingest(parsed)
    assert len(calls) == 1  # in parse_line only
    learner.ingest(Event("a", 0, [1.0, 2.0, 4.0], 2))
    assert len(calls) == 2  # a hand-made event is checked by the learner
    with pytest.raises(EventError, match="NaN"):
        learner.ingest(Event("a", 0, [1.0, float("nan"), 4.0], 3))


def test_a_known_label_new_to_a_client_is_registered_with_its_others_in_one_round():
    """A label the federation knows waits at a client until REGISTRATION_ARRIVALS more
    events came there (its samples buffered but not scheduled), then all such labels of
    the client are registered in one add_labels call; a label new to the federation, or
    of a class the clients hold little of, is registered at once."""
    from stratify.stream.class_rows import REGISTRATION_ARRIVALS

    learner = StreamLearner(config())
    calls: list[tuple[int, list[int]]] = []
    add_labels = learner.registry.add_labels

    def recording(client, labels, counts, **options):
        calls.append((client, list(labels)))
        return add_labels(client, labels, counts, **options)

    learner.registry.add_labels = recording  # type: ignore[method-assign]
    rng = np.random.default_rng(0)
    for line, label in enumerate([0, 1, 2], start=1):  # new to the federation: at once
        learner.ingest(Event("a", label, cluster(label, rng), line))
    rows = learner.class_rows.model_rows  # keyed, distinct: each label's placeholder is its row
    assert learner.registry.result.client_maps == [{0: rows[0], 1: rows[1], 2: rows[2]}]
    assert len(set(rows)) == 3
    learner.ingest(Event("b", 1, cluster(1, rng), 4))
    learner.ingest(Event("b", 2, cluster(2, rng), 5))
    assert len(learner.registry.result.client_maps) == 1 and learner.class_rows.unregistered == {
        1: [1, 2]
    }
    assert learner.buffers.counts[1].sum() == 0  # buffered, not schedulable
    for line in range(6, 6 + REGISTRATION_ARRIVALS - 2):
        learner.ingest(Event("b", 1, cluster(1, rng), line))
        assert learner.class_rows.unregistered == (
            {} if line == 3 + REGISTRATION_ARRIVALS else {1: [1, 2]}
        )
    assert calls[-1] == (1, [1, 2]) and learner.class_rows.unregistered == {}
    assert learner.registry.result.client_maps[1] == {1: rows[1], 2: rows[2]}
    assert learner.buffers.counts[1].sum() == learner.buffers.size - 3  # all of b's now
    # class 0 is scarce (2 of 23 buffered samples): b registers it at once, so that a
    # class that came late has its samples trained as soon as they arrive
    learner.ingest(Event("b", 0, cluster(0, rng), 100))
    assert learner.registry.result.client_maps[1] == {1: rows[1], 2: rows[2], 0: rows[0]}
    assert learner.class_rows.unregistered == {} and calls[-1] == (1, [0])
    # a plentiful class waits at c; a label new to the federation makes c join at once
    learner.ingest(Event("c", 1, cluster(1, rng), 101))
    assert (
        learner.class_rows.unregistered == {2: [1]}
        and len(learner.registry.result.client_maps) == 2
    )
    learner.ingest(Event("c", 3, cluster(3, rng), 102))
    assert learner.registry.result.client_maps[2] == {
        3: learner.class_rows.model_rows[3]
    } and learner.class_rows.unregistered == {2: [1]}
    # the state keeps what waits, and a restored learner goes on the same
    again = StreamLearner(config())
    again.load_state_dict(learner.state_dict())
    assert (
        again.class_rows.unregistered == learner.class_rows.unregistered
        and again.class_rows.waiting == learner.class_rows.waiting
    )
    for event in events([0, 1, 2, 3], ["a", "b", "c"], 60, seed=4, first_line=200):
        assert learner.ingest(event) == again.ingest(event)
    assert learner.class_rows.registrations == again.class_rows.registrations
    for mine, theirs in zip(learner.model.network.parameters(), again.model.network.parameters()):
        assert np.array_equal(mine, theirs)


def test_a_secure_stream_restores_its_registry_without_a_decryption():
    """The checkpoint replays the registrations by their classifier rows, counts public."""
    learner = StreamLearner(config(secure=True, protocol="packed"))
    for event in events([0, 1, 2, 3], ["a", "b", "c"], 120, seed=5):
        learner.ingest(event)
    again = StreamLearner(config(secure=True, protocol="packed"))
    again.load_state_dict(learner.state_dict())
    assert again.registry.stats.decryptions == 0
    learner.registry.flush_counts(public=True)
    assert same_result(again.registry.result, learner.registry.result)
    assert again.registry.result.global_counts.sum() == len(learner.class_rows.registrations) > 4
    for event in events([0, 1, 2, 3], ["a", "b", "c", "d"], 40, seed=6, first_line=121):
        assert learner.ingest(event) == again.ingest(event)
    assert again.registry.result.client_maps == learner.registry.result.client_maps


@pytest.mark.parametrize("new_class", ["auto", "imprint", "random"])
def test_a_new_class_is_predicted_from_its_second_example_when_imprinted(new_class):
    """The first example of a class imprints its classifier row (docs/architecture.md,
    "Streaming"): the next examples of the class are predicted right before any step was
    trained on them; a random row (the earlier behaviour) predicts them as known classes."""
    learner = StreamLearner(config(new_class=new_class))
    for event in events([0, 1, 2], ["a", "b", "c"], 300, seed=0):
        learner.ingest(event)
    known_rows = learner.class_rows.model_rows[:3]  # keyed rows (docs/streaming.md, "Placeholders")
    known_norm = float(np.linalg.norm(learner.model.network.weights[-1][known_rows], axis=1).mean())
    learner.learn_one(cluster(3, np.random.default_rng(1)), 3, client="a")
    rng = np.random.default_rng(2)
    hits = sum(learner.predict_one(cluster(3, rng)) == 3 for _ in range(20))
    if new_class == "random":
        assert hits <= 2
        return
    assert hits >= 18
    # scaled like the known rows (one step on it since moves it a little)
    row = learner.model.network.weights[-1][learner.class_rows.model_rows[3]]
    assert float(np.linalg.norm(row)) == pytest.approx(known_norm, rel=0.1)
    assert min(class_accuracy(learner, label) for label in (0, 1, 2)) > 0.8


@pytest.mark.parametrize(("new_class", "imprints"), [("auto", False), ("imprint", True)])
def test_auto_imprints_an_mlp_only(new_class, imprints):
    cnn = {"model": "cnn", "mlp_hidden": None, "input_shape": (1, 8, 8)}
    learner = StreamLearner(config(**cnn, new_class=new_class))
    learner.learn_one(np.zeros(64, dtype=np.float32), 0)
    assert learner.imprints is imprints


def test_imprinting_leaves_the_first_class_and_a_dead_embedding_alone():
    from torch import nn

    from stratify.stream.classifier import imprint_row

    head = nn.Linear(4, 3)
    before = head.weight.detach().clone()
    assert not imprint_row(head, 0, torch.ones(4))
    assert not imprint_row(head, 2, torch.zeros(4))
    assert torch.equal(head.weight, before)
    assert imprint_row(head, 2, torch.tensor([0.0, 3.0, 0.0, 4.0]))
    scale = float(before[:2].norm(dim=1).mean()) / 5.0
    torch.testing.assert_close(head.weight[2], torch.tensor([0.0, 3.0, 0.0, 4.0]) * scale)
    assert float(head.bias[2].detach()) == pytest.approx(float(head.bias[:2].detach().mean()))
    assert torch.equal(head.weight[:2], before[:2])


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_the_numpy_path_learns_what_the_torch_path_learns(monkeypatch, momentum):
    """An MLP on CPU predicts and steps in NumPy (stratify.stream.mlp, .step); the same
    learner given a torch MLP with the same initial weights and that path off (autograd
    and torch ops) gives the same predictions and weights over a few hundred events,
    within float tolerance."""
    from stratify.nn.models import MLP
    from stratify.stream import step as step_module
    from stratify.stream.mlp import NumpyMLP

    stream = events([0, 1, 2, 3], ["a", "b", "c"], 300, seed=5)
    # at lr 0.05 with momentum 0.9 (a step of 0.5 in effect) the imprinted rows make this
    # tiny MLP's trajectory chaotic: the paths' 3e-8 float difference grows steadily to
    # 1e-3 by event 100 and a prediction flips; at 0.02 it stays below 1e-6
    lr = 0.05 if momentum == 0 else 0.02
    # a declared capacity of 8 rows, keyed: the two paths draw a grown row's initial
    # weights differently, which imprinting hid while every grown row was a class's
    numpy_learner = StreamLearner(
        config(momentum=momentum, mlp_hidden=(32, 16), lr=lr, num_classes=8)
    )
    outcomes = [numpy_learner.ingest(event) for event in stream]
    assert isinstance(numpy_learner.model.network, NumpyMLP)
    assert numpy_learner.policy.step.arrays is not None
    monkeypatch.setattr(step_module.MLPArrays, "of", classmethod(lambda cls, model: None))
    # the same 8 initial rows; each new class's row is imprinted
    initial = NumpyMLP.build(FEATURES, 8, (32, 16), seed=0)
    model = MLP((FEATURES,), 8, hidden=(32, 16))
    model.load_state_dict({name: torch.from_numpy(v) for name, v in initial.state_dict().items()})
    torch_learner = StreamLearner(
        config(momentum=momentum, mlp_hidden=(32, 16), lr=lr, num_classes=8), model=model
    )
    assert outcomes == [torch_learner.ingest(event) for event in stream]
    assert torch_learner.model.arrays is None and torch_learner.policy.step.arrays is None
    assert torch_learner.stats.steps == numpy_learner.stats.steps == 300
    for mine, theirs in zip(
        numpy_learner.model.network.parameters(), torch_learner.model.network.parameters()
    ):
        np.testing.assert_allclose(mine, theirs.detach().numpy(), rtol=1e-4, atol=1e-5)
    rng = np.random.default_rng(6)
    for _ in range(20):
        x = cluster(int(rng.integers(4)), rng)
        mine, theirs = numpy_learner.predict_proba_one(x), torch_learner.predict_proba_one(x)
        assert mine.keys() == theirs.keys()
        for label in mine:
            assert mine[label] == pytest.approx(theirs[label], abs=1e-5)


def test_the_numpy_mlp_is_the_default_model_and_torch_serves_the_rest():
    """Defaults (an MLP, --device auto) train the NumPy MLP on CPU; a policy that trains
    torch models (the periodic FedAvg baseline), another model or a given model gets a
    torch model."""
    from torch import nn

    from stratify.nn.models import MLP
    from stratify.stream.mlp import NumpyMLP

    sample = cluster(0, np.random.default_rng(0))
    default = StreamLearner(StreamConfig(secure=False, mlp_hidden=(8,)))
    default.learn_one(sample, 0)
    assert default.device == "cpu" and isinstance(default.model.network, NumpyMLP)
    baseline = StreamLearner(config(algorithm="fedavg-periodic"))
    baseline.learn_one(sample, 0)
    assert type(baseline.model.network) is MLP and not baseline.policy.numpy_models
    cnn = StreamLearner(config(model="cnn", mlp_hidden=None, input_shape=(1, 8, 8)))
    cnn.learn_one(np.zeros(64, dtype=np.float32), 0)
    assert isinstance(cnn.model.network, nn.Module) and cnn.model.arrays is None
    given = StreamLearner(config(), model=MLP((FEATURES,), 1, hidden=(16,)))
    given.learn_one(sample, 0)
    assert (
        type(given.model.network) is MLP and given.model.arrays is not None
    )  # NumPy views of its weights
