"""FedAvg's defining math (baselines/fedavg.py) on tiny models and hand-computable cases."""

import copy

import numpy as np
import pytest
import torch
from engines import bn_input, bn_mlp, ce_gradient, linear, numpy_params, tiny_engine
from engines import client_arrays as client_data

from stratify.baselines.fedavg import FedAvg
from stratify.baselines.fedavgm import FedAvgM
from stratify.baselines.fedprox import FedProx
from stratify.baselines.scaffold import Scaffold
from stratify.errors import ConfigError

# -- FedAvg -------------------------------------------------------------------------------


def test_fedavg_round_is_the_sample_weighted_average_of_local_gradient_steps():
    # local batch = whole client, 1 local epoch: each client takes one full-batch GD step
    engine = tiny_engine(
        FedAvg(local_batch_size=8, local_epochs=1, local_momentum=0.0),
        linear(),
        sizes=(3, 5),
        lr=0.5,
    )
    w0, b0 = numpy_params(engine.model)
    expected_w, expected_b = np.zeros_like(w0), np.zeros_like(b0)
    for client, share in ((0, 3 / 8), (1, 5 / 8)):
        gw, gb = ce_gradient(w0, b0, *client_data(engine, client))
        expected_w += share * (w0 - 0.5 * gw)
        expected_b += share * (b0 - 0.5 * gb)
    stats = engine.run_epoch(1)
    w1, b1 = numpy_params(engine.model)
    assert np.allclose(w1, expected_w, atol=1e-6) and np.allclose(b1, expected_b, atol=1e-6)
    assert stats.transfers == 4  # 2 clients, download + upload each
    assert stats.bytes_sent == 4 * engine.model_bytes
    assert stats.steps == 2


def test_equal_weighting_averages_the_clients_alike():
    engine = tiny_engine(
        FedAvg(local_batch_size=8, weighting="equal", local_epochs=1, local_momentum=0.0),
        linear(),
        sizes=(3, 5),
        lr=0.5,
    )
    w0, b0 = numpy_params(engine.model)
    expected_w, expected_b = np.zeros_like(w0), np.zeros_like(b0)
    for client in (0, 1):
        gw, gb = ce_gradient(w0, b0, *client_data(engine, client))
        expected_w += 0.5 * (w0 - 0.5 * gw)
        expected_b += 0.5 * (b0 - 0.5 * gb)
    engine.run_epoch(1)
    w1, b1 = numpy_params(engine.model)
    assert np.allclose(w1, expected_w, atol=1e-6) and np.allclose(b1, expected_b, atol=1e-6)


def test_local_momentum_and_weight_decay_reach_the_local_steps():
    # one client, full batch, 2 local epochs: v1 = g0 + λw0, w1 = w0 − η v1,
    # v2 = β v1 + g1 + λw1, w2 = w1 − η v2 (torch's SGD with dampening 0)
    lr, beta, decay = 0.3, 0.5, 0.01
    strategy = FedAvg(
        local_epochs=2, local_batch_size=8, local_momentum=beta, local_weight_decay=decay
    )
    engine = tiny_engine(strategy, linear(), sizes=(4,), lr=lr)
    w, b = numpy_params(engine.model)
    x, y = client_data(engine, 0)
    vw, vb = np.zeros_like(w), np.zeros_like(b)
    for _ in range(2):
        gw, gb = ce_gradient(w, b, x, y)
        vw, vb = beta * vw + gw + decay * w, beta * vb + gb + decay * b
        w, b = w - lr * vw, b - lr * vb
    engine.run_epoch(1)
    w1, b1 = numpy_params(engine.model)
    assert np.allclose(w1, w, atol=1e-6) and np.allclose(b1, b, atol=1e-6)


@pytest.mark.parametrize("method", [FedAvg, FedProx, Scaffold, FedAvgM])
def test_fedavg_family_defaults_are_niid_benchs_in_batch_mode(method):
    # FedAvgOptions' docstring: E = 10, batch 64, momentum 0.9, constant lr in batch mode;
    # batch of one, E = 1, no momentum in single-sample mode
    batch = tiny_engine(method(), linear(), mode="batch").strategy
    # SCAFFOLD keeps its paper's plain SGD: option II's variate assumes it (ScaffoldOptions)
    momentum = 0.0 if method is Scaffold else 0.9
    assert (batch.local_epochs, batch.batch_size, batch.local_momentum) == (10, 64, momentum)
    assert batch.card.rates.schedule == "constant"
    single = tiny_engine(method(), linear(), mode="single-sample").strategy
    assert (single.local_epochs, single.batch_size, single.local_momentum) == (1, 1, 0.0)
    # SCAFFOLD's weighting is its server step, the paper's (equal) by default
    weighting = "equal" if method is Scaffold else "samples"
    assert (batch.options.local_weight_decay, batch.options.weighting) == (0.0, weighting)
    if method is FedProx:
        assert batch.options.mu == 0.01


def test_fedavg_single_sample_mode_uses_batches_of_one():
    engine = tiny_engine(FedAvg(local_epochs=2), linear(), sizes=(3, 5), mode="single-sample")
    assert engine.strategy.batch_size == 1
    assert engine.run_epoch(1).steps == 2 * (3 + 5)
    with pytest.raises(ConfigError, match="single-sample"):
        tiny_engine(FedAvg(local_batch_size=4), linear(), mode="single-sample")


