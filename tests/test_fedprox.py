"""FedProx (baselines/fedprox.py): the proximal term and its local steps, by hand."""

import numpy as np
import pytest
import torch
from engines import ce_gradient, linear, mlp, numpy_params, tiny_engine
from engines import client_arrays as client_data

from stratify.baselines.fedavg import FedAvg
from stratify.baselines.fedprox import FedProx, add_proximal_gradient, proximal_term


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
