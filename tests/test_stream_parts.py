"""The stream's parts on hand-made cases: bounded buffers, the server's schedule, the
growing classifier, prequential accuracy and event parsing."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from torch import nn

from stratify.nn.catalog import mlp_weight_count
from stratify.nn.models import build_model
from stratify.stream.buffers import ClientBuffers
from stratify.stream.classifier import widen_classifier, widen_head
from stratify.stream.events import EventError, load_test_set, parse_line
from stratify.stream.mlp import NumpyMLP
from stratify.stream.prequential import Prequential
from stratify.stream.schedule import StreamSchedule, select_client
from stratify.stream.step import SingleSampleStep

CPU = torch.device("cpu")


def recount(buffers: ClientBuffers) -> np.ndarray:
    """The (clients, placeholders) counts recomputed from the slots themselves."""
    counts = np.zeros_like(buffers.counts)
    for slot in np.flatnonzero(buffers.occupied):
        counts[slot // buffers.capacity, buffers.placeholder[slot]] += 1
    return counts


# -- buffers -------------------------------------------------------------------------------


def test_buffers_never_exceed_capacity_and_evict_the_oldest_first():
    rng = np.random.default_rng(0)
    buffers = ClientBuffers(capacity=3, sample_shape=(2,), device=CPU, max_uses=4)
    for _ in range(4):
        buffers.add_client()
    buffers.add_placeholder(2)
    arrived: list[list[int]] = [[] for _ in range(4)]  # sample ids per client, in order
    for sample in range(300):
        client = int(rng.integers(4))
        slot = buffers.insert(
            client, torch.full((2,), float(sample)), 0, int(rng.integers(3)), sample
        )
        arrived[client].append(sample)
        if rng.random() < 0.5:  # train on some buffered sample now and then
            held = buffers.client_slots(int(rng.integers(4)))
            if len(held):
                buffers.use(int(rng.choice(held)))
        for k in range(4):
            held = buffers.client_slots(k)
            assert len(held) <= 3
            # what a client holds is always among its 3 most recent arrivals, in order
            ids = buffers.sample_id[held].tolist()
            assert ids == [i for i in arrived[k][-3:] if i in ids]
        np.testing.assert_array_equal(buffers.counts, recount(buffers))
        assert buffers.x[slot].tolist() == [float(sample)] * 2
    assert buffers.size <= 12 and buffers.evicted_full > 0 and buffers.evicted_used > 0
    assert (buffers.uses[buffers.occupied] < 4).all()


def test_a_sample_leaves_after_its_last_allowed_use_and_its_storage_is_zeroed():
    buffers = ClientBuffers(capacity=2, sample_shape=(3,), device=CPU, max_uses=2)
    buffers.add_client()
    buffers.add_placeholder(0)
    slot = buffers.insert(0, torch.ones(3), target=4, placeholder=0, sample_id=7)
    assert buffers.use(slot) is False and buffers.counts[0, 0] == 1
    assert buffers.use(slot) is True
    assert buffers.counts[0, 0] == 0 and not buffers.occupied[slot]
    assert buffers.x[slot].tolist() == [0.0, 0.0, 0.0]
    assert buffers.evicted_used == 1 and not buffers.available().any()


def test_pick_takes_the_least_used_sample_then_the_oldest():
    buffers = ClientBuffers(capacity=4, sample_shape=(1,), device=CPU)
    buffers.add_client()
    buffers.add_placeholder(1)
    slots = [buffers.insert(0, torch.zeros(1), 0, p, i) for i, p in enumerate([1, 0, 1, 1])]
    assert buffers.pick(0, 1) == slots[0]  # all unused: the oldest of placeholder 1
    buffers.use(slots[0])
    assert buffers.pick(0, 1) == slots[2]
    buffers.use(slots[2])
    buffers.use(slots[3])
    assert buffers.pick(0, 1) == slots[0]  # all used once: the oldest again
    assert buffers.pick(0, 0) == slots[1]


def test_buffers_grow_with_clients_and_survive_a_state_round_trip():
    buffers = ClientBuffers(capacity=2, sample_shape=(2, 2), device=CPU, max_uses=3)
    for client in range(5):
        assert buffers.add_client() == client
        buffers.add_placeholder(client)
        buffers.insert(client, torch.full((4,), float(client)), client, client, 10 + client)
    restored = ClientBuffers(capacity=2, sample_shape=(2, 2), device=CPU, max_uses=3)
    restored.load_state_dict(buffers.state_dict())
    assert torch.equal(restored.x, buffers.x[: 5 * 2])
    for name in ("occupied", "placeholder", "uses", "arrival", "sample_id", "counts"):
        np.testing.assert_array_equal(getattr(restored, name), getattr(buffers, name)[: 5 * 2])
    assert restored.arrivals == 5 and restored.add_client() == 5
    with pytest.raises(ValueError, match="do not fit"):
        ClientBuffers(capacity=3, sample_shape=(2, 2), device=CPU).load_state_dict(
            buffers.state_dict()
        )


# -- the server's schedule ---------------------------------------------------------------


def test_each_cycle_visits_every_available_placeholder_once():
    schedule = StreamSchedule(chunk=1, selection="uniform", rng=np.random.default_rng(3))
    counts = np.array([[2, 0, 1, 0], [0, 3, 0, 0]])  # placeholder 3: nobody holds it
    seen = [schedule.next_step(counts) for _ in range(9)]
    for cycle in range(3):
        placeholders = sorted(p for p, _ in seen[3 * cycle : 3 * cycle + 3])
        assert placeholders == [0, 1, 2]
    assert all(counts[client, placeholder] > 0 for placeholder, client in seen)
    assert schedule.skipped == 0


def test_an_entry_whose_samples_left_is_skipped_and_a_new_placeholder_joins_next_cycle():
    schedule = StreamSchedule(chunk=1, selection="uniform", rng=np.random.default_rng(0))
    counts = np.array([[1, 1]])
    first = schedule.next_step(counts)[0]
    other = 1 - first
    counts[0, other] = 0  # the other placeholder's samples were evicted
    counts = np.pad(counts, ((0, 0), (0, 1)))
    counts[0, 2] = 1  # a third placeholder became available mid-cycle
    assert schedule.next_step(counts)[0] in (first, 2)
    assert schedule.skipped == 1
    assert {schedule.next_step(counts)[0] for _ in range(4)} == {first, 2}
    assert schedule.next_step(np.zeros((1, 3), dtype=int)) == (-1, -1)


def test_within_a_chunk_the_model_stays_with_a_client_holding_the_label():
    counts = np.array([[1, 1, 1], [1, 1, 1], [1, 1, 1]])
    schedule = StreamSchedule(chunk=3, selection="uniform", rng=np.random.default_rng(1))
    clients = [schedule.next_step(counts)[1] for _ in range(30)]
    for chunk in range(10):  # every client holds every label: one client per chunk
        assert len(set(clients[3 * chunk : 3 * chunk + 3])) == 1
    changes = sum(a != b for a, b in zip(clients, clients[1:]))
    assert schedule.transfers == 1 + changes
    hopping = StreamSchedule(chunk=1, selection="uniform", rng=np.random.default_rng(1))
    hops = [hopping.next_step(counts)[1] for _ in range(30)]
    assert len(set(hops)) == 3 and hopping.transfers == 1 + sum(
        a != b for a, b in zip(hops, hops[1:])
    )


def test_selection_picks_only_holders_and_weighted_follows_the_counts():
    rng = np.random.default_rng(0)
    holdings = np.array([0, 3, 0, 1])
    uniform = [select_client(holdings, "uniform", rng) for _ in range(2000)]
    weighted = [select_client(holdings, "weighted", rng) for _ in range(4000)]
    assert set(uniform) == set(weighted) == {1, 3}
    assert abs(np.mean(np.array(uniform) == 1) - 0.5) < 0.05
    assert abs(np.mean(np.array(weighted) == 1) - 0.75) < 0.03


def test_schedule_state_round_trip_continues_identically():
    counts = np.array([[2, 1, 0, 4], [1, 0, 3, 1]])
    original = StreamSchedule(chunk=2, selection="weighted", rng=np.random.default_rng(9))
    for _ in range(7):
        original.next_step(counts)
    copy = StreamSchedule(chunk=2, selection="weighted", rng=np.random.default_rng(0))
    copy.load_state_dict(original.state_dict())
    assert [copy.next_step(counts) for _ in range(20)] == [
        original.next_step(counts) for _ in range(20)
    ]
    assert copy.transfers == original.transfers


# -- the growing classifier --------------------------------------------------------------


def test_a_wider_head_keeps_the_known_classes_logits_and_draws_new_rows_by_seed():
    torch.manual_seed(0)
    head = nn.Linear(6, 3)
    x = torch.randn(5, 6)
    wider = widen_head(head, 5, seed=11)
    assert wider.out_features == 5
    assert torch.equal(wider.weight[:3], head.weight) and torch.equal(wider.bias[:3], head.bias)
    # the same rows give the same logits (up to the matmul's blocking at another width)
    torch.testing.assert_close(wider(x)[:, :3], head(x))
    again = widen_head(head, 5, seed=11)
    assert torch.equal(again.weight, wider.weight) and torch.equal(again.bias, wider.bias)
    assert not torch.equal(widen_head(head, 5, seed=12).weight[3:], wider.weight[3:])
    assert wider.weight[3:].abs().max() <= 1 / 6**0.5  # nn.Linear's own bound
    with pytest.raises(ValueError, match="cannot shrink"):
        widen_head(head, 2, seed=0)


def test_the_step_follows_the_grown_classifier_with_its_momentum():
    torch.manual_seed(0)
    model = build_model("mlp", (4,), 2, hidden=(8,))
    step = SingleSampleStep(model, lr=0.1, momentum=0.9)
    step.step(torch.randn(1, 4), 1)
    assert step.velocity is not None
    old_momentum = step.velocity[-2].clone()  # the head's weight
    hidden_momentum = step.velocity[0]
    old_head = model.head
    replaced = widen_classifier(model, 4, seed=0)
    step.follow(model, replaced)
    assert model.head is not old_head and model.head.out_features == 4
    assert [id(p) for p in step.parameters] == [id(p) for p in model.parameters()]
    momentum = step.velocity[-2]
    assert torch.equal(momentum[:2], old_momentum) and momentum[2:].abs().sum() == 0
    assert step.velocity[0] is hidden_momentum
    # and it steps the new parameters, a new row's target included
    before = model.head.weight.detach().clone()
    step.step(torch.randn(1, 4), 3)
    assert not torch.equal(model.head.weight, before)


@pytest.mark.parametrize("model_name", ["mlp", "cnn"])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_the_lean_step_is_torch_sgd(model_name, momentum):
    """The stream's step (NumPy for the MLP, autograd for the rest) computes what
    torch.optim.SGD computes, loss and weights, step after step."""
    shape = (1, 8, 8) if model_name == "cnn" else (6,)
    torch.manual_seed(0)
    model = build_model(model_name, shape, 3)
    reference = build_model(model_name, shape, 3)
    reference.load_state_dict(model.state_dict())
    step = SingleSampleStep(model, lr=0.05, momentum=momentum)
    assert (step.arrays is not None) == (model_name == "mlp")
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=momentum)
    generator = torch.Generator().manual_seed(1)
    for number in range(20):
        x = torch.randn(1, *shape, generator=generator)
        loss = step.step(x, number % 3)
        optimizer.zero_grad()
        expected = nn.functional.cross_entropy(reference(x), torch.tensor([number % 3]))
        expected.backward()
        optimizer.step()
        assert float(loss) == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
    for mine, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)
    # a checkpoint of either reads into the other
    again = SingleSampleStep(reference, lr=0.05, momentum=momentum)
    again.load_state_dict(optimizer.state_dict())
    if momentum:
        assert step.velocity is not None and again.velocity is not None
        for mine, theirs in zip(step.velocity, again.velocity):
            torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)
    # and its own state (NumPy arrays) restores it
    restored = SingleSampleStep(reference, lr=0.05, momentum=momentum)
    restored.load_state_dict(step.state_dict())
    assert (restored.velocity is None) == (momentum == 0)
    for mine, theirs in zip(step.velocity or [], restored.velocity or []):
        torch.testing.assert_close(mine, theirs)


@pytest.mark.parametrize("model_name", ["mlp", "cnn"])
def test_a_seeded_private_step_resumes_to_the_noise_an_uninterrupted_one_draws(model_name):
    """With --dp-seed, the step's state carries its noise generators: a step restored
    after 5 steps takes the next 5 as the uninterrupted one does. With an entropy seed it
    carries none: the restored step draws fresh noise, never the noise already used."""
    shape = (1, 8, 8) if model_name == "cnn" else (6,)
    generator = torch.Generator().manual_seed(1)
    samples = [(torch.randn(1, *shape, generator=generator), n % 3) for n in range(10)]

    def run(seed: int | None) -> tuple[nn.Module, SingleSampleStep, nn.Module, dict]:
        torch.manual_seed(0)
        model = build_model(model_name, shape, 3)
        step = SingleSampleStep(model, 0.05, 0.9, clip=1.0, noise_multiplier=1.0, seed=seed)
        for x, target in samples[:5]:
            step.step(x, target)
        saved = copy.deepcopy(model)
        state = copy.deepcopy(step.state_dict())
        for x, target in samples[5:]:
            step.step(x, target)
        return model, step, saved, state

    def resumed(saved: nn.Module, state: dict, seed: int | None) -> nn.Module:
        step = SingleSampleStep(saved, 0.05, 0.9, clip=1.0, noise_multiplier=1.0, seed=seed)
        step.load_state_dict(state)
        for x, target in samples[5:]:
            step.step(x, target)
        return saved

    model, _, saved, state = run(seed=3)
    assert "noise" in state
    again = resumed(saved, state, seed=3)
    for mine, theirs in zip(model.parameters(), again.parameters()):
        assert torch.equal(mine, theirs)
    with pytest.raises(ValueError, match="another --dp-seed"):
        SingleSampleStep(saved, 0.05, 0.9, clip=1.0, noise_multiplier=1.0, seed=4).load_state_dict(
            state
        )
    model, _, saved, state = run(seed=None)
    assert "noise" not in state
    fresh = resumed(saved, state, seed=None)
    assert not torch.equal(next(model.parameters()), next(fresh.parameters()))


# -- the NumPy MLP -------------------------------------------------------------------------


def torch_twin(model: NumpyMLP) -> nn.Module:
    """A torch MLP with ``model``'s weights."""
    twin = build_model("mlp", (model.features,), model.rows, hidden=HIDDEN)
    twin.load_state_dict({name: torch.from_numpy(v) for name, v in model.state_dict().items()})
    return twin


