"""The attacks on the training messages (docs/privacy.md, "Threat model"): what the server
sees of the model updates, recorded by :class:`~stratify.privacy.views.RecordingTrainer`,
and what the label and input attacks recover from it.

Every attack is measured on a real small run (digits, one epoch) and checked both ways:
it recovers on the undefended view, and recovers no more than chance where the view
cannot give it (the shares summed as secure aggregation shows them, or gradients that
are pure noise).
"""

from __future__ import annotations

import dataclasses
from functools import cache

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from stratify.client import LocalTrainer
from stratify.config import TrainConfig
from stratify.errors import ConfigError
from stratify.experiment import build_experiment
from stratify.privacy.batchnorm import (
    infer_share_labels,
    invert_one_sample,
    nearest_centroid,
    share_sums,
    sums_mismatch,
)
from stratify.privacy.gradients import (
    RECOVERED_ERROR,
    assign_labels,
    attack_run,
    input_recovery,
    label_recovery,
    label_votes,
    one_sample_input,
    one_sample_label,
    present_labels,
    reconstruct_inputs,
    record_run,
    recover_labels,
    recover_labels_from_counts,
    relative_errors,
)
from stratify.privacy.views import (
    HopUpdate,
    RecordingTrainer,
    ServerView,
    ShareGradient,
    placeholder_labels,
    runs_of,
)
from stratify.registry.base import RegistryResult

SPLITS = ("iid", "dirichlet:0.5", "dirichlet:0.1")
MODELS = ("cnn", "mlp")
CHANCE = 0.1  # digits: 10 labels
#: above chance a random one-to-one map of 10 labels reaches with probability < 1%
#: (mean of its fixed points over a few draws)
MARGIN = 0.2


def config(model: str, mode: str, split: str, seed: int = 0, **options) -> TrainConfig:
    return TrainConfig(
        dataset="digits",
        model=model,
        mode=mode,
        partition=split,
        epochs=1,
        seed=seed,
        secure=False,  # the registry is not under test: its placeholders are as random
        options=options,
    )


@cache
def recorded(model: str, mode: str, split: str):
    return record_run(config(model, mode, split))


# -- the pure pieces, against hand-computed values -----------------------------------------


def test_present_labels_are_the_negative_entries():
    # two samples of labels 1 and 3: Σ softmax − onehot; absent labels' entries are > 0
    assert present_labels(np.array([0.3, -0.5, 0.2, -0.1])).tolist() == [1, 3]


def test_one_sample_label_is_the_negative_entry_of_softmax_minus_onehot():
    logits = torch.tensor([[0.2, 1.5, -0.3, 0.7]], requires_grad=True)
    F.cross_entropy(logits, torch.tensor([2]), reduction="sum").backward()
    # softmax − onehot(2): only entry 2 is negative
    assert one_sample_label(logits.grad[0].numpy()) == 2


def test_one_sample_input_divides_a_weight_row_by_its_bias_entry():
    delta = np.array([0.5, -2.0, 0.0])  # the unit with δ = 0 (inactive) is not used
    x = np.array([1.0, 3.0, -2.0])
    weight, bias = np.outer(delta, x), delta
    np.testing.assert_allclose(one_sample_input(weight, bias), [1.0, 3.0, -2.0])


def test_assign_labels_maximises_the_summed_votes_one_label_each():
    # placeholder 0's best label is 1; placeholder 1 prefers label 0 over 1
    votes = np.array([[0.0, 1.0], [1.0, 0.5]])
    assert assign_labels(votes).tolist() == [1, 0]
    # all tied: the seeded tie-break, not the index order, decides
    draws = {tuple(assign_labels(np.zeros((4, 4)), seed).tolist()) for seed in range(20)}
    assert len(draws) > 1


def share(batch: int, placeholders: list[int], bias: list[float]) -> ShareGradient:
    positions = np.arange(len(placeholders))
    return ShareGradient(
        batch, 0, positions, np.asarray(placeholders), {"head.bias": torch.tensor(bias)}
    )


def test_label_votes_count_a_placeholder_with_the_labels_its_messages_name():
    messages = [
        share(0, [0], [0.2, -0.7, 0.5]),  # one sample: names label 1 only
        share(1, [0, 2], [-0.1, -0.3, 0.4]),  # two samples: names labels 0 and 1
        share(2, [2, 2], [-0.9, 0.6, 0.3]),  # names label 0
    ]
    votes = label_votes(messages, 3)
    np.testing.assert_allclose(votes, [[0.5, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.5, 0.0]])


