"""Local training on a client (stratify/client.py): mini-batch bounds and the loss it
minimises."""

import numpy as np
import torch
from engines import bn_mlp, mlp, tiny_engine

from stratify.baselines.fedavg import FedAvg


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
