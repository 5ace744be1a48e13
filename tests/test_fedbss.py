"""FedBSS: uncertainty, split point, cosine pacing, warm-up, and runs end to end."""

import json

import numpy as np
import pytest
import torch
from conftest import assert_refused_in_one_line
from torch import nn

from stratify.algorithms import strategy_class
from stratify.baselines.fedbss import (
    FedBSS,
    paced_count,
    paced_epochs,
    pacing,
    split_by_uncertainty,
    uncertainty,
)
from stratify.cli.main import main
from stratify.client import LocalTrainer
from stratify.config import TrainConfig
from stratify.data.datasets import Dataset
from stratify.errors import ConfigError
from stratify.experiment import build_experiment
from stratify.federation import Federation
from stratify.registry import PlainRegistry
from stratify.reproduce.grids import Column, Grid, Row, Settings, plan_cells
from stratify.reproduce.tuning import Tuning, tuning_specs
from stratify.run import Run

# -- the defining pieces, by hand -------------------------------------------------------------


def test_pacing_for_ten_local_epochs():
    # (1 − cos(π e / 10)) / 2 for e = 1..10, from cos 18°, 36°, 54°, 72°, 90°, ...
    expected = [0.0245, 0.0955, 0.2061, 0.3455, 0.5, 0.6545, 0.7939, 0.9045, 0.9755, 1.0]
    assert [round(pacing(e, 10), 4) for e in range(1, 11)] == expected
    assert pacing(10, 10) == 1.0  # the last epoch trains on every biased sample


def test_paced_count_rounds_down_and_survives_floating_point():
    assert pacing(5, 10) < 0.5  # 0.49999999999999994: a plain floor would lose a sample
    assert paced_count(pacing(5, 10), 2) == 1
    # ⌊α_e · 10⌋ for E = 10
    assert [paced_count(pacing(e, 10), 10) for e in range(1, 11)] == [0, 0, 2, 3, 5, 6, 7, 9, 9, 10]
    assert paced_count(1.0, 0) == 0


def test_uncertainty_is_one_minus_the_probability_spread():
    probabilities = torch.tensor([[0.7, 0.2, 0.1], [1 / 3, 1 / 3, 1 / 3], [1.0, 0.0, 0.0]])
    torch.testing.assert_close(uncertainty(probabilities), torch.tensor([0.4, 1.0, 0.0]))


def test_split_point_is_the_most_uncertain_sample_in_loss_order():
    losses = np.array([0.9, 0.1, 0.5, 2.0, 0.3])
    uncertainties = np.array([0.8, 0.1, 0.9, 0.2, 0.3])
    # ascending loss: samples 1, 4, 2, 0, 3; the most uncertain is sample 2 (loss 0.5)
    unbiased, biased = split_by_uncertainty(losses, uncertainties)
    assert unbiased.tolist() == [1, 4, 2] and biased.tolist() == [0, 3]


def test_split_ties_and_an_empty_biased_set():
    # two samples equally most uncertain: the split point is the lower-loss one (sample 4)
    losses = np.array([0.9, 0.1, 0.5, 2.0, 0.3])
    unbiased, biased = split_by_uncertainty(losses, np.array([0.9, 0.1, 0.2, 0.2, 0.9]))
    assert unbiased.tolist() == [1, 4] and biased.tolist() == [2, 0, 3]
    # a sample with the split point's loss is unbiased too; equal losses keep their order
    losses = np.array([0.5, 0.1, 0.5, 0.5, 0.7])
    unbiased, biased = split_by_uncertainty(losses, np.array([0.0, 0.0, 0.9, 0.0, 0.0]))
    assert unbiased.tolist() == [1, 0, 2, 3] and biased.tolist() == [4]
    # the most uncertain sample has the highest loss: nothing is biased
    unbiased, biased = split_by_uncertainty(np.array([0.2, 0.9, 0.4]), np.array([0.1, 0.5, 0.3]))
    assert unbiased.tolist() == [0, 2, 1] and biased.tolist() == []
    assert [part.tolist() for part in paced_epochs(unbiased, biased, 3)] == [[0, 2, 1]] * 3


