"""The baselines' defining math on tiny models and hand-computable cases."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from engines import CLASSES, FEATURES, tiny_engine
from torch import nn

from stratify.baselines.common import participants, weighted_average
from stratify.baselines.fedavg import FedAvg
from stratify.baselines.fedavgm import FedAvgM, server_momentum_step
from stratify.baselines.fedprox import FedProx, add_proximal_gradient, proximal_term
from stratify.baselines.fedtan import FedTAN, StatisticsExchange
from stratify.baselines.scaffold import Scaffold, control_variate_update, scaffold_server_update
from stratify.baselines.sfl import SFL
from stratify.errors import ConfigError
from stratify.nn.norm import SumBatchNorm, client_split


def linear(seed=0):
    torch.manual_seed(seed)
    return nn.Linear(FEATURES, CLASSES)


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, 6), nn.ReLU(), nn.Linear(6, CLASSES))


def bn_mlp(seed=0, norm=None):
    torch.manual_seed(seed)
    layer = nn.BatchNorm1d(6) if norm is None else norm
    return nn.Sequential(nn.Linear(FEATURES, 6), layer, nn.ReLU(), nn.Linear(6, CLASSES))


def ce_gradient(weight, bias, x, y):
    """Gradient of the mean cross-entropy of a linear model, by hand (numpy, float64)."""
    logits = x @ weight.T + bias
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    return p.T @ x / len(y), p.mean(0)


def numpy_params(model):
    return model.weight.detach().double().numpy(), model.bias.detach().double().numpy()


def client_data(engine, client, order=None):
    indices = engine.federation.client_indices[client] if order is None else order
    x = engine.dataset.x_train[indices].double().numpy()
    return x, engine.dataset.y_train[indices].numpy()


# -- shared math ---------------------------------------------------------------------------


def test_weighted_average_by_hand():
    states = [
        {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)},
        {"w": torch.tensor([4.0, 8.0]), "n": torch.tensor(6)},
    ]
    average = weighted_average(states, [1, 2])
    assert torch.allclose(average["w"], torch.tensor([3.0, 6.0]))
    assert average["n"].dtype == torch.long and int(average["n"]) == 5


def test_participants_fraction():
    rng = np.random.default_rng(0)
    assert participants(10, 1.0, rng).tolist() == list(range(10))
    chosen = participants(10, 0.3, rng)
    assert len(chosen) == 3 and len(set(chosen.tolist())) == 3
    assert len(participants(10, 0.01, rng)) == 1


# -- FedAvg ----------------------------------------------------------------------------------


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
    assert batch.lr_schedule_for("batch") == "constant"
    single = tiny_engine(method(), linear(), mode="single-sample").strategy
    assert (single.local_epochs, single.batch_size, single.local_momentum) == (1, 1, 0.0)
    assert (batch.options.local_weight_decay, batch.options.weighting) == (0.0, "samples")
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


# -- BN buffers -----------------------------------------------------------------------------


def bn_input(model, x):
    return model[0](x).detach().double()


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


# -- FedProx ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["single-sample", "batch"])
def test_fedprox_with_mu_zero_equals_fedavg_bit_for_bit(mode):
    fedavg = tiny_engine(FedAvg(local_epochs=2), mlp(), mode=mode, sizes=(7, 9))
    fedprox = tiny_engine(FedProx(local_epochs=2, mu=0.0), mlp(), mode=mode, sizes=(7, 9))
    for epoch in (1, 2):
        fedavg.run_epoch(epoch)
        fedprox.run_epoch(epoch)
    for a, b in zip(fedavg.model.parameters(), fedprox.model.parameters()):
        assert torch.equal(a, b)
    assert not torch.equal(next(fedavg.model.parameters()), next(mlp().parameters()))


def test_proximal_term_and_its_gradient():
    w = torch.tensor([1.0, 3.0], requires_grad=True)
    anchor = torch.tensor([0.0, 1.0])
    value = proximal_term([w], [anchor], mu=0.5)
    value.backward()
    assert np.isclose(float(value.detach()), 0.25 * (1 + 4))
    assert torch.allclose(w.grad, 0.5 * (w.detach() - anchor))
    # the local steps add the term's gradient directly; it must be the same vector
    grad = torch.tensor([0.25, -1.0])
    w.grad = grad.clone()
    add_proximal_gradient([w], [anchor], mu=0.5)
    assert torch.allclose(w.grad, grad + torch.tensor([0.5, 1.0]))


def test_fedprox_local_steps_by_hand():
    # one client, two samples, batch of one: the 2nd step feels μ (w1 − w0)
    mu, lr = 2.0, 0.1
    engine = tiny_engine(FedProx(mu=mu), linear(), sizes=(2,), mode="single-sample", lr=lr)
    w, b = numpy_params(engine.model)
    w0, b0 = w.copy(), b.copy()
    order = np.random.default_rng([0, 1]).permutation(engine.federation.client_indices[0])
    for index in order:
        x, y = client_data(engine, 0, order=[index])
        gw, gb = ce_gradient(w, b, x, y)
        w, b = w - lr * (gw + mu * (w - w0)), b - lr * (gb + mu * (b - b0))
    engine.run_epoch(1)
    w1, b1 = numpy_params(engine.model)
    assert np.allclose(w1, w, atol=1e-6) and np.allclose(b1, b, atol=1e-6)


# -- FedAvgM ---------------------------------------------------------------------------------


def test_server_momentum_step_by_hand():
    def t(value):
        return {"p": torch.tensor([value], dtype=torch.float64)}

    x, v = server_momentum_step(t(1.0), t(0.6), t(0.2), momentum=0.5, server_lr=2.0)
    # Δ = 0.4, v = 0.5·0.2 + 0.4 = 0.5, x = 1 − 2·0.5 = 0
    assert torch.allclose(v["p"], t(0.5)["p"]) and torch.allclose(x["p"], t(0.0)["p"], atol=1e-12)


def test_fedavgm_without_momentum_equals_fedavg():
    fedavg = tiny_engine(FedAvg(), mlp(), mode="single-sample")
    fedavgm = tiny_engine(FedAvgM(server_momentum=0.0, server_lr=1.0), mlp(), mode="single-sample")
    for epoch in (1, 2, 3):
        fedavg.run_epoch(epoch)
        fedavgm.run_epoch(epoch)
    for a, b in zip(fedavg.model.parameters(), fedavgm.model.parameters()):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)


def test_fedavgm_momentum_accumulates_and_resumes():
    strategy = FedAvgM(server_momentum=0.5, server_lr=1.0)
    engine = tiny_engine(strategy, linear(), mode="single-sample")
    reference = tiny_engine(FedAvg(), linear(), mode="single-sample")
    x0 = engine.model.weight.detach().clone()
    engine.run_epoch(1)
    reference.run_epoch(1)
    # round 1: v = Δ, so x1 = average (= FedAvg's model)
    assert torch.allclose(engine.model.weight, reference.model.weight, atol=1e-7)
    assert torch.allclose(strategy.velocity["weight"], x0 - reference.model.weight, atol=1e-7)
    # resume: a fresh strategy with the saved state continues identically
    restored = FedAvgM(server_momentum=0.5, server_lr=1.0)
    resumed = tiny_engine(restored, linear(), mode="single-sample")
    resumed.model.load_state_dict(engine.model.state_dict())
    restored.load_state_dict(strategy.state_dict())
    engine.run_epoch(2)
    resumed.run_epoch(2)
    assert torch.equal(engine.model.weight, resumed.model.weight)


# -- SCAFFOLD --------------------------------------------------------------------------------


def test_control_variate_update_by_hand():
    t = torch.tensor
    new = control_variate_update(
        {"p": t([1.0])}, {"p": t([0.5])}, {"p": t([2.0])}, {"p": t([1.5])}, steps=5, lr=0.1
    )
    assert torch.allclose(new["p"], t([1.0 - 0.5 + 0.5 / (5 * 0.1)]))  # 1.5
    x, c = scaffold_server_update(
        {"p": t([1.0])},
        {"p": t([0.0])},
        [{"p": t([0.2])}],
        [{"p": t([0.4])}],
        server_lr=0.5,
        num_clients=4,
    )
    assert torch.allclose(x["p"], t([1.1])) and torch.allclose(c["p"], t([0.1]))


def test_scaffold_two_rounds_by_hand():
    # two clients, one sample each, batch of one, K = 1 step per round
    lr, server_lr = 0.2, 0.5
    strategy = Scaffold(server_lr=server_lr)
    engine = tiny_engine(strategy, linear(), sizes=(1, 1), mode="single-sample", lr=lr)
    w, b = numpy_params(engine.model)
    c = [np.zeros_like(w), np.zeros_like(b)]
    c_i = {k: [np.zeros_like(w), np.zeros_like(b)] for k in (0, 1)}
    for epoch in (1, 2):
        ys, new_c = [], {}
        for k in (0, 1):
            gw, gb = ce_gradient(w, b, *client_data(engine, k))
            yw = w - lr * (gw - c_i[k][0] + c[0])
            yb = b - lr * (gb - c_i[k][1] + c[1])
            new_c[k] = [c_i[k][0] - c[0] + (w - yw) / lr, c_i[k][1] - c[1] + (b - yb) / lr]
            ys.append((yw, yb))
        delta_c = [np.mean([new_c[k][j] - c_i[k][j] for k in (0, 1)], 0) for j in (0, 1)]
        w = w + server_lr * np.mean([yw - w for yw, _ in ys], 0)
        b = b + server_lr * np.mean([yb - b for _, yb in ys], 0)
        c = [c[j] + (2 / 2) * delta_c[j] for j in (0, 1)]
        c_i = new_c
        stats = engine.run_epoch(epoch)
        w1, b1 = numpy_params(engine.model)
        assert np.allclose(w1, w, atol=1e-6) and np.allclose(b1, b, atol=1e-6)
        assert np.allclose(strategy.server_variate["weight"].numpy(), c[0], atol=1e-5)
        for k in (0, 1):
            assert np.allclose(strategy.client_variates[k]["bias"].numpy(), c_i[k][1], atol=1e-5)
    # with K = 1 step, option II gives c_i = the client's gradient at the round's start
    assert stats.transfers == 4
    assert stats.bytes_sent == 4 * engine.model_bytes + 4 * engine.gradient_bytes


def test_scaffold_k_is_the_local_step_count_not_the_epoch_count():
    # E = 2 local epochs of mini-batches of 2: client 0 (3 samples) takes K = 4 steps,
    # client 1 (5 samples) K = 6; option II divides by K·η_l. Replayed by hand in float64
    # with the same per-epoch shuffles (the round's generator, client after client).
    lr, epochs, batch = 0.1, 2, 2
    strategy = Scaffold(
        local_epochs=epochs, local_batch_size=batch, local_momentum=0.0, server_lr=1.0
    )
    engine = tiny_engine(strategy, linear(), sizes=(3, 5), mode="batch", lr=lr)
    w, b = numpy_params(engine.model)
    c = [np.zeros_like(w), np.zeros_like(b)]
    c_i = {k: [np.zeros_like(w), np.zeros_like(b)] for k in (0, 1)}
    for epoch in (1, 2):
        rng = np.random.default_rng([0, epoch])
        ys, new_c, steps = [], {}, {}
        for k in (0, 1):
            yw, yb, steps[k] = w.copy(), b.copy(), 0
            for _ in range(epochs):
                order = rng.permutation(engine.federation.client_indices[k])
                for start in range(0, len(order), batch):
                    gw, gb = ce_gradient(
                        yw, yb, *client_data(engine, k, order[start : start + batch])
                    )
                    yw = yw - lr * (gw - c_i[k][0] + c[0])
                    yb = yb - lr * (gb - c_i[k][1] + c[1])
                    steps[k] += 1
            scale = 1.0 / (steps[k] * lr)
            new_c[k] = [c_i[k][0] - c[0] + (w - yw) * scale, c_i[k][1] - c[1] + (b - yb) * scale]
            ys.append((yw, yb))
        assert steps == {0: 4, 1: 6}
        delta_c = [np.mean([new_c[k][j] - c_i[k][j] for k in (0, 1)], 0) for j in (0, 1)]
        w = w + np.mean([yw - w for yw, _ in ys], 0)
        b = b + np.mean([yb - b for _, yb in ys], 0)
        c = [c[j] + delta_c[j] for j in (0, 1)]
        c_i = new_c
        stats = engine.run_epoch(epoch)
        assert stats.steps == 10
        w1, b1 = numpy_params(engine.model)
        assert np.allclose(w1, w, atol=1e-5) and np.allclose(b1, b, atol=1e-5)
        assert np.allclose(strategy.server_variate["weight"].numpy(), c[0], atol=1e-5)
        for k in (0, 1):
            assert np.allclose(strategy.client_variates[k]["weight"].numpy(), c_i[k][0], atol=1e-5)
            assert np.allclose(strategy.client_variates[k]["bias"].numpy(), c_i[k][1], atol=1e-5)


def test_scaffold_state_round_trip():
    strategy = Scaffold()
    tiny_engine(strategy, linear(), mode="single-sample").run_epoch(1)
    restored = Scaffold()
    tiny_engine(restored, linear(), mode="single-sample")
    restored.load_state_dict(strategy.state_dict())
    assert torch.equal(restored.server_variate["weight"], strategy.server_variate["weight"])
    assert sorted(restored.client_variates) == [0, 1]
    assert torch.equal(restored.client_variates[1]["bias"], strategy.client_variates[1]["bias"])


# -- SFL -------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["single-sample", "batch"])
def test_sfl_round_equals_training_clients_one_after_another(mode):
    sizes, lr, epochs = (3, 4, 5), 0.1, 2
    engine = tiny_engine(
        SFL(
            local_epochs=epochs,
            local_batch_size=None if mode != "batch" else 2,
            local_weight_decay=0.0,
        ),
        mlp(),
        sizes=sizes,
        mode=mode,
        lr=lr,
        seed=3,
    )
    batch_size = 1 if mode == "single-sample" else 2
    reference = copy.deepcopy(engine.model)
    optimizer = torch.optim.SGD(reference.parameters(), lr=lr)
    rng = np.random.default_rng([3, 1])
    order = rng.permutation(len(sizes))
    for client in order:
        for _ in range(epochs):
            shuffled = rng.permutation(engine.federation.client_indices[client])
            for start in range(0, len(shuffled), batch_size):
                batch = torch.as_tensor(shuffled[start : start + batch_size])
                loss = F.cross_entropy(
                    reference(engine.dataset.x_train[batch]), engine.dataset.y_train[batch]
                )
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    stats = engine.run_epoch(1)
    for ours, theirs in zip(engine.model.parameters(), reference.parameters()):
        assert torch.allclose(ours, theirs, atol=1e-7)
    assert stats.transfers == 2 * len(sizes)  # server -> c1 -> c2 -> c3 -> server, relayed
    assert stats.bytes_sent == 2 * len(sizes) * engine.model_bytes


def test_sfl_defaults_are_its_papers_plain_sgd_with_batch_20_and_weight_decay():
    # SFLOptions' docstring: momentum 0, weight decay 1e-4, batch 20, one pass, constant lr
    batch = tiny_engine(SFL(), linear(), mode="batch").strategy
    options = batch.options
    assert (options.local_epochs, options.local_batch_size) == (1, 20)
    assert (options.local_momentum, options.local_weight_decay) == (0.0, 1e-4)
    assert batch.lr_schedule_for("batch") == "constant" and batch.lr_for("batch") is None
    single = tiny_engine(SFL(), linear(), mode="single-sample").strategy
    assert single.options.local_batch_size == 1
    assert (
        tiny_engine(
            SFL(local_batch_size=8), linear(), mode="batch"
        ).strategy.options.local_batch_size
        == 8
    )


def test_sfl_order_is_random_each_round():
    engine = tiny_engine(SFL(), mlp(), sizes=(1,) * 6, mode="single-sample")
    orders = [
        list(engine.strategy.configure_rounds(engine.context, e, engine.epoch_rng(e)))[0].clients
        for e in (1, 2, 3)
    ]
    assert all(sorted(order.tolist()) == list(range(6)) for order in orders)
    assert len({tuple(order.tolist()) for order in orders}) > 1


# -- FedTAN ----------------------------------------------------------------------------------


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
    assert FedTAN.modes == ("batch",) and strategy.lr_schedule_for("batch") == "constant"


def test_fedtan_refuses_models_without_batch_norm():
    with pytest.raises(ConfigError, match="BatchNorm"):
        tiny_engine(FedTAN(), mlp())


def test_fedtan_error_in_one_client_is_raised_not_deadlocked():
    # batches of one on BatchNorm1d: every client variance is zero, a clear error
    engine = tiny_engine(FedTAN(local_batch_size=1), bn_mlp(), sizes=(3, 5))
    with pytest.raises(ConfigError, match="one value per channel"):
        engine.run_epoch(1)


# -- bad options (every registered method: tests/test_testing.py) --------------------------


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: FedAvg(local_epochs=0), "--local-epochs must be a positive integer"),
        (lambda: FedAvg(local_batch_size=-2), "--local-batch-size must be a positive integer"),
        (lambda: FedAvg(client_fraction=0.0), "--client-fraction must be in"),
        (lambda: FedAvg(client_fraction=1.5), "--client-fraction must be in"),
        (lambda: FedAvg(bn_buffers="drop"), "unknown --bn-buffers"),
        (lambda: FedProx(mu=-1), "--mu must be a non-negative"),
        (lambda: FedAvgM(server_momentum=1.0), "--server-momentum must be in"),
        (lambda: FedAvgM(server_lr=0), "--server-lr must be a positive"),
        (lambda: Scaffold(server_lr=-1), "--server-lr must be a positive"),
        (lambda: SFL(local_epochs=0), "--local-epochs must be a positive integer"),
        (lambda: FedTAN(local_batch_size=0), "--local-batch-size must be a positive integer"),
    ],
)
def test_bad_options_are_config_errors(build, message):
    with pytest.raises(ConfigError, match=message):
        build()


def test_batch_statistics_models_are_refused_in_single_sample_mode():
    with pytest.raises(ConfigError, match="use --norm gn \\(or none\\), or use --mode batch"):
        tiny_engine(FedAvg(), bn_mlp(), mode="single-sample")


def test_a_last_mini_batch_of_one_joins_the_previous_one_for_batch_norm_models():
    from stratify.client import batch_bounds

    assert batch_bounds(9, 4, merge_singleton=True) == [(0, 4), (4, 9)]
    assert batch_bounds(9, 4, merge_singleton=False) == [(0, 4), (4, 8), (8, 9)]
    assert batch_bounds(1, 4, merge_singleton=True) == [(0, 1)]
    assert batch_bounds(10, 4, merge_singleton=True) == [(0, 4), (4, 8), (8, 10)]
    # a client of 5 samples, batches of 4: BatchNorm would fail on the lone fifth sample
    strategy = FedAvg(local_batch_size=4, local_epochs=1, local_momentum=0.0)
    engine = tiny_engine(strategy, bn_mlp(), sizes=(5, 5))
    assert engine.run_epoch(1).steps == 2  # one merged batch of 5 per client
    plain = tiny_engine(FedAvg(local_batch_size=4, local_epochs=1), mlp(), sizes=(5, 5))
    assert plain.run_epoch(1).steps == 4  # without batch statistics nothing is merged


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


def test_local_trainer_minimises_the_given_loss_function():
    from stratify.client import LocalTrainer

    torch.manual_seed(0)
    x = torch.randn(8, 3)
    y = torch.zeros(8, dtype=torch.long)
    model = torch.nn.Linear(3, 2)
    seen = []

    def squared_bias(module, inputs, targets):
        seen.append(len(inputs))
        return (module.bias**2).sum()

    trainer = LocalTrainer(x, y)
    before = model.bias.detach().clone()
    weight = model.weight.detach().clone()
    result = trainer.train(
        model,
        np.arange(8),
        epochs=1,
        batch_size=4,
        lr=0.25,
        rng=np.random.default_rng(0),
        loss_fn=squared_bias,
    )
    # two steps of b <- b - 0.25 * 2b = b / 2 on the bias only: the custom loss was used
    torch.testing.assert_close(model.bias.detach(), before / 4)
    torch.testing.assert_close(model.weight.detach(), weight)
    assert seen == [4, 4] and result.steps == 2


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