def test_a_hop_gives_its_summed_gradient_from_the_model_before_and_after():
    hop = HopUpdate(
        0,
        np.array([4]),
        np.array([1]),
        {"w": torch.tensor([1.0, -0.5])},
        {"w": torch.tensor([0.8, -0.3])},
        lr=0.1,
    )
    torch.testing.assert_close(hop.summed_gradient()["w"], torch.tensor([2.0, -2.0]))


def test_the_aggregated_view_sums_each_batch_s_shares_into_one_message():
    view = ServerView(3, shares=[share(0, [0], [1.0, 2.0]), share(0, [1, 2], [3.0, -1.0])])
    view.shares.append(share(1, [2], [0.5, 0.5]))
    (first, second) = view.aggregated().shares
    assert first.client == -1 and first.placeholders.tolist() == [0, 1, 2]
    torch.testing.assert_close(first.gradient["head.bias"], torch.tensor([4.0, 1.0]))
    torch.testing.assert_close(second.gradient["head.bias"], torch.tensor([0.5, 0.5]))


def test_placeholder_labels_invert_the_clients_maps():
    result = RegistryResult(3, [{7: 2, 5: 0}, {5: 0, 9: 1}], np.array([2, 1, 1]))
    assert placeholder_labels(result).tolist() == [5, 9, 7]


def test_runs_of_split_consecutive_owners():
    runs = runs_of(np.array([3, 3, 1, 3, 3, 3]))
    assert [run.tolist() for run in runs] == [[0, 1], [2], [3, 4, 5]]


# -- the recorder: what it keeps, and that it changes nothing -------------------------------


@pytest.mark.parametrize("mode", ["batch", "single-sample"])
def test_a_recorded_run_trains_the_same_model(mode):
    plain = build_experiment(config("mlp", mode, "dirichlet:0.5"))
    plain.engine.run_epoch(1)
    run = record_run(config("mlp", mode, "dirichlet:0.5"))
    for (name, a), (_, b) in zip(
        plain.model.named_parameters(), run.experiment.model.named_parameters()
    ):
        # the shares' gradients summed in another order: equal up to float rounding
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


def test_every_share_is_one_client_s_samples_with_their_placeholders():
    run = recorded("mlp", "batch", "dirichlet:0.1")
    experiment, view = run.experiment, run.view
    assert view.shares and not view.hops
    sample_placeholders = experiment.federation.sample_placeholders(experiment.placeholders)
    sample_clients = experiment.federation.sample_clients()
    first = [message for message in view.shares if message.batch == 0]
    assert sum(len(message.positions) for message in first) == 64  # --batch-labels
    assert len({message.client for message in first}) == len(first)
    for message in view.shares:
        assert (sample_placeholders[message.positions] == message.placeholders).all()
        assert (sample_clients[message.positions] == message.client).all()


def test_the_shares_of_a_batch_are_each_its_samples_summed_gradient():
    dataset_run = recorded("mlp", "batch", "dirichlet:0.1")
    # the first batch's shares were computed at the model's initial weights: rebuild them
    torch.manual_seed(0)
    initial = build_experiment(config("mlp", "batch", "dirichlet:0.1")).model
    x, y = dataset_run.truth.x_train, dataset_run.truth.y_train
    first = [message for message in dataset_run.view.shares if message.batch == 0]
    assert len(first) > 1
    for message in first:
        index = torch.as_tensor(message.positions)
        initial.zero_grad()
        F.cross_entropy(initial(x[index]), y[index], reduction="sum").backward()
        torch.testing.assert_close(message.gradient["head.bias"], initial.head.bias.grad)
        torch.testing.assert_close(
            message.gradient["layers.1.weight"], initial.layers[1].weight.grad
        )


def test_hops_are_runs_of_one_client_with_the_model_before_and_after():
    run = recorded("mlp", "single-sample", "dirichlet:0.1")
    view = run.view
    assert view.hops and not view.shares
    clients = run.experiment.federation.sample_clients()
    for hop in view.hops[:50]:
        assert (clients[hop.positions] == hop.client).all()
    # consecutive hops chain: the model comes back from one and goes to the next
    for a, b in zip(view.hops[:50], view.hops[1:51]):
        torch.testing.assert_close(a.after["head.bias"], b.before["head.bias"])
    assert max(len(hop.positions) for hop in view.hops) <= 5  # --chunk: a hop's entries


