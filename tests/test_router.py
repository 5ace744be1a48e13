"""The router's execution paths: single-sample hops, global batches (fused vs explicit), counts."""

import copy

import numpy as np
import torch
import torch.nn.functional as F

from stratify.data.datasets import load_digits
from stratify.data.partition import partition
from stratify.federation import Federation
from stratify.nn.models import build_model, model_bytes
from stratify.registry import PlainRegistry
from stratify.router import Router
from stratify.selection import Plan
from stratify.strategy import Stratify


def digits_router(
    mode="single-sample", model_name="cnn", norm="bn", spec="dirichlet:0.5", **options
):
    dataset = load_digits()
    labels = dataset.train_labels
    federation = Federation(partition(labels, 5, spec, seed=1), labels)
    registry = PlainRegistry(seed=1).register(federation.label_counts())
    torch.manual_seed(0)
    model = build_model(model_name, dataset.input_shape, dataset.num_classes, norm=norm)
    return Router(
        model, dataset, federation, registry, Stratify(**options), mode=mode, lr=0.05, seed=1
    )


def test_single_sample_plan_equals_hand_written_sgd():
    router = digits_router()
    plan = router.strategy.plan_epoch(router, np.random.default_rng(0))
    samples = plan.samples[:50]
    reference = copy.deepcopy(router.model)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05)
    for index in samples.tolist():
        optimizer.zero_grad()
        x = router.dataset.x_train[index].unsqueeze(0)
        y = router.dataset.y_train[index].unsqueeze(0)
        F.cross_entropy(reference(x), y).backward()
        optimizer.step()
    router.execute_single_sample(samples)
    for ours, theirs in zip(router.model.parameters(), reference.parameters()):
        assert torch.allclose(ours, theirs, atol=1e-6)
    assert router.stats.steps == 50


def test_plan_traffic_is_counted():
    router = digits_router()
    plan = Plan(np.array([0, 1, 2, 3]), np.array([0, 0, 3, 0]), None, skipped=2)
    router.execute_plan(plan)
    assert router.stats.transfers == 3
    assert router.stats.bytes_sent == 3 * model_bytes(router.model)
    assert router.stats.skipped == 2


def batch_gradients(router, samples, clients, fused):
    router.optimizer.zero_grad(set_to_none=False)
    loss = router.accumulate_batch_gradient(samples, clients, fused=fused)
    return loss, [p.grad.clone() for p in router.model.parameters()]


def test_batch_explicit_and_fused_paths_give_same_gradients():
    router = digits_router(mode="batch", batch_labels=48)
    plan = router.strategy.plan_epoch(router, np.random.default_rng(3))
    start, stop = plan.batch_starts[0], plan.batch_starts[1]
    samples, clients = plan.samples[start:stop], plan.clients[start:stop]
    assert len(np.unique(clients)) > 1, "the test needs a batch spread over several clients"
    fused_loss, fused = batch_gradients(router, samples, clients, fused=True)
    explicit_loss, explicit = batch_gradients(router, samples, clients, fused=False)
    assert np.isclose(fused_loss, explicit_loss, rtol=1e-5)
    for a, b in zip(fused, explicit):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)
    # and both equal the gradient of the mean loss over the union batch
    union = copy.deepcopy(router.model)
    index = torch.as_tensor(samples)
    F.cross_entropy(union(router.dataset.x_train[index]), router.dataset.y_train[index]).backward()
    for a, parameter in zip(fused, union.parameters()):
        assert torch.allclose(a, parameter.grad, atol=1e-6, rtol=1e-4)


def test_sumbn_global_batch_matches_batchnorm_on_union():
    router = digits_router(mode="batch", model_name="resnet9", norm="sumbn", batch_labels=32)
    plan = router.strategy.plan_epoch(router, np.random.default_rng(4))
    samples = plan.samples[plan.batch_starts[0] : plan.batch_starts[1]]
    clients = plan.clients[plan.batch_starts[0] : plan.batch_starts[1]]
    assert len(np.unique(clients)) > 1
    _, sum_bn = batch_gradients(router, samples, clients, fused=False)
    # reference: nn.BatchNorm on the union batch, in float64. (torch's float32 CPU
    # BatchNorm is itself off by up to 1% here on one thread — 8x8 inputs leave 1x1 maps
    # in the last stage — while the sum-based layer, which accumulates in float64, is
    # within 1e-5 of the float64 reference.)
    reference = build_model("resnet9", router.dataset.input_shape, 10, norm="bn")
    reference.load_state_dict(router.model.state_dict())
    reference.double().train()
    index = torch.as_tensor(samples)
    F.cross_entropy(
        reference(router.dataset.x_train[index].double()), router.dataset.y_train[index]
    ).backward()
    for ours, parameter in zip(sum_bn, reference.parameters()):
        exact = parameter.grad
        assert (ours.double() - exact).abs().max() <= 1e-4 * exact.abs().max()


def test_batch_epoch_counts_one_step_per_global_batch():
    router = digits_router(mode="batch", batch_labels=64, spec="iid", repeat_count=100)
    plan = router.strategy.plan_epoch(router, router.epoch_rng(1))
    stats = router.run_epoch(1)
    schedule_length = int(router.strategy.label_repeats.sum())
    assert plan.skipped == 0  # 100 repeats: fewer than any label's count
    assert stats.steps == plan.steps == int(np.ceil(schedule_length / 64))
    assert stats.loss_count == len(plan.samples) == schedule_length
    assert stats.transfers == plan.transfers
    assert stats.bytes_sent == plan.transfers * (router.model_bytes + router.gradient_bytes)
