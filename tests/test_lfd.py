"""LfD: cosine classifier with margin, drift and auxiliary label, the local objective,
previous local models, resume, and runs end to end."""

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_refused_in_one_line
from engines import CLASSES, FEATURES, tiny_engine
from torch import nn

from stratify.baselines.common import participants
from stratify.baselines.lfd import (
    LfD,
    auxiliary_labels,
    drift,
    drift_regularised_loss,
    frozen_copy,
)
from stratify.cli.main import main
from stratify.config import TrainConfig
from stratify.data.datasets import Dataset
from stratify.errors import ConfigError
from stratify.experiment import build_experiment
from stratify.federation import Federation
from stratify.nn.cosine import CosineClassifier, margin_logits
from stratify.nn.models import MLP, model_bytes
from stratify.registry import PlainRegistry
from stratify.run import Run
from stratify.state import clone_state

# -- the defining pieces, by hand -------------------------------------------------------------


def test_drift_and_auxiliary_label_of_the_worked_example():
    previous = torch.log(torch.tensor([[0.8, 0.2]]))
    global_ = torch.log(torch.tensor([[0.6, 0.4]]))
    f_d = drift(previous, global_)
    # log(0.8/0.6) = 0.2877, log(0.2/0.4) = −0.6931
    torch.testing.assert_close(f_d, torch.tensor([[0.2877, -0.6931]]), atol=1e-4, rtol=0)
    # softmax(−f_D) ∝ (0.6/0.8, 0.4/0.2) = (0.75, 2) → (3/11, 8/11)
    torch.testing.assert_close(auxiliary_labels(f_d), torch.tensor([[3 / 11, 8 / 11]]))
    # logits are defined up to a constant per row: the drift is not
    torch.testing.assert_close(drift(previous + 5.0, global_ - 2.0), f_d)


def test_the_auxiliary_label_carries_no_gradient():
    logits = torch.randn(3, 4, requires_grad=True)
    label = auxiliary_labels(drift(logits, torch.zeros(3, 4)))
    assert not label.requires_grad


def test_cosine_classifier_by_hand():
    head = CosineClassifier(2, 2, temperature=0.1)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0]]))
    features = torch.tensor([[3.0, 4.0]])
    # û = (0.6, 0.8); Ŵ = (1, 0), (0, 1): cosines (0.6, 0.8), logits / τ = (6, 8), no bias
    torch.testing.assert_close(head.cosine(features), torch.tensor([[0.6, 0.8]]))
    torch.testing.assert_close(head(features), torch.tensor([[6.0, 8.0]]))
    assert [name for name, _ in head.named_parameters()] == ["weight"]
    assert list(head.state_dict()) == ["weight"]  # τ is a setting, it does not travel
    # Eq. 7 in training: the true class (1) loses the margin before the temperature
    training = margin_logits(head.cosine(features), torch.tensor([1]), 0.15, 0.1)
    torch.testing.assert_close(training, torch.tensor([[6.0, 6.5]]))
    # features and weights of any length give the same logits
    torch.testing.assert_close(head(10 * features), head(features))


def test_cosine_head_from_a_linear_layer_keeps_its_weights_and_drops_the_bias():
    linear = nn.Linear(3, 2)
    head = CosineClassifier.from_linear(linear, 0.5)
    assert torch.equal(head.weight, linear.weight) and head.temperature == 0.5
    with pytest.raises(ValueError, match="temperature must be > 0"):
        CosineClassifier(3, 2, 0.0)


def test_local_loss_is_eq_10_by_hand():
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 1.0]])
    targets = torch.tensor([0, 2])
    auxiliary = torch.tensor([[0.2, 0.5, 0.3], [0.6, 0.1, 0.3]])
    log_p = logits.log_softmax(dim=1)
    # Eq. 10: −(1 + ŷ_y) log σ_y for the true class, −ŷ_c log σ_c for the others
    by_hand = []
    for row, target in enumerate(targets.tolist()):
        total = 0.0
        for c in range(3):
            weight = auxiliary[row, c] + (1.0 if c == target else 0.0)
            total -= float(weight * log_p[row, c])
        by_hand.append(total)
    loss = drift_regularised_loss(logits, targets, auxiliary)
    assert math.isclose(float(loss), sum(by_hand) / 2, rel_tol=1e-6)
    # without an auxiliary label: cross-entropy
    torch.testing.assert_close(
        drift_regularised_loss(logits, targets, None), F.cross_entropy(logits, targets)
    )


# -- the method in a engine ---------------------------------------------------------------------


def lfd_model():
    torch.manual_seed(0)
    return MLP((FEATURES,), CLASSES, hidden=(5,))


