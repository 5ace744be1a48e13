"""Each method's own default learning rate where the dataset's default does not fit it,
chosen on a validation split by a committed grid (docs/results/defaults-digits.md)."""

import csv
import statistics
from collections import defaultdict
from pathlib import Path

from stratify.algorithms import strategy_class
from stratify.config import TrainConfig, default_lr, resolve_lr

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results" / "defaults-digits.csv"


def chosen_rates() -> dict[str, float]:
    """Method -> the rate whose last-epoch validation accuracy, averaged over the seeds,
    is the highest in the committed grid."""
    scores: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    with RESULTS.open() as handle:
        for row in csv.DictReader(handle):
            scores[row["method"]][float(row["lr"])].append(float(row["validation_accuracy"]))
    return {
        method: max(rates, key=lambda lr: statistics.fmean(rates[lr]))
        for method, rates in scores.items()
    }


def test_the_declared_rate_is_the_one_the_committed_grid_chose():
    chosen = chosen_rates()
    assert chosen, "the grid's results file is empty"
    for method, lr in chosen.items():
        assert strategy_class(method).own_lrs[("digits", "single-sample")] == lr, method


def test_a_run_without_lr_takes_the_method_s_own_rate_there_and_only_there():
    def lr(**values):
        return resolve_lr(TrainConfig(secure=False, **values))

    own = strategy_class("fedavg").own_lrs[("digits", "single-sample")]
    assert own != default_lr("digits", "single-sample")
    assert lr(algorithm="fedavg", dataset="digits") == own
    assert lr(algorithm="fedavg", dataset="digits", lr=0.003) == 0.003
    assert lr(algorithm="fedavg", dataset="mnist-10k") == default_lr("mnist-10k", "single-sample")
    assert lr(algorithm="fedavg", dataset="digits", mode="batch") == default_lr("digits", "batch")
    # Stratify keeps the dataset's rate, chosen for its main job
    assert lr(algorithm="stratify", dataset="digits") == default_lr("digits", "single-sample")


def test_stratify_algorithms_shows_the_own_rate(capsys):
    from stratify.cli.main import main

    main(["methods", "--markdown"])
    line = next(row for row in capsys.readouterr().out.splitlines() if row.startswith("| `fedavg`"))
    own = strategy_class("fedavg").own_lrs[("digits", "single-sample")]
    assert f"`--lr` {own} on digits (single-sample), else the dataset's" in line