HIDDEN = (8, 5)


def test_the_numpy_mlp_is_the_torch_mlp_in_numpy():
    """Built from a seed (nn.Linear's bounds), named as the torch MLP's state_dict, and
    computing the same logits; every weight is a view of one array."""
    model = NumpyMLP.build(6, 3, HIDDEN, seed=4)
    assert [w.shape for w in model.weights] == [(8, 6), (5, 8), (3, 5)]
    for weight, bias in zip(model.weights, model.biases):
        bound = 1 / weight.shape[1] ** 0.5
        assert np.abs(weight).max() <= bound and np.abs(bias).max() <= bound
        assert np.shares_memory(weight, model.storage) and weight.dtype == np.float32
    assert mlp_weight_count((6,), 3, HIDDEN) == model.storage.size
    again, other = NumpyMLP.build(6, 3, HIDDEN, seed=4), NumpyMLP.build(6, 3, HIDDEN, seed=5)
    assert np.array_equal(again.storage, model.storage)
    assert not np.array_equal(other.storage, model.storage)
    twin = torch_twin(model)
    assert list(twin.state_dict()) == model.names()
    x = np.random.default_rng(0).normal(size=(7, 6)).astype(np.float32)
    np.testing.assert_allclose(
        model.logits(x), twin(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        model.embedding(x[0]), twin.embed(torch.from_numpy(x[:1]))[0].detach().numpy(), rtol=1e-5
    )
    with pytest.raises(ValueError, match="do not match"):
        model.load_state_dict({"head.weight": np.zeros((3, 5))})


def test_the_numpy_mlp_grows_as_the_torch_one():
    """A wider head keeps the known logits and draws new rows by (seed, row); a wider
    input keeps every output for zero new features; both map every old array to its
    successor, for the step's velocity."""
    model = NumpyMLP.build(4, 2, HIDDEN, seed=0)
    x = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    before = model.logits(x)
    old = list(model.arrays)
    replaced = model.widen_classifier(4, seed=11)
    assert model.rows == 4 and set(replaced) == {id(array) for array in old}
    np.testing.assert_array_equal(model.logits(x)[:, :2], before)
    again = NumpyMLP.build(4, 2, HIDDEN, seed=0)
    again.widen_classifier(4, seed=11)
    assert np.array_equal(again.storage, model.storage)
    other = NumpyMLP.build(4, 2, HIDDEN, seed=0)
    other.widen_classifier(4, seed=12)
    assert not np.array_equal(other.weights[-1][2:], model.weights[-1][2:])
    assert np.abs(model.weights[-1][2:]).max() <= 1 / 5**0.5
    model.widen_input(6)
    wide = np.concatenate([x, np.zeros((5, 2), dtype=np.float32)], axis=1)
    np.testing.assert_allclose(model.logits(wide)[:, :2], before, rtol=1e-6)
    with pytest.raises(ValueError, match="cannot shrink"):
        model.widen_classifier(3, seed=0)


def test_the_numpy_mlp_imprints_a_row_as_the_torch_rule():
    from stratify.stream.classifier import imprint_row

    model = NumpyMLP.build(4, 3, HIDDEN, seed=2)
    twin = torch_twin(model)
    embedding = np.array([0.0, 3.0, 0.0, 4.0, 1.0], dtype=np.float32)
    assert not model.imprint_row(0, embedding) and not model.imprint_row(2, np.zeros(5))
    assert model.imprint_row(2, embedding)
    assert imprint_row(twin.head, 2, torch.from_numpy(embedding))
    np.testing.assert_allclose(model.weights[-1], twin.head.weight.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(model.biases[-1], twin.head.bias.detach().numpy(), rtol=1e-6)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_the_step_of_the_numpy_mlp_is_torch_sgd(momentum):
    """On its own arrays, across a grown classifier: the loss and the weights of
    torch.optim.SGD on the same network."""
    model = NumpyMLP.build(6, 2, HIDDEN, seed=3)
    reference = torch_twin(model)
    step = SingleSampleStep(model, lr=0.05, momentum=momentum)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=momentum)
    rng = np.random.default_rng(1)
    for number in range(30):
        if number == 10:  # a third class: both heads take the NumPy one's new row
            step.follow(model, model.widen_classifier(3, seed=0))
            reference.head = nn.Linear(5, 3)
            reference.load_state_dict(
                {name: torch.from_numpy(v) for name, v in model.state_dict().items()}
            )
            optimizer = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=momentum)
            if momentum:  # the velocity carried over, zero for the new row
                velocity = [torch.as_tensor(v) for v in step.velocity]
                for parameter, value in zip(reference.parameters(), velocity):
                    optimizer.state[parameter]["momentum_buffer"] = value.clone()
        x = rng.normal(size=6).astype(np.float32)
        target = number % (2 if number < 10 else 3)
        loss = step.step_array(x, target)
        optimizer.zero_grad()
        expected = nn.functional.cross_entropy(
            reference(torch.from_numpy(x)[None]), torch.tensor([target])
        )
        expected.backward()
        optimizer.step()
        assert loss == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
    for mine, theirs in zip(model.parameters(), reference.parameters()):
        np.testing.assert_allclose(mine, theirs.detach().numpy(), rtol=1e-5, atol=1e-6)