def test_the_global_model_carries_the_cosine_head_and_it_is_what_travels():
    torch.manual_seed(0)
    plain = MLP((FEATURES,), CLASSES, hidden=(5,))
    linear_weight = plain.head.weight.detach().clone()
    engine = tiny_engine(
        LfD(local_epochs=1, cosine_temperature=0.2), lfd_model(), (6, 4), test_samples=5, epochs=3
    )
    model = engine.model
    assert isinstance(model.head, CosineClassifier) and model.head.temperature == 0.2
    assert torch.equal(model.head.weight, linear_weight)
    # the cosine head has no bias: CLASSES float32 fewer than the linear head
    assert engine.model_bytes == model_bytes(model) == model_bytes(plain) - CLASSES * 4
    stats = engine.run_epoch(1)
    assert stats.bytes_sent == stats.transfers * engine.model_bytes == 4 * engine.model_bytes
    # evaluation uses cos θ / τ, without the margin
    x, y = engine.dataset.x_test, engine.dataset.y_test
    with torch.no_grad():
        logits = model.head.cosine(model.embed(x)) / 0.2
    accuracy, loss = engine.evaluate()
    assert math.isclose(loss, float(F.cross_entropy(logits, y)), rel_tol=1e-5)
    assert accuracy == float((logits.argmax(1) == y).float().mean())


def test_first_round_is_margin_cross_entropy_then_the_drift_regulariser_joins():
    strategy = LfD(local_epochs=1, margin=0.15, cosine_temperature=0.1)
    engine = tiny_engine(strategy, lfd_model(), (6, 4), test_samples=5, epochs=3)
    context = engine.context
    x, y = context.x_train[:6], context.y_train[:6]
    model = frozen_copy(context.model)
    cosine = model.head.cosine(model.embed(x))
    objective = strategy.drift_objective(0, frozen_copy(context.model), frozen_copy(context.model))
    # a client that has never trained: cross-entropy of the margin logits only
    expected = F.cross_entropy(margin_logits(cosine, y, 0.15, 0.1), y)
    torch.testing.assert_close(objective(model, x, y), expected)

    engine.run_epoch(1)
    # every client keeps the model it uploaded
    assert sorted(strategy.previous_models) == [0, 1]
    previous = frozen_copy(context.model)
    previous.load_state_dict(strategy.previous_models[0])
    assert not torch.equal(previous.head.weight, context.model.head.weight)
    # round 2: ŷ from the stored model and the new global model, both without margin
    global_ = frozen_copy(context.model)
    objective = strategy.drift_objective(0, frozen_copy(context.model), frozen_copy(context.model))
    model = frozen_copy(context.model)
    cosine = model.head.cosine(model.embed(x))
    f_d = torch.log_softmax(previous(x), 1) - torch.log_softmax(global_(x), 1)
    label = torch.softmax(-f_d, 1)
    log_p = torch.log_softmax(margin_logits(cosine, y, 0.15, 0.1), 1)
    expected = F.nll_loss(log_p, y) - (label * log_p).sum(1).mean()
    torch.testing.assert_close(objective(model, x, y), expected)
    assert float(expected) > float(F.nll_loss(log_p, y))


def test_the_previous_local_model_is_the_one_the_client_uploaded():
    strategy = LfD(local_epochs=1)
    engine = tiny_engine(strategy, lfd_model(), (6, 4), test_samples=5, epochs=3)
    context = engine.context
    context.epoch, context.lr = 1, 0.1
    rng = np.random.default_rng(0)
    (round_,) = strategy.configure_rounds(context, 1, rng)
    received = clone_state(context.model.state_dict())
    updates = strategy.fit(context, round_, rng)
    assert sorted(strategy.previous_models) == [update.client for update in updates] == [0, 1]
    for update in updates:
        kept = strategy.previous_models[update.client]
        assert all(torch.equal(kept[key], update.state[key]) for key in received)
        # trained away from the global model it received, so next round's drift is not zero
        assert not torch.equal(kept["head.weight"], received["head.weight"])


def test_a_client_absent_from_a_round_keeps_its_older_model():
    strategy = LfD(local_epochs=1, client_fraction=0.5)
    engine = tiny_engine(strategy, lfd_model(), (6, 4, 5), test_samples=5, epochs=3)
    engine.run_epoch(1)
    first = {c: clone_state(state) for c, state in strategy.previous_models.items()}
    engine.run_epoch(2)
    # round(0.5 · 3) = 2 participants a round, drawn first from each round's generator
    second = set(participants(3, 0.5, engine.epoch_rng(2)).tolist())
    assert len(first) == 2 and set(first) - second  # someone sat round 2 out
    assert set(strategy.previous_models) == set(first) | second
    for client in first:
        state = strategy.previous_models[client]
        unchanged = all(torch.equal(state[k], first[client][k]) for k in state)
        assert unchanged == (client not in second), client


def test_lfd_needs_a_head_of_embed_model():
    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(FEATURES, CLASSES)

        def forward(self, x):
            return self.layer(x)

    x = torch.zeros(4, FEATURES)
    y = torch.zeros(4, dtype=torch.long)
    dataset = Dataset("tiny", x, y, x, y, CLASSES)
    federation = Federation([np.arange(4)], y.numpy())
    config = TrainConfig(algorithm="lfd", mode="batch", lr=0.1, secure=False)
    with pytest.raises(ConfigError, match=r"lfd needs a model computed as head\(embed\(x\)\)"):
        build_experiment(
            config,
            dataset=dataset,
            federation=federation,
            registry=PlainRegistry(seed=0),
            model=Plain(),
        )


# -- defaults, resume, command line -------------------------------------------------------------