class NoiseTrainer(LocalTrainer):
    """What leaves the clients is pure noise: every gradient, and every hop's update,
    replaced by a Gaussian's (a stand-in for a defence applied inside the trainer)."""

    def __init__(self, x_train, y_train, scale: float = 1.0, seed: int = 0) -> None:
        super().__init__(x_train, y_train)
        self.scale = scale
        self.generator = torch.Generator().manual_seed(seed)

    def noise(self, like: torch.Tensor) -> torch.Tensor:
        return torch.randn(like.shape, generator=self.generator) * self.scale

    def batch_gradient(self, model, samples, clients, fused=True, divisor=None):
        loss = super().batch_gradient(model, samples, clients, fused, divisor)
        for parameter in model.parameters():
            parameter.grad = self.noise(parameter)
        return loss

    def single_sample_steps(self, model, optimizer, indices, lr):
        before = [parameter.detach().clone() for parameter in model.parameters()]
        losses = super().single_sample_steps(model, optimizer, indices, lr)
        with torch.no_grad():  # the hop's update replaced by -lr · noise
            for parameter, start in zip(model.parameters(), before):
                parameter.copy_(start - lr * self.noise(parameter))
        return losses


def test_the_recorder_records_what_the_wrapped_trainer_hands_back():
    run = record_run(config("mlp", "batch", "iid"), trainer=NoiseTrainer)
    clean = recorded("mlp", "batch", "iid")
    noisy, plain = run.view.shares[0].gradient, clean.view.shares[0].gradient
    assert run.view.shares[0].positions.tolist() == clean.view.shares[0].positions.tolist()
    assert not torch.allclose(noisy["head.bias"], plain["head.bias"])


def test_the_recorder_must_know_the_run_before_it_trains():
    base = build_experiment(config("mlp", "batch", "iid"))
    recorder = RecordingTrainer(LocalTrainer(base.dataset.x_train, base.dataset.y_train))
    with pytest.raises(RuntimeError, match="attach"):
        recorder.batch_gradient(base.model, np.array([0, 1]), np.array([0, 0]))


# -- label recovery (iDLG) on real runs ---------------------------------------------------


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("view", ["shares", "aggregated"])
def test_head_bias_gradients_of_batch_shares_map_every_placeholder(model, split, view):
    """Each share alone: the labels (≥ 0.9). Behind secure aggregation (the batch's sum):
    no more than chance, tie-breaks averaged over 10 seeds."""
    run = recorded(model, "batch", split)
    shown = run.view if view == "shares" else run.view.aggregated()
    recovery = np.mean(
        [label_recovery(recover_labels(shown, seed=seed), run.truth) for seed in range(10)]
    )
    if view == "shares":
        assert recovery >= 0.9
    else:
        assert recovery <= CHANCE + MARGIN


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("model", MODELS)
def test_the_model_before_and_after_each_hop_maps_every_placeholder(model, split):
    run = recorded(model, "single-sample", split)
    assert label_recovery(recover_labels(run.view), run.truth) >= 0.9


@pytest.mark.parametrize("mode", ["batch", "single-sample"])
def test_noise_gradients_map_placeholders_at_chance(mode):
    """The same attack on messages that are pure noise: chance, over three draws."""
    recoveries = []
    # a fixed rate: a hop's update is -lr · noise, a random walk that a larger default
    # rate (0.03, Stratify's single-sample rate on digits) drives to a non-finite loss
    noisy = dataclasses.replace(config("cnn", mode, "dirichlet:0.5"), lr=0.01)
    for seed in range(3):
        run = record_run(
            noisy,
            trainer=lambda x, y, seed=seed: NoiseTrainer(x, y, scale=1.0, seed=seed),
        )
        recoveries.append(label_recovery(recover_labels(run.view), run.truth))
    assert np.mean(recoveries) <= CHANCE + MARGIN


@pytest.mark.parametrize("split", SPLITS)
def test_batch_sums_still_give_the_labels_through_their_counts(split):
    """Behind secure aggregation the server holds each batch's sum only; the head bias's
    sum gives the batch's label counts, which follow the placeholder counts it
    scheduled: every placeholder mapped (≥ 0.9)."""
    run = recorded("mlp", "batch", split)
    assert len(run.view.predictions) == len({share.batch for share in run.view.shares})
    assert label_recovery(recover_labels_from_counts(run.view), run.truth) >= 0.9


def test_the_count_attack_on_noise_sums_is_at_chance():
    recoveries = []
    for seed in range(3):
        run = record_run(
            config("mlp", "batch", "dirichlet:0.5"),
            trainer=lambda x, y, seed=seed: NoiseTrainer(x, y, scale=1.0, seed=seed),
        )
        recoveries.append(label_recovery(recover_labels_from_counts(run.view), run.truth))
    assert np.mean(recoveries) <= CHANCE + MARGIN


