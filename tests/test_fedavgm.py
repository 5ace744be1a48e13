"""FedAvgM (baselines/fedavgm.py): the server momentum step, by hand and against FedAvg."""

import torch
from engines import linear, mlp, tiny_engine

from stratify.baselines.fedavg import FedAvg
from stratify.baselines.fedavgm import FedAvgM, server_momentum_step


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
