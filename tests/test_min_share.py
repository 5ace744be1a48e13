"""The smallest share of a global batch (``--min-share``): the hold-back rule on hand-checked
plans, the default left bit-identical, the refusals (docs/flower.md, "Secure aggregation")."""

import numpy as np
import pytest
import torch

from stratify.config import TrainConfig
from stratify.data.datasets import load_digits
from stratify.errors import ConfigError
from stratify.experiment import build_experiment
from stratify.nn.models import build_model
from stratify.selection import Plan, hold_back_small_shares


def batch_plan(batches):
    """A batch plan from ``[[(sample, client), ...], ...]``, one list per global batch."""
    samples = [s for batch in batches for s, _ in batch]
    clients = [c for batch in batches for _, c in batch]
    starts = np.cumsum([0] + [len(batch) for batch in batches])
    return Plan("batch", np.array(samples), np.array(clients), 0, 0, starts)


def shares_of(plan):
    """Every global batch as ``{client: [samples]}``."""
    bounds = plan.batch_starts.tolist()
    out = []
    for start, stop in zip(bounds[:-1], bounds[1:]):
        shares = {}
        for sample, client in zip(plan.samples[start:stop], plan.clients[start:stop]):
            shares.setdefault(int(client), []).append(int(sample))
        out.append(shares)
    return out


def test_a_small_share_waits_for_the_clients_next_share():
    # batch 1: client 0 holds 3, client 1 holds 1; batch 2: client 1 holds 1 more, client 2
    # holds 2; batch 3: client 1 one more, client 2 one more
    plan = batch_plan(
        [
            [(0, 0), (1, 0), (2, 0), (10, 1)],
            [(11, 1), (20, 2), (21, 2), (3, 0)],
            [(12, 1), (22, 2)],
        ]
    )
    held = hold_back_small_shares(plan, 2)
    # by hand: batch 1 keeps client 0's 3, holds client 1's [10]; batch 2: client 1 has
    # [10, 11] (2, kept), client 2 [20, 21] kept, client 0 [3] held; batch 3: client 1 [12]
    # held, client 2 [22] held; end: 3 samples still held are dropped
    assert shares_of(held) == [{0: [0, 1, 2]}, {1: [10, 11], 2: [20, 21]}]
    assert held.skipped == 3
    assert all(len(share) >= 2 for batch in shares_of(held) for share in batch.values())


def test_a_batch_whose_every_share_is_held_back_is_no_step():
    plan = batch_plan([[(0, 0), (10, 1)], [(1, 0), (11, 1)]])
    held = hold_back_small_shares(plan, 2)
    assert held.steps == 1
    assert shares_of(held) == [{0: [0, 1], 1: [10, 11]}]
    assert held.skipped == 0


def test_min_share_one_returns_the_plan_itself():
    plan = batch_plan([[(0, 0), (10, 1)]])
    assert hold_back_small_shares(plan, 1) is plan


def digits_engine(**options):
    config = TrainConfig(
        dataset="digits",
        partition="dirichlet:0.5",
        clients=5,
        mode="batch",
        model="mlp",
        lr=0.1,
        seed=1,
        secure=False,
        options={"batch_labels": 32, **options},
    )
    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 10)
    return build_experiment(config, dataset=load_digits(), model=model).engine


def test_every_share_of_a_real_epoch_has_at_least_min_share_samples():
    engine = digits_engine(min_share=8)
    plan = engine.strategy.plan_epoch(engine.context, np.random.default_rng(0))
    sizes = [len(share) for batch in shares_of(plan) for share in batch.values()]
    assert min(sizes) >= 8
    # every sample is used at most once more than the plain plan would (no sample invented)
    plain = digits_engine().strategy.plan_epoch(engine.context, np.random.default_rng(0))
    assert len(plan.samples) + plan.skipped == len(plain.samples) + plain.skipped
    # the plain plan does have shares under 8: the rule changed something
    assert min(len(s) for batch in shares_of(plain) for s in batch.values()) < 8


def test_no_minimum_trains_bit_identically_to_the_plain_plan():
    # the default (None) never calls the rule: the weights after an epoch equal those of a
    # run whose min-share is 1 (the rule's identity), to the bit
    first, second = digits_engine(), digits_engine(min_share=1)
    first.run_epoch(1)
    second.run_epoch(1)
    for a, b in zip(first.model.parameters(), second.model.parameters()):
        assert torch.equal(a, b)
    third = digits_engine(min_share=8)
    third.run_epoch(1)
    assert not all(
        torch.equal(a, b) for a, b in zip(first.model.parameters(), third.model.parameters())
    )


@pytest.mark.parametrize(
    ("options", "mode", "line"),
    [
        ({"min_share": 65}, "batch", "--min-share 65 exceeds --batch-labels 64"),
        ({"min_share": 0}, "batch", "positive"),
        ({"min_share": 4}, "single-sample", "--min-share applies to --mode batch"),
    ],
)
def test_impossible_settings_are_refused_in_one_line(options, mode, line):
    with pytest.raises(ConfigError) as refused:
        TrainConfig(dataset="digits", mode=mode, secure=False, options=options)
    assert line in str(refused.value)
    assert "\n" not in str(refused.value)
