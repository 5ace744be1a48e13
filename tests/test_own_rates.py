"""Each method's default learning rate per (dataset family, mode), chosen on a validation
split by the committed ``defaults`` grids (docs/results/defaults-*.csv) and declared on
the method's card (``rates.tuned``), or stated untuned."""

import dataclasses
from pathlib import Path

import pytest

from stratify.algorithms import strategy_class
from stratify.card import UNTUNED, Identity
from stratify.config import TrainConfig, default_lr, resolve_lr
from stratify.errors import ConfigError
from stratify.reproduce.defaults import (
    TOLERANCE,
    Candidate,
    default_choices,
    defaults_table,
    read_results,
)
from stratify.reproduce.grids import GRIDS, Settings, plan_cells

FedAvg = strategy_class("fedavg")
RESULTS = sorted((Path(__file__).resolve().parents[1] / "docs" / "results").glob("defaults-*.csv"))


def committed_choices():
    return [choice for path in RESULTS for choice in default_choices(read_results(path))]


def test_each_method_s_default_is_within_the_tolerance_of_its_best_candidate():
    choices = committed_choices()
    assert choices, "no committed defaults results"
    for choice in choices:
        declared = choice.declared_lr
        found = choice.candidate(declared)
        assert found is not None, f"{choice.algorithm} {choice.mode}: {declared} not tried"
        assert choice.within_tolerance(declared), (
            f"{choice.algorithm} ({choice.family}, {choice.mode}): its default {declared} "
            f"scores {100 * found.score:.1f}%, the best ({choice.best.lr}) "
            f"{100 * choice.best.score:.1f}%"
        )


def test_each_method_declares_the_rate_the_rule_chooses():
    for choice in committed_choices():
        assert choice.declared_lr == choice.rule_lr, (choice.algorithm, choice.mode)
        assert strategy_class(choice.algorithm).card.rates.tuned_for(
            choice.family, choice.mode
        ) == (choice.rule_lr)


@pytest.mark.parametrize("grid, family", [("defaults", "digits"), ("defaults-mnist", "mnist")])
def test_each_family_s_file_covers_every_method_and_mode_of_its_grid(tmp_path, grid, family):
    cells, notes = plan_cells(GRIDS[grid], Settings(seeds=(0,)), tmp_path)
    planned = {(cell.config.algorithm, cell.config.mode) for cell in cells}
    (path,) = [path for path in RESULTS if path.name == f"defaults-{family}.csv"]
    measured = {(c.algorithm, c.mode) for c in default_choices(read_results(path))}
    # a method the grid has not chosen a rate for says so on its card (a method just
    # added, before its grid has run); every other one is in the committed file
    tuned = {
        (algorithm, mode)
        for algorithm, mode in planned
        if strategy_class(algorithm).card.rates.tuned_for(family, mode) is not None
    }
    assert measured == tuned
    # FedTAN alone is left out: it needs BatchNorm layers, which the simple CNN has none of
    assert [note.split(":")[0] for note in notes] == ["FedTAN (batch)"]


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


def test_the_table_signs_a_default_below_the_best_as_the_other_tables_do():
    # FedAvg's declared batch rate on digits is 0.1; here 0.03 scores 5 points more
    (row,) = [
        line
        for line in defaults_table(rows("fedavg", {0.03: 0.90, 0.1: 0.85})).splitlines()
        if line.startswith("| FedAvg")
    ]
    assert " | −5.0 | " in row and "-" not in row


def test_a_results_file_without_validation_is_refused():
    row = {"algorithm": "fedavg", "status": "finished", "last_mean_validation_accuracy": ""}
    with pytest.raises(ConfigError, match="no validation accuracy"):
        default_choices([row])


def test_a_run_stopped_in_its_first_epoch_scores_nothing():
    grid = rows("fedavg", {0.001: 0.5, 0.3: 0.9})
    for row in grid[2:]:  # rate 0.3: no epoch finished, nothing measured
        row.update(status="diverged", last_mean_validation_accuracy="", last_mean_accuracy="")
    choice = default_choices(grid)[0]
    assert choice.candidate(0.3) == Candidate(0.3, (0.0, 0.0), (0.0, 0.0), False)
    assert choice.best.lr == 0.001


def test_a_rate_chosen_for_a_method_is_not_inherited_by_its_variants():
    class Variant(FedAvg):
        card = FedAvg.card.derive(Identity("variant", "Variant"))

    own = FedAvg.card.rates.tuned_for("digits", "single-sample")
    assert own is not None
    assert FedAvg().lr_for("single-sample", family="digits") == own
    assert Variant().lr_for("single-sample", family="digits") is None  # the dataset's then
    assert Variant.card.rates.describe() == UNTUNED


def test_a_family_shares_its_rate_and_given_lr_wins(monkeypatch):
    rates = dataclasses.replace(FedAvg.card.rates, tuned={("mnist", "batch"): 0.123})
    monkeypatch.setattr(FedAvg, "card", dataclasses.replace(FedAvg.card, rates=rates))

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
    for (family, mode), lr in FedAvg.card.rates.tuned.items():
        assert f"{lr} on {family} ({mode})" in line