# -- prequential accuracy -----------------------------------------------------------------


def test_prequential_window_and_total():
    prequential = Prequential(window=3)
    assert prequential.window_accuracy is None and prequential.accuracy is None
    for outcome in [True, False, True, True, False]:
        prequential.record(outcome)
    assert prequential.window_accuracy == pytest.approx(2 / 3)
    assert prequential.accuracy == pytest.approx(3 / 5)
    copy = Prequential(window=3)
    copy.load_state_dict(prequential.state_dict())
    copy.record(True)
    prequential.record(True)
    assert (copy.window_accuracy, copy.accuracy) == (
        prequential.window_accuracy,
        prequential.accuracy,
    )


# -- events -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"client": 1, "label": 2, "x": [1, 2', "malformed JSON"),
        ("[1, 2]", "an event is a JSON object"),
        ('{"label": 2, "x": [1]}', "missing client"),
        ('{"client": 1, "label": 2.5, "x": [1]}', "label must be an integer, a string or a"),
        ('{"client": true, "label": 2, "x": [1]}', "client must be an integer or a string"),
        ('{"client": 1, "label": 2}', 'no features: give "x"'),
        ('{"client": 1, "label": 2, "x": [1], "path": "a.npy"}', 'give the features as "x" or'),
        ('{"client": 1, "label": 2, "x": "abc"}', "the features must be a list of numbers"),
        ('{"client": 1, "label": 2, "x": [1, "a"]}', "the features must be numbers"),
        ('{"client": 1, "label": 2, "x": [[1, 2], [3]]}', "nested lists of equal length"),
        ('{"client": 1, "label": 2, "x": []}', "the features are empty"),
        ('{"client": 1, "label": 2, "x": [1, NaN]}', "NaN or infinity"),
        ('{"client": 1, "label": 2, "x": [1, Infinity]}', "NaN or infinity"),
        ('{"client": 1, "label": 2, "x": [1, 1e999]}', "NaN or infinity"),
        ('{"client": 1, "label": 2, "x": [1, 1e39]}', "beyond float32"),
        ('{"client": 1, "label": 2, "path": "missing.npy"}', "cannot read"),
        ('{"id": 4}', "missing label"),
        ('{"id": [4], "label": 1}', "id must be an integer or a string"),
    ],
)
def test_a_line_that_is_no_event_says_why(line, reason, tmp_path):
    with pytest.raises(EventError, match=reason):
        parse_line(line, 5, tmp_path)


