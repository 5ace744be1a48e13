"""Each method's default learning rate per (dataset family, mode), chosen on a validation
split by the committed ``defaults`` grids (docs/results/defaults-*.csv) and declared on
the method's own class."""

import pytest

from stratify.algorithms import strategy_class
from stratify.config import TrainConfig, default_lr, resolve_lr
from stratify.errors import ConfigError
from stratify.reproduce.defaults import TOLERANCE, default_choices

FedAvg = strategy_class("fedavg")


def rows(algorithm, scores, paper_status="finished"):
    """A defaults grid's rows: per rate, two seeds scoring ``scores[lr]``."""
    return [
        {
            "algorithm": algorithm,
            "dataset": "digits",
            "mode": "batch",
            "lr": str(lr),
            "seed": str(seed),
            "status": paper_status if lr == 0.001 else "finished",
            "last_mean_validation_accuracy": str(score),
            "last_mean_accuracy": str(score),
        }
        for lr, score in scores.items()
        for seed in (0, 1)
    ]


def test_a_paper_s_rate_stays_only_within_the_tolerance_of_the_best():
    # FedBSS's paper fixes 1e-3
    near = default_choices(rows("fedbss", {0.001: 0.80, 0.01: 0.80 + TOLERANCE / 2}))[0]
    assert (near.paper_lr, near.best.lr, near.rule_lr) == (0.001, 0.01, 0.001)
    far = default_choices(rows("fedbss", {0.001: 0.50, 0.01: 0.80}))[0]
    assert far.rule_lr == 0.01 and not far.within_tolerance(0.001)
    # a rate whose run stopped on a non-finite loss is never the best
    diverged = default_choices(rows("fedbss", {0.001: 0.9, 0.01: 0.8}, "diverged"))[0]
    assert diverged.best.lr == 0.01 and diverged.rule_lr == 0.01
    # a method without a paper's rate takes the best
    assert default_choices(rows("fedavg", {0.001: 0.7, 0.01: 0.8}))[0].rule_lr == 0.01


def test_a_results_file_without_validation_is_refused():
    with pytest.raises(ConfigError, match="no validation accuracy"):
        default_choices([{"algorithm": "fedavg", "last_mean_validation_accuracy": ""}])


def test_a_rate_chosen_for_a_method_is_not_inherited_by_its_variants():
    class Variant(FedAvg):
        name = "variant"

    own = FedAvg.own_rates()["digits", "single-sample"]
    assert FedAvg().lr_for("single-sample", "digits") == own
    assert Variant().lr_for("single-sample", "digits") is None  # the dataset's then


def test_a_family_shares_its_rate_and_given_lr_wins(monkeypatch):
    monkeypatch.setattr(FedAvg, "own_lrs", {("mnist", "batch"): 0.123})

    def lr(**values):
        return resolve_lr(TrainConfig(secure=False, algorithm="fedavg", mode="batch", **values))

    for dataset in ("mnist-10k", "mnist", "rotated-mnist", "colored-mnist"):
        assert lr(dataset=dataset) == 0.123, dataset
    assert lr(dataset="mnist-10k", lr=0.003) == 0.003
    assert lr(dataset="fashion-mnist") == default_lr("fashion-mnist", "batch")


def test_stratify_algorithms_shows_the_own_rates(capsys):
    from stratify.cli.main import main

    main(["methods", "--markdown"])
    line = next(row for row in capsys.readouterr().out.splitlines() if row.startswith("| `fedavg`"))
    for (family, mode), lr in FedAvg.own_rates().items():
        assert f"{lr} on {family} ({mode})" in line
