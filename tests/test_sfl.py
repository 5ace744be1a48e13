"""SFL (baselines/sfl.py): a round is the clients trained one after another."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from engines import linear, mlp, tiny_engine

from stratify.baselines.sfl import SFL


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
    assert batch.card.rates.schedule == "constant" and batch.lr_for("batch") is None
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
