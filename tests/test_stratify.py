"""The engine's execution paths: single-sample hops, global batches (fused vs explicit), counts."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from engines import client_data, tiny_engine

from stratify.client import accumulate_batch_gradient
from stratify.config import TrainConfig
from stratify.data.datasets import load_digits
from stratify.errors import ConfigError
from stratify.experiment import build_experiment
from stratify.method import Round, RoundStats
from stratify.nn.models import build_model
from stratify.selection import Plan
from stratify.stratify import Stratify


def digits_engine(
    mode="single-sample", model_name="cnn", norm=None, spec="dirichlet:0.5", **options
):
    config = TrainConfig(
        dataset="digits",
        partition=spec,
        clients=5,
        mode=mode,
        model=model_name,
        norm=norm,
        lr=0.05,
        seed=1,
        secure=False,
        options=options,
    )
    torch.manual_seed(0)
    model = build_model(model_name, (1, 8, 8), 10, norm=norm)
    return build_experiment(config, dataset=load_digits(), model=model).engine


def test_single_sample_plan_equals_hand_written_sgd():
    engine = digits_engine()
    plan = engine.strategy.plan_epoch(engine.context, np.random.default_rng(0))
    samples = plan.samples[:50]
    reference = copy.deepcopy(engine.model)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05)
    for index in samples.tolist():
        optimizer.zero_grad()
        x = engine.dataset.x_train[index].unsqueeze(0)
        y = engine.dataset.y_train[index].unsqueeze(0)
        F.cross_entropy(reference(x), y).backward()
        optimizer.step()
    stats = engine.strategy.execute_single_sample(engine.context, samples)
    for ours, theirs in zip(engine.model.parameters(), reference.parameters()):
        assert torch.allclose(ours, theirs, atol=1e-6)
    assert (stats.steps, stats.loss_count) == (50, 50)


def test_plan_traffic_is_counted():
    # holders 0, 0, 3, 0: three arrivals (0, 3, 0); relayed by the server, down to 0, up
    # and down twice (0 -> 3 -> 0), back up at the end: 1 + 2 + 2 + 1 = 6 transfers
    engine = digits_engine()
    plan = Plan("single-sample", np.array([0, 1, 2, 3]), np.array([0, 0, 3, 0]), skipped=2)
    round_ = Round(payload=plan, stats=RoundStats(skipped=2))
    (update,) = engine.strategy.fit(engine.context, round_, np.random.default_rng(0))
    assert (update.stats.transfers, update.stats.uploads, update.stats.steps) == (6, 0, 4)
    assert update.stats.sample_gradients == 4
    assert update.state is None  # the model travelled: nothing to aggregate
    assert engine.strategy.aggregate(engine.context, round_, [update]) is None


def batch_gradients(engine, samples, clients, fused):
    engine.model.zero_grad(set_to_none=False)
    loss = accumulate_batch_gradient(
        engine.model,
        engine.context.x_train,
        engine.context.y_train,
        samples,
        clients,
        fused=fused,
    )
    return loss, [p.grad.clone() for p in engine.model.parameters()]


def test_batch_explicit_and_fused_paths_give_same_gradients():
    engine = digits_engine(mode="batch", batch_labels=48)
    plan = engine.strategy.plan_epoch(engine.context, np.random.default_rng(3))
    start, stop = plan.batch_starts[0], plan.batch_starts[1]
    samples, clients = plan.samples[start:stop], plan.clients[start:stop]
    assert len(np.unique(clients)) > 1, "the test needs a batch spread over several clients"
    fused_loss, fused = batch_gradients(engine, samples, clients, fused=True)
    explicit_loss, explicit = batch_gradients(engine, samples, clients, fused=False)
    assert np.isclose(fused_loss, explicit_loss, rtol=1e-5)
    for a, b in zip(fused, explicit):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)
    # and both equal the gradient of the mean loss over the union batch
    union = copy.deepcopy(engine.model)
    index = torch.as_tensor(samples)
    F.cross_entropy(union(engine.dataset.x_train[index]), engine.dataset.y_train[index]).backward()
    for a, parameter in zip(fused, union.parameters()):
        assert torch.allclose(a, parameter.grad, atol=1e-6, rtol=1e-4)


def test_sumbn_global_batch_matches_batchnorm_on_union():
    # Model, data and the nn.BatchNorm2d reference all run in float64, so the result does
    # not depend on which float32 CPU kernels are active (oneDNN on or off, thread count:
    # other tests change them) nor on a lucky batch. Over these five batches the sum-based
    # layer matches BatchNorm on the union batch to about 1e-14 relative (measured, with
    # oneDNN on and off); the 1e-9 bound leaves room for other BLAS builds. No claim is
    # made about float32, where the two differ by rounding of the batch statistics.
    engine = digits_engine(mode="batch", model_name="resnet9", norm="sumbn", batch_labels=32)
    engine.model.double()
    x_double = engine.dataset.x_train.double()
    engine.dataset.x_train = engine.context.x_train = x_double  # this engine's own dataset
    reference = build_model("resnet9", engine.dataset.input_shape, 10, norm="bn").double()
    for seed in range(5):
        plan = engine.strategy.plan_epoch(engine.context, np.random.default_rng(seed))
        samples = plan.samples[plan.batch_starts[0] : plan.batch_starts[1]]
        clients = plan.clients[plan.batch_starts[0] : plan.batch_starts[1]]
        assert len(np.unique(clients)) > 1, "the batch must span several clients"
        _, sum_bn = batch_gradients(engine, samples, clients, fused=False)
        assert all(g.dtype == torch.float64 for g in sum_bn)
        reference.load_state_dict(engine.model.state_dict())
        reference.train().zero_grad()
        index = torch.as_tensor(samples)
        F.cross_entropy(
            reference(engine.dataset.x_train[index]), engine.dataset.y_train[index]
        ).backward()
        for ours, parameter in zip(sum_bn, reference.parameters()):
            exact = parameter.grad
            assert (ours - exact).abs().max() <= 1e-9 * exact.abs().max(), seed


def test_batch_epoch_counts_one_step_per_global_batch():
    engine = digits_engine(mode="batch", batch_labels=64, spec="iid", repeat_count=100)
    plan = engine.strategy.plan_epoch(engine.context, engine.epoch_rng(1))
    stats = engine.run_epoch(1)
    schedule_length = int(engine.strategy.repeats.sum())
    assert plan.skipped == 0  # 100 repeats: fewer than any label's count
    assert stats.steps == plan.steps == int(np.ceil(schedule_length / 64))
    assert stats.loss_count == len(plan.samples) == schedule_length


def test_batch_norm_models_never_see_a_global_batch_of_one():
    # 10 labels × 10 repeats = 100 entries in batches of 11: the last batch would hold one
    # sample, which ResNet-9's BatchNorm cannot normalise at its 1x1 layers
    engine = digits_engine(
        mode="batch", model_name="resnet9", norm="bn", spec="iid", batch_labels=11, repeat_count=10
    )
    stats = engine.run_epoch(1)
    assert (stats.steps, stats.loss_count) == (9, 100)
    with pytest.raises(ConfigError, match="--batch-labels 1 gives global batches of one"):
        digits_engine(mode="batch", model_name="resnet9", norm="bn", batch_labels=1)


@pytest.mark.parametrize("mode", ["single-sample", "batch"])
def test_by_default_an_exhausted_label_starts_a_new_pass(mode):
    # one client, 8 samples: label 0 twice, label 1 six times. Uniform repeats schedule
    # each label round(8 / 2) = 4 times, so label 0 runs out after two entries
    dataset, federation = client_data((8,), [[0, 0, 1, 1, 1, 1, 1, 1]])

    def epoch(strategy):
        engine = tiny_engine(strategy, dataset=dataset, federation=federation, mode=mode)
        return engine.run_epoch(1)

    # refill, the default: its third and fourth entries train its two samples again
    default = epoch(Stratify())
    assert (default.loss_count, default.skipped, default.reused) == (8, 0, 2)
    # --exhausted skip drops them
    skip = epoch(Stratify(exhausted="skip"))
    assert (skip.loss_count, skip.skipped, skip.reused) == (6, 2, 0)