def test_paced_epochs_add_the_lowest_loss_biased_samples_first():
    unbiased, biased = np.array([1, 4, 2]), np.array([0, 3])
    # E = 4: α = 0.146, 0.5, 0.854, 1 → 0, 1, 1, 2 of the 2 biased samples
    epochs = [part.tolist() for part in paced_epochs(unbiased, biased, 4)]
    assert epochs == [[1, 4, 2], [1, 4, 2, 0], [1, 4, 2, 0], [1, 4, 2, 0, 3]]


def test_local_trainer_takes_one_array_of_samples_per_epoch():
    x = torch.arange(6, dtype=torch.float32)[:, None]
    y = torch.zeros(6, dtype=torch.long)
    seen = []

    def record(model, inputs, targets):
        seen.append(sorted(inputs[:, 0].long().tolist()))
        return model(inputs).sum() * 0.0

    trainer = LocalTrainer(x, y)
    per_epoch = [np.array([4, 1]), np.array([0, 5, 2])]
    result = trainer.train(
        nn.Linear(1, 2),
        per_epoch,
        epochs=2,
        batch_size=4,
        lr=0.1,
        rng=np.random.default_rng(0),
        loss_fn=record,
    )
    assert seen == [[1, 4], [0, 2, 5]]
    assert (result.steps, result.samples) == (2, 5)
    with pytest.raises(ValueError, match="2 arrays of indices for 3 local epochs"):
        trainer.train(
            nn.Linear(1, 2), per_epoch, epochs=3, batch_size=4, lr=0.1, rng=np.random.default_rng(0)
        )


# -- a round of the method ---------------------------------------------------------------------


class RecordingTrainer(LocalTrainer):
    """Local SGD that records the samples each call trains on in each local epoch."""

    def __init__(self, x, y):
        super().__init__(x, y)
        self.calls = []

    def train(self, model, indices, *, epochs, **kwargs):
        per_epoch = [indices] * epochs if isinstance(indices, np.ndarray) else indices
        self.calls.append([sorted(part.tolist()) for part in per_epoch])
        return super().train(model, indices, epochs=epochs, **kwargs)


#: client 0 (label 0): p of its four samples; client 1 (label 1): two samples
CLIENT_0 = [[0.9, 0.05, 0.05], [0.4, 0.3, 0.3], [0.2, 0.7, 0.1], [0.6, 0.2, 0.2]]
CLIENT_1 = [[0.1, 0.8, 0.1], [0.3, 0.35, 0.35]]


def logit_engine(strategy, client_0=CLIENT_0, lr=1e-6, norm=None):
    """Two clients whose inputs are the logits ``log p`` of an identity model, so each
    sample's loss and uncertainty can be read off its input (and, at the default lr, the
    model barely moves between rounds). ``norm`` follows the identity layer."""
    x = torch.log(torch.tensor([*client_0, *CLIENT_1]))
    y = torch.tensor([0, 0, 0, 0, 1, 1])
    dataset = Dataset("logits", x, y, x.clone(), y.clone(), 3)
    federation = Federation([np.arange(4), np.arange(4, 6)], y.numpy())
    identity = nn.Linear(3, 3)
    with torch.no_grad():
        identity.weight.copy_(torch.eye(3))
        identity.bias.zero_()
    model = identity if norm is None else nn.Sequential(identity, norm)
    trainer = RecordingTrainer(x, y)
    config = TrainConfig(
        algorithm="fedbss",
        mode="batch",
        epochs=3,
        lr=lr,
        secure=False,
        options={"warmup_rounds": strategy.options.warmup_rounds},
    )
    experiment = build_experiment(
        config,
        dataset=dataset,
        federation=federation,
        registry=PlainRegistry(seed=0),
        model=model,
        strategy=strategy,
        trainer=trainer,
    )
    return experiment.engine, trainer