def test_the_count_attack_needs_the_batches_and_their_predictions():
    with pytest.raises(ValueError, match="probe"):
        recover_labels_from_counts(recorded("mlp", "single-sample", "iid").view)


def fedavg_labels(split: str, seed: int) -> float:
    run = record_run(dataclasses.replace(config("mlp", "batch", split, seed), algorithm="fedavg"))
    assert run.view.rounds and not run.view.shares and not run.view.hops
    return label_recovery(recover_labels(run.view), run.truth)


def test_a_baseline_s_rounds_give_the_labels_where_clients_differ():
    """FedAvg's returned models: (before − after) / lr's head bias is negative at the
    labels a client holds, so placeholders follow who holds them: ≥ 0.8 on
    dirichlet:0.1 over 3 seeds (measured 1.0, 0.8, 1.0); on iid every client holds every
    label and the same attack is at chance (the test's control)."""
    assert np.mean([fedavg_labels("dirichlet:0.1", seed) for seed in range(3)]) >= 0.8
    assert np.mean([fedavg_labels("iid", seed) for seed in range(3)]) <= CHANCE + MARGIN


# -- input reconstruction (MLP) -----------------------------------------------------------


@pytest.mark.parametrize("mode", ["batch", "single-sample"])
def test_one_sample_messages_give_their_input_exactly(mode):
    run = recorded("mlp", mode, "dirichlet:0.1")
    positions, inputs = reconstruct_inputs(run.view)
    assert len(positions) > 0
    errors = relative_errors(positions, inputs, run.truth)
    assert np.median(errors) < 1e-5
    assert input_recovery(positions, inputs, run.truth) > 0
    # each one is the input of the sample the message names
    assert (errors < RECOVERED_ERROR).mean() > 0.9


def test_the_aggregated_view_gives_no_input():
    run = recorded("mlp", "batch", "dirichlet:0.1")
    positions, _ = reconstruct_inputs(run.view.aggregated())
    assert len(positions) == 0


def test_the_ratio_of_a_two_sample_share_is_no_input():
    run = recorded("mlp", "batch", "dirichlet:0.1")
    mixed = [message for message in run.view.shares if len(message.positions) == 2]
    assert mixed
    x = run.truth.x_train
    errors = []
    for message in mixed:
        gradient = message.gradient
        estimate = one_sample_input(
            gradient["layers.1.weight"].double().numpy(), gradient["layers.1.bias"].double().numpy()
        )
        real = x[torch.as_tensor(message.positions)].reshape(2, -1).double().numpy()
        errors.append(
            min(np.linalg.norm(estimate - r) / np.linalg.norm(r) for r in real)  # either one
        )
    assert np.median(errors) > 0.05


def test_noise_gradients_give_no_input():
    run = record_run(
        config("mlp", "single-sample", "dirichlet:0.1"),
        trainer=lambda x, y: NoiseTrainer(x, y, scale=1.0),
    )
    positions, inputs = reconstruct_inputs(run.view)
    assert len(positions) > 0
    assert input_recovery(positions, inputs, run.truth) == 0


# -- the API --------------------------------------------------------------------------------


def test_attack_run_reports_each_attack():
    results = attack_run(config("mlp", "batch", "dirichlet:0.1"))
    assert results["labels"] >= 0.9
    assert results["labels-aggregated"] <= CHANCE + 3 * MARGIN  # one tie-break draw
    assert results["inputs"] > 0 and results["inputs-error"] < 1e-5
    assert 0 <= results["accuracy"] <= 1
    single = attack_run(config("cnn", "single-sample", "iid"), attacks=["labels", "inputs"])
    assert single["labels"] >= 0.9 and np.isnan(single["inputs"])
    assert "labels-aggregated" not in single


def test_attack_run_refuses_an_unknown_attack_and_a_validation_split():
    with pytest.raises(ConfigError, match="unknown attack"):
        attack_run(config("cnn", "batch", "iid"), attacks=["gradient-inversion"])
    held_out = TrainConfig(dataset="digits", model="cnn", epochs=1, validation=0.1)
    with pytest.raises(ConfigError, match="validation"):
        attack_run(held_out)


# -- sum-based BatchNorm: the sums a share sends ------------------------------------------