def test_defaults_are_the_papers_and_the_docstring_cites_them():
    options = LfD().options.for_mode("batch")
    assert (options.cosine_temperature, options.margin) == (0.1, 0.15)
    assert (options.local_epochs, options.local_batch_size) == (10, 128)
    assert (options.local_momentum, options.local_weight_decay) == (0.9, 1e-5)
    assert (options.client_fraction, options.weighting) == (1.0, "samples")
    assert LfD().lr_for("batch") == 0.01 and LfD.card.identity.modes == ("batch",)
    for cited in ("τ = 0.1", "m = 0.15", "lr 0.01", "momentum 0.9", "weight", "batch 128"):
        assert cited in LfD.__doc__
    assert "decay 1e-5" in LfD.__doc__ and "E = 10" in LfD.__doc__


def digits_config(tmp_path, name, epochs):
    return TrainConfig(
        dataset="digits",
        partition="dirichlet:0.5",
        clients=4,
        algorithm="lfd",
        mode="batch",
        epochs=epochs,
        secure=False,
        options={"local_epochs": 1},
        out=str(tmp_path / name),
    )


def read_metrics(path):
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k != "wall_seconds"} for row in rows]


def test_resume_restores_the_previous_local_models(tmp_path):
    Run(digits_config(tmp_path, "straight", 3)).train()
    Run(digits_config(tmp_path, "pieces", 2)).train()
    resumed = Run(digits_config(tmp_path, "pieces", 3), resume=True)
    assert sorted(resumed.strategy.previous_models) == [0, 1, 2, 3]
    resumed.train()
    assert read_metrics(tmp_path / "pieces") == read_metrics(tmp_path / "straight")
    # without its previous models round 3 would train on cross-entropy alone: other numbers
    Run(digits_config(tmp_path, "forgetful", 2)).train()
    forgetful = Run(digits_config(tmp_path, "forgetful", 3), resume=True)
    forgetful.strategy.previous_models = {}
    forgetful.train()
    forgetful_rows = read_metrics(tmp_path / "forgetful")
    assert forgetful_rows[:2] == read_metrics(tmp_path / "straight")[:2]
    assert forgetful_rows[2] != read_metrics(tmp_path / "straight")[2]


DIGITS = ["train", "--dataset", "digits", "--no-secure", "--algorithm", "lfd"]


def test_lfd_runs_end_to_end_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "run"
    main([*DIGITS, "--mode", "batch", "--epochs", "2", "--local-epochs", "1", "--out", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    rows = read_metrics(out)
    assert summary["algorithm"] == "lfd" and len(rows) == 2
    assert summary["total_transfers"] == 2 * 10 * 2  # 2 rounds × 10 clients × (down + up)
    config = json.loads((out / "config.json").read_text())
    # its own rate on the digits (its paper's 0.01 scores 5.5 points below the best)
    assert config["resolved"]["lr"] == LfD.card.rates.tuned["digits", "batch"]
    assert config["resolved"]["options"]["margin"] == 0.15
    # the resolved model size is the cosine-headed model's (84 × 10 weights, no bias)
    assert rows[0]["bytes_sent"] == rows[0]["transfers"] * config["resolved"]["model_bytes"]
    assert all(np.isfinite(row["train_loss"]) for row in rows)


@pytest.mark.parametrize(
    "arguments, message",
    [
        ([], "--algorithm lfd runs in --mode batch, not single-sample"),
        (
            ["--mode", "batch", "--cosine-temperature", "0"],
            "--cosine-temperature must be a positive",
        ),
        (["--mode", "batch", "--cosine-temperature", "-1"], "--cosine-temperature must be a posit"),
        (["--mode", "batch", "--margin", "-0.1"], "--margin must be a non-negative finite number"),
        (["--mode", "batch", "--margin", "1.5"], "--margin must be in [0, 1], got"),
        (["--mode", "batch", "--local-batch-size", "0"], "--local-batch-size must be a positive"),
        (["--mode", "batch", "--warmup-rounds", "2"], "--warmup-rounds does not apply"),
    ],
)
def test_bad_lfd_input_is_one_line(tmp_path, capsys, arguments, message):
    command = [*DIGITS, "--epochs", "1", "--out", str(tmp_path / "run"), *arguments]
    assert_refused_in_one_line(capsys, command, message, tmp_path / "run")


def test_the_drift_weight_scales_the_regulariser_and_zero_leaves_the_margin_loss():
    # logits (0, ln 3): σ = (1/4, 3/4); true class 0; ŷ = (1/2, 1/2):
    # CE = ln 4, R = −(½ ln ¼ + ½ ln ¾) = ln 4 − ½ ln 3
    logits = torch.tensor([[0.0, math.log(3.0)]])
    targets = torch.tensor([0])
    auxiliary = torch.tensor([[0.5, 0.5]])
    ce, regulariser = math.log(4.0), math.log(4.0) - 0.5 * math.log(3.0)
    for weight in (0.0, 0.5, 1.0):
        loss = drift_regularised_loss(logits, targets, auxiliary, weight)
        assert loss.item() == pytest.approx(ce + weight * regulariser)