def test_warm_up_rounds_train_on_everything_then_samples_are_paced():
    strategy = FedBSS(client_fraction=1.0, local_epochs=4, local_batch_size=2, warmup_rounds=1)
    engine, trainer = logit_engine(strategy)
    assert engine.run_epoch(1).info == {"stage": 1}
    assert trainer.calls == [[[0, 1, 2, 3]] * 4, [[4, 5]] * 4]  # warm-up: all samples
    trainer.calls.clear()
    assert engine.run_epoch(2).info["biased_share"] == 1 / 6  # sample 2 of the six, below
    # client 0 in ascending loss −log p_0: sample 0 (0.11), 3 (0.51), 1 (0.92), 2 (1.61);
    # their uncertainties 1 − (max p − min p): 0.15, 0.6, 0.9, 0.4 → the split point is
    # sample 1: unbiased {0, 3, 1}, biased {2}; E = 4 takes ⌊α_e · 1⌋ = 0, 0, 0, 1 of it.
    # client 1: sample 4 (loss 0.22, uncertainty 0.3), 5 (1.05, 0.95): nothing biased.
    assert trainer.calls == [
        [[0, 1, 3], [0, 1, 3], [0, 1, 3], [0, 1, 2, 3]],
        [[4, 5]] * 4,
    ]


def test_samples_are_scored_by_the_received_model_in_eval_mode():
    # a BatchNorm after the identity: in eval mode, with its initial running statistics
    # (mean 0, variance 1), it passes log p through (up to 1/sqrt(1 + 1e-5)), so the split
    # is the one worked out above; in train mode it would normalise client 0's four
    # samples by their own statistics and split them as unbiased {0, 3}, biased [1, 2]
    strategy = FedBSS(client_fraction=1.0, local_epochs=4, local_batch_size=2, warmup_rounds=0)
    engine, trainer = logit_engine(strategy, norm=nn.BatchNorm1d(3))
    engine.run_epoch(1)
    assert trainer.calls[0] == [[0, 1, 3], [0, 1, 3], [0, 1, 3], [0, 1, 2, 3]]


def test_the_lowest_loss_biased_samples_enter_first():
    # sample 1 now p = (0.3, 0.65, 0.05): loss 1.20, uncertainty 0.4
    client_0 = [CLIENT_0[0], [0.3, 0.65, 0.05], CLIENT_0[2], CLIENT_0[3]]
    strategy = FedBSS(client_fraction=1.0, local_epochs=4, local_batch_size=2, warmup_rounds=0)
    engine, trainer = logit_engine(strategy, client_0)
    stats = engine.run_epoch(1)
    # ascending loss: 0 (0.11), 3 (0.51), 1 (1.20), 2 (1.61); uncertainty 0.15, 0.6, 0.4,
    # 0.4 → split at sample 3: unbiased {0, 3}, biased [1, 2]; ⌊α_e · 2⌋ = 0, 1, 1, 2
    assert trainer.calls[0] == [[0, 3], [0, 1, 3], [0, 1, 3], [0, 1, 2, 3]]
    # reported: 2 of the 6 samples biased (client 1 has none); the received identity model
    # gets samples 0, 3 (label 0) and 4, 5 (label 1; 0.35 = 0.35 goes to the first class) right
    assert stats.info == {"stage": 2, "biased_share": 2 / 6, "scored_accuracy": 4 / 6}


def test_fedbss_averages_without_weights_and_counts_fedavg_traffic():
    strategy = FedBSS(client_fraction=1.0, local_epochs=1, local_batch_size=2, warmup_rounds=0)
    engine, _ = logit_engine(strategy, lr=0.5)
    context = engine.context
    context.epoch, context.lr = 1, 0.5
    rng = np.random.default_rng(0)
    (round_,) = strategy.configure_rounds(context, 1, rng)
    updates = strategy.fit(context, round_, rng)
    assert [update.num_samples for update in updates] == [4, 2]
    assert sum(update.stats.transfers for update in updates) == 4  # down and up, each
    new_state = strategy.aggregate(context, round_, updates)
    for key, value in new_state.items():
        # clients of 4 and 2 samples count alike (Alg. 1, line 12)
        torch.testing.assert_close(value, (updates[0].state[key] + updates[1].state[key]) / 2)
    assert not torch.equal(updates[0].state["weight"], updates[1].state["weight"])