def test_client_fraction_samples_clients():
    engine = tiny_engine(
        FedAvg(client_fraction=0.5, local_epochs=1, local_momentum=0.0),
        linear(),
        sizes=(2, 2, 2, 2),
    )
    stats = engine.run_epoch(1)
    assert stats.transfers == 4 and stats.steps == 2


def test_batch_statistics_models_are_refused_in_single_sample_mode():
    with pytest.raises(ConfigError, match="use --norm gn \\(or none\\), or use --mode batch"):
        tiny_engine(FedAvg(), bn_mlp(), mode="single-sample")


def test_fedavg_local_steps_draw_k_batches_with_replacement_instead_of_epochs():
    strategy = FedAvg(local_steps=3, local_batch_size=4)
    engine = tiny_engine(strategy, linear(), sizes=(3, 5))
    stats = engine.run_epoch(1)
    # K = 3 mini-batches of 4 per client whatever its size: 3 steps, 12 samples each
    assert (stats.steps, stats.sample_gradients) == (2 * 3, 2 * 12)
    assert strategy.options.local_epochs is None
    assert strategy.planned_sample_gradients([3, 5]) == 2 * 12
    assert FedAvg(local_epochs=2).options.for_mode("batch").local_steps is None
    with pytest.raises(ConfigError, match="--local-epochs and --local-steps both"):
        FedAvg(local_epochs=2, local_steps=3).options.for_mode("batch")


# -- BN buffers ---------------------------------------------------------------------------


def test_bn_buffers_average_is_sample_weighted():
    engine = tiny_engine(
        FedAvg(local_batch_size=8, local_epochs=1, local_momentum=0.0), bn_mlp(), sizes=(3, 5)
    )
    start = copy.deepcopy(engine.model)
    expected_mean = torch.zeros(6, dtype=torch.float64)
    expected_var = torch.zeros(6, dtype=torch.float64)
    for client, share in ((0, 3 / 8), (1, 5 / 8)):
        h = bn_input(start, engine.dataset.x_train[engine.federation.client_indices[client]])
        expected_mean += share * 0.1 * h.mean(0)
        expected_var += share * (0.9 + 0.1 * h.var(0, unbiased=True))
    engine.run_epoch(1)
    bn = engine.model[1]
    assert torch.allclose(bn.running_mean.double(), expected_mean, atol=1e-6)
    assert torch.allclose(bn.running_var.double(), expected_var, atol=1e-6)
    assert int(bn.num_batches_tracked) == 1


@pytest.mark.parametrize("bn_buffers", ["average", "local"])
def test_bn_buffers_follow_equal_weighting_like_the_parameters(bn_buffers):
    # clients of 3 and 5 samples, each one full-batch step from running mean 0, var 1:
    # with --weighting equal the global statistics are the plain mean of the two clients'
    # (FedBSS, FedBR and FedDiverse weigh equally by default), whichever --bn-buffers
    strategy = FedAvg(
        local_batch_size=8,
        local_epochs=1,
        local_momentum=0.0,
        weighting="equal",
        bn_buffers=bn_buffers,
    )
    engine = tiny_engine(strategy, bn_mlp(), sizes=(3, 5))
    start = copy.deepcopy(engine.model)
    expected_mean = torch.zeros(6, dtype=torch.float64)
    expected_var = torch.zeros(6, dtype=torch.float64)
    for client in (0, 1):
        h = bn_input(start, engine.dataset.x_train[engine.federation.client_indices[client]])
        expected_mean += 0.5 * 0.1 * h.mean(0)
        expected_var += 0.5 * (0.9 + 0.1 * h.var(0, unbiased=True))
    engine.run_epoch(1)
    bn = engine.model[1]
    assert torch.allclose(bn.running_mean.double(), expected_mean, atol=1e-6)
    assert torch.allclose(bn.running_var.double(), expected_var, atol=1e-6)


def test_bn_buffers_local_stay_with_their_client():
    engine = tiny_engine(
        FedAvg(local_batch_size=8, bn_buffers="local", local_epochs=1, local_momentum=0.0),
        bn_mlp(),
        sizes=(3, 5),
    )
    engine.run_epoch(1)
    strategy = engine.strategy
    own = {k: strategy.client_buffers[k]["1.running_mean"].clone() for k in (0, 1)}
    assert not torch.allclose(own[0], own[1])
    # the global model evaluates with the sample-weighted average of the clients' buffers
    assert torch.allclose(engine.model[1].running_mean, (3 * own[0] + 5 * own[1]) / 8, atol=1e-6)
    # a client receives the global parameters but its own buffers
    received = strategy.receive(engine.context, 0)
    assert torch.equal(received[1].running_mean, own[0])
    assert torch.equal(received[0].weight, engine.model[0].weight)
    # and its statistics keep running from there
    start = copy.deepcopy(engine.model)
    engine.run_epoch(2)
    for client in (0, 1):
        h = bn_input(start, engine.dataset.x_train[engine.federation.client_indices[client]])
        expected = 0.9 * own[client].double() + 0.1 * h.mean(0)
        got = strategy.client_buffers[client]["1.running_mean"].double()
        assert torch.allclose(got, expected, atol=1e-6)


def test_bn_buffers_local_resume():
    strategy = FedAvg(bn_buffers="local", local_batch_size=8)
    tiny_engine(strategy, bn_mlp()).run_epoch(1)
    restored = FedAvg(bn_buffers="local", local_batch_size=8)
    tiny_engine(restored, bn_mlp())
    restored.load_state_dict(strategy.state_dict())
    for client in (0, 1):
        for key, value in strategy.client_buffers[client].items():
            assert torch.equal(restored.client_buffers[client][key], value)
