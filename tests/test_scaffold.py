"""SCAFFOLD (baselines/scaffold.py): control variates and rounds replayed by hand."""

import numpy as np
import torch
from engines import ce_gradient, linear, numpy_params, tiny_engine
from engines import client_arrays as client_data

from stratify.baselines.scaffold import Scaffold, control_variate_update, scaffold_server_update


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


def test_server_step_weights_delta_y_by_the_weights_given_and_delta_c_by_none():
    t = torch.tensor
    arguments = dict(
        x={"p": t([1.0])},
        server_variate={"p": t([0.0])},
        delta_y=[{"p": t([0.4])}, {"p": t([0.0])}],
        delta_c=[{"p": t([0.2])}, {"p": t([0.6])}],
        server_lr=0.5,
        num_clients=4,
    )
    equal_x, equal_c = scaffold_server_update(**arguments)
    samples_x, samples_c = scaffold_server_update(**arguments, weights=[3.0, 1.0])
    assert torch.allclose(equal_x["p"], t([1.0 + 0.5 * 0.2]))  # the paper's mean Δy
    assert torch.allclose(samples_x["p"], t([1.0 + 0.5 * (3 * 0.4 + 0) / 4]))  # NIID-Bench's
    # c moves by (|S|/N)·mean Δc in both steps
    assert torch.allclose(equal_c["p"], t([0.5 * 0.4])) and torch.equal(
        equal_c["p"], samples_c["p"]
    )


def test_scaffold_default_server_step_is_the_papers():
    from stratify.baselines.scaffold import ScaffoldOptions

    assert ScaffoldOptions().weighting == "equal"


def test_weighting_samples_and_equal_are_different_runs_and_config_says_which(tmp_path):
    import json

    from stratify.cli.main import main

    runs = {}
    for weighting in ("samples", "equal"):
        out = tmp_path / weighting
        main(
            [
                "train", "--dataset", "digits", "--partition", "dirichlet:0.5", "--clients",
                "3", "--mode", "batch", "--model", "mlp", "--local-epochs", "1", "--epochs",
                "2", "--no-secure", "--algorithm", "scaffold", "--weighting", weighting,
                "--out", str(out),
            ]
        )  # fmt: skip
        config = json.loads((out / "config.json").read_text())
        assert config["resolved"]["options"]["weighting"] == weighting
        runs[weighting] = [
            json.loads(line)["train_loss"]
            for line in (out / "metrics.jsonl").read_text().splitlines()
        ]
    # the first round's local training starts from the same model; the server steps differ
    assert runs["samples"][0] == runs["equal"][0]
    assert runs["samples"][1] != runs["equal"][1]