# -- defaults, warm-up resolution, resume -------------------------------------------------------


def test_defaults_are_the_papers_and_the_docstring_cites_them():
    options = FedBSS().options.for_mode("batch")
    assert (options.local_epochs, options.local_batch_size) == (10, 64)
    assert (options.local_momentum, options.local_weight_decay) == (1e-4, 1e-5)
    assert (options.client_fraction, options.weighting) == (0.1, "equal")
    assert FedBSS().lr_for("batch") == 1e-3 and FedBSS.card.identity.modes == ("batch",)
    for cited in ("E = 10", "batch 64", "lr 1e-3", "momentum 1e-4", "weight decay 1e-5"):
        assert cited in FedBSS.__doc__
    assert "fraction 0.1" in FedBSS.__doc__ and "50 of 200" in FedBSS.__doc__


def digits_config(tmp_path, name, epochs, **options):
    return TrainConfig(
        dataset="digits",
        partition="dirichlet:0.5",
        clients=4,
        algorithm="fedbss",
        mode="batch",
        epochs=epochs,
        secure=False,
        lr=0.5,  # a run that learns: its test accuracy changes from round to round
        options={"local_epochs": 2, "client_fraction": 0.5, **options},
        out=str(tmp_path / name),
    )


def test_warm_up_is_a_number_of_rounds_the_papers_fifty_by_default():
    assert FedBSS().options.warmup_rounds == 50
    assert FedBSS(warmup_rounds=3).informative_epochs() == 5
    # the paper's 200 rounds fit; a shorter run must name its warm-up, in one line
    TrainConfig(algorithm="fedbss", mode="batch", epochs=200, secure=False)
    with pytest.raises(
        ConfigError, match=r"--warmup-rounds 50 is longer than the run \(--epochs 30"
    ):
        TrainConfig(algorithm="fedbss", mode="batch", epochs=30, secure=False)


def test_tuning_runs_warm_up_as_long_as_the_run_they_tune(tmp_path):
    # a 10-round grid cell with 6 warm-up rounds, tuned for 3 epochs: the tuning runs keep
    # the 6 warm-up rounds and last 6 + 2 = 8 rounds, so stage 2 is what gets tuned
    grid = Grid(
        "fedbss-tune",
        "test",
        {"dataset": "digits", "mode": "batch", "epochs": 10},
        (Row("iid", "IID", {"partition": "iid"}),),
        (Column("fedbss", "FedBSS", {"algorithm": "fedbss"}, {"warmup_rounds": 6}),),
    )
    cells, _ = plan_cells(grid, Settings(seeds=(0,), clients=4), tmp_path)
    specs = tuning_specs(cells, Tuning(factors=(1.0,), epochs=3), tmp_path)
    for spec in specs:
        assert spec.config.epochs == 8 and spec.config.validation > 0
        for config in (spec.config, cells[0].config):
            strategy = build_experiment(config).strategy
            assert strategy.options.warmup_rounds == 6


def read_metrics(path):
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k != "wall_seconds"} for row in rows]