@cache
def sumbn_model():
    run = build_experiment(
        TrainConfig(
            dataset="digits",
            model="resnet20",
            norm="sumbn",
            mode="batch",
            partition="dirichlet:0.5",
            epochs=1,
            seed=0,
            secure=False,
        )
    )
    return run.model, run.dataset


def public_references(dataset, per_class: int = 10) -> torch.Tensor:
    labels = dataset.y_test.numpy()
    return torch.as_tensor(
        np.concatenate([np.flatnonzero(labels == c)[:per_class] for c in range(10)])
    )


def test_the_shares_sums_add_up_to_the_batch_s_and_match_the_in_process_layer():
    model, dataset = sumbn_model()
    batch = np.arange(12)
    shares = [batch[:5], batch[5:6], batch[6:]]
    *parts, total = share_sums(model, dataset.x_train, shares)
    assert len(total) == 19  # ResNet-20's BatchNorm layers
    for layer in range(19):
        summed = sum(part[layer].total for part in parts)
        torch.testing.assert_close(summed, total[layer].total)
        assert sum(part[layer].count for part in parts) == total[layer].count
    # the first layer's sums are the stem conv's outputs summed (no statistics before it)
    with torch.no_grad():
        out = model.stem[0](dataset.x_train[torch.as_tensor(batch[5:6])]).double()
    torch.testing.assert_close(parts[1][0].total, out.sum((0, 2, 3)))
    torch.testing.assert_close(parts[1][0].squares, out.square().sum((0, 2, 3)))


def test_nearest_centroid_picks_the_closest_row():
    centroids = np.array([[0.0, 0.0], [1.0, 1.0], [5.0, 0.0]])
    features = np.array([[0.9, 0.8], [4.0, 0.5], [0.1, -0.2]])
    assert nearest_centroid(features, centroids).tolist() == [1, 2, 0]


@pytest.mark.parametrize("share_size", [1, 64])
def test_one_sample_shares_sums_name_their_labels(share_size):
    """One-sample shares (no smallest share is set): the last layers' means name the
    label well above chance on an untrained ResNet-20; the same batch sent as one share
    (its sum over 64 samples) names one label for all, near chance."""
    model, dataset = sumbn_model()
    batch = np.random.default_rng(0).choice(len(dataset.x_train), 64, replace=False)
    shares = [batch[i : i + share_size] for i in range(0, 64, share_size)]
    reference = public_references(dataset)
    labels = infer_share_labels(
        model, dataset.x_train, shares, dataset.x_test[reference], dataset.y_test[reference]
    )
    right = sum(
        int((dataset.y_train[torch.as_tensor(share)] == int(label)).sum())
        for share, label in zip(shares, labels)
    )
    accuracy = right / 64
    if share_size == 1:
        assert accuracy >= CHANCE + 2 * MARGIN
    else:
        assert accuracy <= CHANCE + MARGIN


def test_the_input_fit_lowers_the_sums_mismatch():
    model, dataset = sumbn_model()
    *parts, total = share_sums(model, dataset.x_train, [np.array([3]), np.array([4, 5])])
    shape = tuple(dataset.x_train.shape[1:])
    start = invert_one_sample(model, parts[0], total, shape, steps=0)
    fitted = invert_one_sample(model, parts[0], total, shape, steps=40)
    before = float(sums_mismatch(model, start[None], parts[0], total).detach())
    after = float(sums_mismatch(model, fitted[None], parts[0], total).detach())
    assert after < 0.5 * before


def test_a_baseline_s_rounds_are_recorded_as_sent_and_returned():
    run = record_run(
        TrainConfig(
            dataset="digits", model="mlp", algorithm="fedavg", epochs=1, seed=0, secure=False
        )
    )
    rounds = run.view.rounds
    assert rounds and not run.view.shares and not run.view.hops
    clients = run.experiment.federation.sample_clients()
    for update in rounds:
        assert (clients[update.positions] == update.client).all()
        assert not torch.equal(update.before["head.bias"], update.after["head.bias"])
    # every client of the round received the same global model
    first = rounds[0].before["head.bias"]
    assert all(torch.equal(update.before["head.bias"], first) for update in rounds)


def test_attack_run_says_nan_where_the_recorder_keeps_no_share():
    results = attack_run(
        TrainConfig(
            dataset="digits",
            model="resnet20",
            norm="sumbn",
            mode="batch",
            epochs=1,
            seed=0,
            secure=False,
            options={"batch_labels": 256},
        ),
        attacks=["labels", "labels-aggregated"],
    )
    assert np.isnan(results["labels"]) and np.isnan(results["labels-aggregated"])