def test_events_from_lists_and_npy_rows(tmp_path):
    event = parse_line('{"client": "a", "label": "cat", "x": [[1, 2], [3, 4]]}', 3)
    assert (event.client, event.label, event.line) == ("a", "cat", 3)
    assert event.x.dtype == np.float32 and event.x.shape == (2, 2)
    assert parse_line("   \n", 4) is None
    np.save(tmp_path / "rows.npy", np.arange(6, dtype=np.float64).reshape(3, 2))
    row = parse_line('{"client": 0, "label": 1, "path": "rows.npy", "row": 2}', 1, tmp_path)
    assert row.x.tolist() == [4.0, 5.0] and row.x.dtype == np.float32
    whole = parse_line('{"client": 0, "label": 1, "path": "rows.npy"}', 1, tmp_path)
    assert whole.x.shape == (3, 2)
    with pytest.raises(EventError, match=r'"row" must be an integer in \[0, 3\)'):
        parse_line('{"client": 0, "label": 1, "path": "rows.npy", "row": 3}', 1, tmp_path)


def test_a_test_set_needs_no_client_and_refuses_bad_lines(tmp_path):
    path = tmp_path / "test.jsonl"
    path.write_text(
        json.dumps({"label": 1, "x": [1, 2]}) + "\n\n" + json.dumps({"label": "b", "x": [3, 4]})
    )
    features, labels = load_test_set(str(path))
    assert [x.tolist() for x in features] == [[1, 2], [3, 4]] and labels == [1, "b"]
    path.write_text(json.dumps({"label": 1, "x": [1, 2]}) + "\n" + '{"x": [1, 3]}\n')
    with pytest.raises(Exception, match="line 2: missing label"):
        load_test_set(str(path))
    with pytest.raises(Exception, match="--test .* cannot open it"):
        load_test_set(str(tmp_path / "nope.jsonl"))