def test_a_resumed_run_keeps_its_warm_up_and_reports_the_stages(tmp_path):
    # started for 4 rounds (warm-up 1), resumed to 8: the same rounds as 8 in one go
    Run(digits_config(tmp_path, "pieces", 4, warmup_rounds=1)).train()
    config = json.loads((tmp_path / "pieces" / "config.json").read_text())
    assert config["resolved"]["options"]["warmup_rounds"] == 1
    resumed = Run(digits_config(tmp_path, "pieces", 8, warmup_rounds=1), resume=True)
    assert resumed.strategy.options.warmup_rounds == 1
    summary = resumed.train()
    rows = read_metrics(tmp_path / "pieces")
    assert [row["info"]["stage"] for row in rows] == [1] + [2] * 7
    assert all(0 <= row["info"]["biased_share"] <= 1 for row in rows[1:])
    assert summary["method"]["warmup_rounds"] == 1
    # the warm model is the global model after round 1, not after round 2
    assert rows[0]["test_accuracy"] != rows[1]["test_accuracy"]
    assert summary["method"]["warm_test_accuracy"] == rows[0]["test_accuracy"]
    shares = [row["info"]["biased_share"] for row in rows[1:]]
    assert summary["method"]["biased_share_mean"] == pytest.approx(sum(shares) / 7)
    Run(digits_config(tmp_path, "straight", 8, warmup_rounds=1)).train()
    assert read_metrics(tmp_path / "pieces") == read_metrics(tmp_path / "straight")
    # and the run really depends on the warm-up: warming up 2 rounds gives other numbers
    Run(digits_config(tmp_path, "other", 8, warmup_rounds=2)).train()
    assert read_metrics(tmp_path / "other") != read_metrics(tmp_path / "straight")


def test_warm_up_longer_than_the_run_is_refused_before_any_data_is_read():
    with pytest.raises(ConfigError, match=r"--warmup-rounds 4 is longer than the run \(--epochs 3"):
        TrainConfig(
            dataset="no-such-files",
            algorithm="fedbss",
            mode="batch",
            epochs=3,
            secure=False,
            options={"warmup_rounds": 4},
        )


# -- command line --------------------------------------------------------------------------------

DIGITS = ["train", "--dataset", "digits", "--no-secure", "--algorithm", "fedbss"]


def test_fedbss_runs_end_to_end_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "run"
    main(
        [
            *DIGITS,
            "--mode",
            "batch",
            "--epochs",
            "2",
            "--local-epochs",
            "2",
            "--client-fraction",
            "0.5",
            "--warmup-rounds",
            "0",
            "--out",
            str(out),
        ]
    )
    summary = json.loads((out / "summary.json").read_text())
    rows = read_metrics(out)
    assert summary["algorithm"] == "fedbss" and len(rows) == 2
    assert summary["total_transfers"] == 2 * 5 * 2  # 2 rounds × 5 of 10 clients × (down + up)
    assert summary["distinct_clients_trained"] == len(
        set(rows[0]["clients_trained"]) | set(rows[1]["clients_trained"])
    )
    resolved = json.loads((out / "config.json").read_text())["resolved"]
    # its own rate on the digits (its paper's 1e-3 is far below the defaults grid's best)
    own = strategy_class("fedbss").card.rates.tuned["digits", "batch"]
    assert resolved["lr"] == own and resolved["options"]["warmup_rounds"] == 0
    assert all(np.isfinite(row["train_loss"]) for row in rows)


@pytest.mark.parametrize(
    "arguments, message",
    [
        ([], "--algorithm fedbss runs in --mode batch, not single-sample"),
        (["--mode", "batch", "--warmup-rounds", "-1"], "--warmup-rounds must be an integer >= 0"),
        (["--mode", "batch", "--epochs", "2"], "--warmup-rounds 50 is longer than the run"),
        (
            ["--mode", "batch", "--epochs", "2", "--warmup-rounds", "3"],
            "--warmup-rounds 3 is longer than the run (--epochs 2); give at most 2",
        ),
        (["--mode", "batch", "--local-epochs", "0"], "--local-epochs must be a positive integer"),
        (["--mode", "batch", "--client-fraction", "0"], "--client-fraction must be in (0, 1]"),
        (["--mode", "batch", "--weighting", "loss"], "unknown --weighting 'loss'"),
        (["--mode", "batch", "--margin", "0.1"], "--margin does not apply to --algorithm fedbss"),
    ],
)
def test_bad_fedbss_input_is_one_line(tmp_path, capsys, arguments, message):
    command = [*DIGITS, "--epochs", "1", "--out", str(tmp_path / "run"), *arguments]
    assert_refused_in_one_line(capsys, command, message, tmp_path / "run")
