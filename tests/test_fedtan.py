"""FedTAN (baselines/fedtan.py): shared BatchNorm statistics across the clients."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from engines import CLASSES, FEATURES, bn_input, bn_mlp, mlp, tiny_engine
from torch import nn

from stratify.baselines.fedtan import FedTAN, StatisticsExchange
from stratify.errors import ConfigError
from stratify.nn.norm import SumBatchNorm, client_split


def fedtan(**options):
    """FedTAN with plain SGD, so a step can be checked by hand."""
    return FedTAN(**{"local_momentum": 0.0, "local_weight_decay": 0.0, **options})


def test_fedtan_bn_statistics_follow_the_official_code():
    # unequal clients (3 and 5 samples), one shared step: the global mean is the
    # unweighted mean of the client means; the variance the unweighted mean of each
    # client's variance around that global mean
    engine = tiny_engine(fedtan(local_batch_size=8), bn_mlp(), sizes=(3, 5))
    start = copy.deepcopy(engine.model)
    inputs = [
        bn_input(start, engine.dataset.x_train[engine.federation.client_indices[client]])
        for client in (0, 1)
    ]
    mean = (inputs[0].mean(0) + inputs[1].mean(0)) / 2
    var = sum((h - mean).square().mean(0) for h in inputs) / 2
    union = torch.cat(inputs)
    assert not torch.allclose(mean, union.mean(0), atol=1e-3)  # unequal shares: not union BN
    stats = engine.run_epoch(1)
    bn = engine.model[1]
    assert torch.allclose(bn.running_mean.double(), 0.1 * mean, atol=1e-6)
    assert torch.allclose(bn.running_var.double(), 0.9 + 0.1 * var * 8 / 7, atol=1e-6)
    assert int(bn.num_batches_tracked) == 1
    assert stats.steps == 2 and stats.transfers == 4


@pytest.mark.parametrize("reference_norm", ["nn.BatchNorm1d", "sumbn-client-mean"])
def test_fedtan_shared_step_is_batchnorm_on_the_union_for_equal_batches(reference_norm):
    # 4 samples each, different labels: the average of the clients' models after the
    # shared step equals one step on Σ_k L_k through BatchNorm on the union batch, and
    # through FedTAN's own layer (client-mean over the split); the gradient reaches every
    # client through the shared statistics
    lr = 0.3
    engine = tiny_engine(fedtan(local_batch_size=4), bn_mlp(), sizes=(4, 4), lr=lr)
    norm = (
        None
        if reference_norm == "nn.BatchNorm1d"
        else SumBatchNorm(6, dims=1, combine="client-mean")
    )
    reference = bn_mlp(norm=norm)
    reference.load_state_dict(engine.model.state_dict())
    rng = np.random.default_rng([0, 1])
    orders = [rng.permutation(ix) for ix in engine.federation.client_indices]
    x, y = engine.dataset.x_train, engine.dataset.y_train
    with client_split(reference, [4, 4]):
        logits = reference(torch.cat([x[order] for order in orders]))
    targets = torch.cat([y[order] for order in orders])
    loss = F.cross_entropy(logits[:4], targets[:4]) + F.cross_entropy(logits[4:], targets[4:])
    loss.backward()
    engine.run_epoch(1)
    for (name, ours), theirs in zip(engine.model.named_parameters(), reference.parameters()):
        expected = theirs.detach() - lr / 2 * theirs.grad
        assert torch.allclose(ours, expected, atol=1e-6), name
    for key in ("running_mean", "running_var"):
        assert torch.allclose(getattr(engine.model[1], key), getattr(reference[1], key), atol=1e-6)


def test_fedtan_shares_statistics_only_in_the_first_step_of_a_round():
    engine = tiny_engine(fedtan(local_epochs=2, local_batch_size=2), bn_mlp(), sizes=(4, 6))
    calls = []
    original = StatisticsExchange.average

    def counting(self, key, slot, value, count):
        calls.append(key)
        return original(self, key, slot, value, count)

    StatisticsExchange.average = counting
    try:
        stats = engine.run_epoch(1)
    finally:
        StatisticsExchange.average = original
    # client 0: 2 epochs × ceil(4/2) = 4 steps, client 1: 2 × ceil(6/2) = 6; one is shared
    assert stats.steps == 4 + 6
    assert stats.loss_count == 2 * (4 + 6)
    # one BN layer: mean and variance exchanged once by each of the 2 clients
    assert sorted(calls) == [(0, "mean"), (0, "mean"), (0, "var"), (0, "var")]
    assert all(torch.isfinite(p).all() for p in engine.model.parameters())
    # the BN forwards are restored on the global model (no lockstep hooks leak)
    assert "forward" not in engine.model[1].__dict__


def test_fedtan_defaults_are_its_official_codes_local_sgd():
    # FedTANOptions' docstring: batch 128, momentum 0.9, weight decay 1e-4, batch mode only
    strategy = tiny_engine(FedTAN(), bn_mlp(), sizes=(4, 4), mode="batch").strategy
    options = strategy.options
    assert (options.local_batch_size, options.local_momentum) == (128, 0.9)
    assert (options.local_weight_decay, options.local_epochs) == (1e-4, 1)
    assert FedTAN.card.identity.modes == ("batch",) and strategy.card.rates.schedule == "constant"


def test_fedtan_refuses_models_without_batch_norm():
    with pytest.raises(ConfigError, match="BatchNorm"):
        tiny_engine(FedTAN(), mlp())


def test_fedtan_error_in_one_client_is_raised_not_deadlocked():
    # batches of one on BatchNorm1d: every client variance is zero, a clear error
    engine = tiny_engine(FedTAN(local_batch_size=1), bn_mlp(), sizes=(3, 5))
    with pytest.raises(ConfigError, match="one value per channel"):
        engine.run_epoch(1)


class FailsOnBatchOf(nn.Module):
    def __init__(self, size):
        super().__init__()
        self.size = size

    def forward(self, x):
        if x.shape[0] == self.size:
            raise ValueError("client failure before the BN exchange")
        return x


def test_fedtan_failure_of_one_client_releases_the_others():
    torch.manual_seed(0)
    model = nn.Sequential(
        FailsOnBatchOf(6), nn.Linear(FEATURES, 6), nn.BatchNorm1d(6), nn.Linear(6, CLASSES)
    )
    engine = tiny_engine(FedTAN(local_batch_size=8), model, sizes=(4, 6))
    with pytest.raises(ValueError, match="client failure"):
        engine.run_epoch(1)