def test_npy_files_of_the_wrong_kind_are_one_event_error(tmp_path):
    np.save(tmp_path / "scalar.npy", np.float32(3.0))
    np.save(tmp_path / "words.npy", np.array(["a", "b"]))
    np.save(tmp_path / "nan.npy", np.array([[1.0, np.nan]]))
    np.savez(tmp_path / "many.npz", a=np.ones(2))
    (tmp_path / "broken.npy").write_bytes(b"\x93NUMPY garbage")
    (tmp_path / "folder.npy").mkdir()
    for line, reason in [
        ('{"client": 0, "label": 1, "path": "scalar.npy", "row": 0}', "holds one value"),
        ('{"client": 0, "label": 1, "path": "words.npy"}', "does not hold numbers"),
        ('{"client": 0, "label": 1, "path": "nan.npy", "row": 0}', "NaN or infinity"),
        ('{"client": 0, "label": 1, "path": "many.npz"}', "cannot read|several arrays"),
        ('{"client": 0, "label": 1, "path": "broken.npy"}', "cannot read"),
        ('{"client": 0, "label": 1, "path": "folder.npy"}', "not a regular file"),
        ('{"client": 0, "label": 1, "path": "nan.npy", "row": true}', '"row" must be an integer'),
        ('{"client": 0, "label": 1, "path": 7}', '"path" must name a .npy file'),
    ]:
        with pytest.raises(EventError, match=reason):
            parse_line(line, 1, tmp_path)
