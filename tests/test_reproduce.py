"""Grid runner: the grids' cells, resume, fair tuning, the paper's table format, plots, Ray."""

import csv
import dataclasses
import json
import re
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from stratify.algorithms import ALGORITHMS, strategy_class
from stratify.cli.main import main
from stratify.errors import ConfigError, DatasetError
from stratify.parallel import (
    LocalBackend,
    RayBackend,
    RunOutcome,
    check_ray_address,
)
from stratify.reproduce.grids import (
    DEFAULTS_CANDIDATES,
    GRIDS,
    SEED_METHODS,
    Column,
    Grid,
    Settings,
    method_column,
    paired_column,
    partition_row,
    plan_cells,
    runnable,
)
from stratify.reproduce.results import format_accuracy, mean_std, median_epoch
from stratify.reproduce.runner import reproduce
from stratify.reproduce.tuning import (
    Trial,
    Tuning,
    TuningPlan,
    candidates,
    choose,
    rungs,
    validation_score,
)
from stratify.run import EpochRecord, Run
from stratify.runfiles import read_records

# two methods, one partition, batch mode on the embedded digits: a few seconds per cell
TINY = Grid(
    "tiny",
    "FedAvg and Stratify on digits",
    {"dataset": "digits", "mode": "batch", "epochs": 2},
    (partition_row("classes:2", "#C=2"),),
    (method_column("fedavg", local_epochs=1), method_column("stratify", repeat_count=40)),
)


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setitem(GRIDS, "tiny", TINY)
    return TINY


def recorder():
    """A display that keeps every phase's events."""
    phases = {}

    @contextmanager
    def display(title, specs):
        events = phases.setdefault(title, [])
        yield events.append

    return display, phases


def statuses(events):
    return sorted((item.name, item.status) for item in events if isinstance(item, RunOutcome))


def accuracy_columns(path):
    with open(path) as handle:
        return [
            (row["column"], row["seed"], row["best_accuracy"], row["best_epoch"], row["lr"])
            for row in csv.DictReader(handle)
        ]


# -- grids --------------------------------------------------------------------------------


def test_every_grid_plans_valid_cells(tmp_path):
    for grid in GRIDS.values():
        cells, notes = plan_cells(grid, Settings(seeds=(0, 1)), tmp_path / grid.name)
        runnable_pairs = [
            (row, column)
            for row in grid.rows
            for column in grid.columns
            if runnable(column, {**grid.values, **row.values, **column.values}) is None
            and (row.columns is None or column.key in row.columns)
        ]
        methods = [cell for cell in cells if "-matched-" not in cell.column.key]
        assert len(methods) == 2 * len(runnable_pairs)
        # a paired method's cells each name a comparator that is planned in its row
        planned = {(cell.row.key, cell.column.key, cell.seed) for cell in cells}
        for cell in methods:
            assert (cell.comparator is not None) == cell.column.paired
            if cell.comparator is not None:
                assert (cell.row.key, cell.comparator, cell.seed) in planned
        assert len({cell.key for cell in cells}) == len(cells)
        assert len({cell.config.out for cell in cells}) == len(cells)
        for cell in cells:
            assert cell.config.out.startswith(str(tmp_path / grid.name / "cells"))
        for name in SEED_METHODS:  # methods not (yet) in this build are named in a note
            if name not in ALGORITHMS and any(c.algorithm == name for c in grid.columns):
                assert any(name in note for note in notes)


def test_table1_is_the_papers_table_on_mnist(tmp_path):
    cells, _ = plan_cells(GRIDS["table1"], Settings(seeds=(0,)), tmp_path)
    by_method = {cell.config.algorithm for cell in cells}
    assert {"fedavg", "fedprox", "scaffold", "sfl", "stratify"} <= by_method
    assert {cell.config.partition for cell in cells} == {
        "classes:1",
        "classes:3",
        "classes:5",
        "dirichlet:0.5",
        "iid",
    }
    # the paper's methods single-sample; the batch-only seed-paper methods in batch mode
    assert {
        (c.config.dataset, c.config.mode, c.config.epochs)
        for c in cells
        if c.config.algorithm not in SEED_METHODS
    } == {("mnist-10k", "single-sample", 30)}
    assert {c.config.mode for c in cells if c.config.algorithm in SEED_METHODS} <= {"batch"}
    labels = {column.key: column.label for column in GRIDS["table1"].columns}
    assert labels["fedbss"] == "FedBSS (batch, C=1)" and labels["fedavgm"] == "FedAvgM"
    assert labels["lfd"] == "LfD (batch)"


@pytest.mark.parametrize("grid", ["table1", "seed-methods"])
def test_fedbss_trains_every_client_like_the_other_columns(tmp_path, grid):
    # its paper's 10% of 100 clients would be one client a round out of a grid's 10
    cells, _ = plan_cells(GRIDS[grid], Settings(seeds=(0,)), tmp_path)
    fedbss = [cell for cell in cells if cell.column.key == "fedbss"]
    assert fedbss and all(
        cell.config.options == {"client_fraction": 1.0, "warmup_rounds": 7} for cell in fedbss
    )
    assert {cell.config.mode for cell in fedbss} == {"batch"}


def test_settings_override_the_grid(tmp_path):
    settings = Settings(
        dataset="digits",
        epochs=3,
        seeds=(4,),
        clients=5,
        methods=("fedavg", "stratify"),
        model="resnet9",
    )
    cells, _ = plan_cells(GRIDS["table2"], settings, tmp_path)
    assert {c.config.algorithm for c in cells} == {"fedavg", "stratify"}
    assert {
        (c.config.dataset, c.config.epochs, c.config.seed, c.config.clients) for c in cells
    } == {("digits", 3, 4, 5)}
    # a ResNet in batch mode: BatchNorm, Stratify's sum-based one
    assert {(c.config.algorithm, c.config.norm) for c in cells} == {
        ("fedavg", "bn"),
        ("stratify", "sumbn"),
    }
    single, _ = plan_cells(GRIDS["table1"], Settings(seeds=(0,), model="resnet9"), tmp_path)
    assert {c.config.norm for c in single if c.config.mode == "single-sample"} == {"gn"}


def test_missing_methods_are_left_out_with_a_note(tmp_path):
    grid = Grid(
        "g",
        "",
        {"dataset": "digits", "mode": "single-sample", "epochs": 1},
        (partition_row("iid", "IID"),),
        (
            method_column("stratify"),
            Column("nosuch", "NoSuch", {"algorithm": "nosuch"}),
            method_column("fedtan"),
        ),
    )
    cells, notes = plan_cells(grid, Settings(seeds=(0,)), tmp_path)
    assert [cell.config.algorithm for cell in cells] == ["stratify"]
    assert any("nosuch" in note for note in notes)
    assert any("fedtan does not run in single-sample mode" in note for note in notes)


def test_bad_settings_are_refused_before_anything_runs(tmp_path):
    with pytest.raises(ConfigError, match="not in grid table2"):
        plan_cells(GRIDS["table2"], Settings(methods=("sfl",)), tmp_path)
    with pytest.raises(ConfigError, match="columns of grid ablation-chunk are not methods"):
        plan_cells(GRIDS["ablation-chunk"], Settings(methods=("stratify",)), tmp_path)
    with pytest.raises(DatasetError, match="no option 'nope'"):
        plan_cells(GRIDS["table1"], Settings(dataset_options={"nope": "1"}), tmp_path)
    with pytest.raises(ConfigError, match="--epochs"):
        plan_cells(GRIDS["table1"], Settings(epochs=0), tmp_path)


# -- the paper's table format ---------------------------------------------------------


def test_one_seed_reads_as_the_paper_writes_it():
    assert format_accuracy([0.988], [4]) == "98.80%, E4"


def test_seeds_give_mean_and_sample_std():
    # mean 0.98; deviations ±0.01 → sample variance 0.0001 → std 0.01
    assert format_accuracy([0.97, 0.98, 0.99], [5, 3, 4]) == "98.00 ± 1.00%, E4"
    assert mean_std([0.5]) == (0.5, 0.0)
    assert median_epoch([7, 2, 9, 4]) == 4  # the lower middle of an even count


def test_missing_seeds_divergence_and_lr_are_marked():
    text = format_accuracy([0.5, 0.7], [1, 2], expected=3, diverged=1, lr=0.003)
    assert text == "60.00 ± 14.14%, E1 (2 of 3 seeds, 1 diverged) · lr 0.003"
    assert format_accuracy([], []) == "–"


# -- tuning ---------------------------------------------------------------------------


def test_candidates_are_centred_on_the_default():
    assert candidates(0.01, (0.3, 1, 3)) == (0.003, 0.01, 0.03)
    assert candidates(0.05, (1, 1.0)) == (0.05,)


def test_choose_takes_the_best_validation_accuracy():
    trials = [
        Trial(0.003, 0.91, 5, "finished"),
        Trial(0.01, 0.95, 4, "finished"),
        Trial(0.03, 0.97, 2, "diverged"),
    ]
    # a diverged candidate counts only when none finished
    assert choose(trials, 0.01) == 0.01
    assert (
        choose([t for t in trials if t.lr != 0.01] + [Trial(0.01, None, None, "failed")], 0.01)
        == 0.003
    )
    assert choose([Trial(0.03, 0.97, 2, "diverged"), Trial(0.1, 0.5, 1, "diverged")], 0.01) == 0.03
    assert choose([], 0.01) == 0.01


def test_ties_go_to_the_rate_nearest_the_default():
    trials = [
        Trial(0.001, 0.9, 1, "finished"),
        Trial(0.03, 0.9, 1, "finished"),
        Trial(0.005, 0.9, 1, "skipped"),
    ]
    assert choose(trials, 0.01) == 0.005  # |log 0.5| < |log 3| < |log 0.1|
    assert choose(trials[:2], 0.01) == 0.03  # |log 3| < |log 0.1|


def test_successive_halving_keeps_the_better_half_and_decides_at_the_full_epochs():
    assert rungs(3, 30) == [(3, 15), (2, 30)]
    assert rungs(5, 30) == [(5, 8), (3, 15), (2, 30)]
    assert rungs(4, 3) == [(4, 2), (2, 3)]
    assert rungs(2, 7) == [(2, 7)]
    assert rungs(1, 7) == [(1, 7)]


@pytest.fixture
def fedavg_at_005(monkeypatch):
    """FedAvg's own rate on the digits in batch mode pinned to 0.05, so the candidates
    below do not follow the committed defaults grid."""
    cls = strategy_class("fedavg")
    rates = dataclasses.replace(cls.card.rates, tuned={("digits", "batch"): 0.05})
    monkeypatch.setattr(cls, "card", dataclasses.replace(cls.card, rates=rates))


def fake_trial(folder: Path, accuracies: list[float], classes: int | None = None) -> None:
    """A tuning run's folder holding these epochs' validation accuracies (and, given
    ``classes``, a config.json that recorded them)."""
    folder.mkdir(parents=True, exist_ok=True)
    if classes is not None:
        (folder / "config.json").write_text(json.dumps({"resolved": {"num_classes": classes}}))
    records = [
        EpochRecord(e, 0.0, 0.0, 0.0, 0, 0, 0, 0, 0.0, validation_accuracy=a)
        for e, a in enumerate(accuracies, 1)
    ]
    lines = [json.dumps(dataclasses.asdict(record)) for record in records]
    (folder / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))


def tuning_asks(cells, tuning: Tuning, out: Path) -> list[tuple[str, int]]:
    """(folder, epochs) of every tuning run a fresh plan over ``out`` asks for next."""
    specs = TuningPlan(cells, tuning, out).next_specs()
    return sorted((Path(spec.config.out).name, spec.config.epochs) for spec in specs)


def test_halving_and_widening_are_read_back_from_the_tuning_folders(tiny, tmp_path, fedavg_at_005):
    """FedAvg's rate on digits pinned to 0.05: candidates 0.025, 0.05, 0.1 race 2 epochs,
    the better two go on to 4; the best of those, 0.1, is at the top edge, so 0.2 is tried
    for 4 epochs, wins, and 0.4 (widen=2) is tried and loses. Each step asks only for the
    runs its decision needs, and the same folders give the same choice again."""
    cells, _ = plan_cells(tiny, Settings(seeds=(0,), epochs=4), tmp_path)
    cells = [cell for cell in cells if cell.column.key == "fedavg"]
    tuning = Tuning(factors=(0.5, 1, 2), epochs=4, halving=True, widen=2)
    tune = tmp_path / "tune" / "classes-2" / "fedavg"

    def asked(plan):
        return sorted((Path(s.config.out).name, s.config.epochs) for s in plan.next_specs())

    plan = TuningPlan(cells, tuning, tmp_path)
    assert asked(plan) == [("lr-0.025", 2), ("lr-0.05", 2), ("lr-0.1", 2)]
    fake_trial(tune / "lr-0.025", [0.5, 0.6])
    fake_trial(tune / "lr-0.05", [0.5, 0.7])
    fake_trial(tune / "lr-0.1", [0.6, 0.65])
    assert asked(TuningPlan(cells, tuning, tmp_path)) == [("lr-0.05", 4), ("lr-0.1", 4)]
    fake_trial(tune / "lr-0.05", [0.5, 0.7, 0.72, 0.74])
    fake_trial(tune / "lr-0.1", [0.6, 0.65, 0.8, 0.75])
    assert asked(TuningPlan(cells, tuning, tmp_path)) == [("lr-0.2", 4)]
    fake_trial(tune / "lr-0.2", [0.7, 0.8, 0.85, 0.9])
    assert asked(TuningPlan(cells, tuning, tmp_path)) == [("lr-0.4", 4)]
    fake_trial(tune / "lr-0.4", [0.1, 0.1, 0.1, 0.1])
    plan = TuningPlan(cells, tuning, tmp_path)
    assert asked(plan) == []
    (choice,) = plan.choices().values()
    assert choice.lr == 0.2
    # each scored by its mean over the last rounds (2 of 2, 3 of 4)
    assert [(t.lr, t.accuracy, t.epochs) for t in choice.trials] == [
        (0.025, pytest.approx(0.55), 2),
        (0.05, pytest.approx(0.72), 4),
        (0.1, pytest.approx(2.2 / 3), 4),
        (0.2, pytest.approx(0.85), 4),
        (0.4, pytest.approx(0.1), 4),
    ]
    # without halving and widening: every candidate for all 4 epochs, nothing more
    plain = TuningPlan(cells, Tuning(factors=(0.5, 1, 2), epochs=4, widen=0), tmp_path)
    assert asked(plain) == [("lr-0.025", 4)]


def test_the_lowest_rate_can_win_the_tuning_and_the_grid_widens_downwards(
    tiny, tmp_path, fedavg_at_005
):
    """FedAvg's rate on digits pinned to 0.05: of 0.025, 0.05 and 0.1 the lowest wins, so
    0.0125 is tried, wins too, and 0.00625 (widen=2) is tried and loses: 0.0125 is chosen."""
    cells, _ = plan_cells(tiny, Settings(seeds=(0,), epochs=2), tmp_path)
    cells = [cell for cell in cells if cell.column.key == "fedavg"]
    tuning = Tuning(factors=(0.5, 1, 2), epochs=2, widen=2)
    tune = tmp_path / "tune" / "classes-2" / "fedavg"

    def asked():
        return tuning_asks(cells, tuning, tmp_path)

    assert asked() == [("lr-0.025", 2), ("lr-0.05", 2), ("lr-0.1", 2)]
    fake_trial(tune / "lr-0.025", [0.6, 0.8])
    fake_trial(tune / "lr-0.05", [0.5, 0.7])
    fake_trial(tune / "lr-0.1", [0.3, 0.4])
    assert asked() == [("lr-0.0125", 2)]
    fake_trial(tune / "lr-0.0125", [0.7, 0.85])
    assert asked() == [("lr-0.00625", 2)]
    fake_trial(tune / "lr-0.00625", [0.5, 0.6])
    plan = TuningPlan(cells, tuning, tmp_path)
    assert asked() == [] and plan.next_specs() == []
    (choice,) = plan.choices().values()
    assert choice.lr == 0.0125
    assert [t.lr for t in choice.trials] == [0.00625, 0.0125, 0.025, 0.05, 0.1]


def test_rates_all_at_chance_after_the_tuning_epochs_race_on_to_the_cells_epochs(
    tiny, tmp_path, fedavg_at_005
):
    """Every candidate within 5 points of chance (10 classes) after the 2 tuning epochs:
    nothing told them apart, so all three train on to the cell's 6 epochs, where the
    lowest leaves chance and is chosen. The same scores from runs that did not record
    their classes are decided at once, as before."""
    cells, _ = plan_cells(tiny, Settings(seeds=(0,), epochs=6), tmp_path)
    cells = [cell for cell in cells if cell.column.key == "fedavg"]
    tuning = Tuning(factors=(0.5, 1, 2), epochs=2, widen=0)
    tune = tmp_path / "tune" / "classes-2" / "fedavg"

    def asked():
        return tuning_asks(cells, tuning, tmp_path)

    scores = {"lr-0.025": [0.1, 0.11], "lr-0.05": [0.12, 0.14], "lr-0.1": [0.09, 0.1]}
    for name, accuracies in scores.items():
        fake_trial(tune / name, accuracies)
    assert asked() == []  # no classes recorded: chosen on the tuning epochs (0.05)
    for name, accuracies in scores.items():
        fake_trial(tune / name, accuracies, classes=10)
    assert asked() == [("lr-0.025", 6), ("lr-0.05", 6), ("lr-0.1", 6)]
    fake_trial(tune / "lr-0.025", [0.1, 0.11, 0.2, 0.4, 0.6, 0.7], classes=10)
    fake_trial(tune / "lr-0.05", [0.12, 0.14, 0.13, 0.15, 0.14, 0.13], classes=10)
    fake_trial(tune / "lr-0.1", [0.09, 0.1, 0.1, 0.1, 0.1, 0.1], classes=10)
    plan = TuningPlan(cells, tuning, tmp_path)
    assert plan.next_specs() == []
    (choice,) = plan.choices().values()
    assert choice.lr == 0.025 and {t.epochs for t in choice.trials} == {6}


def test_a_comparators_candidates_surround_its_bases_rate_and_its_methods(tmp_path):
    """LfD's matched FedAvg runs with LfD's optimizer and local work but FedAvg's head:
    its candidates are multiples of FedAvg's rate on digits and of LfD's; its methods
    tune nothing of their own."""
    grid = Grid(
        "tiny-lfd",
        "",
        {"dataset": "digits", "mode": "batch", "epochs": 2, "clients": 4},
        (partition_row("iid", "IID"),),
        (paired_column("lfd", local_epochs=1),),
    )
    lfd = strategy_class("lfd").card.rates.tuned["digits", "batch"]
    assert lfd != strategy_class("fedavg").card.rates.tuned["digits", "batch"]
    cells, _ = plan_cells(grid, Settings(seeds=(0, 1)), tmp_path)
    plan = TuningPlan(cells, Tuning(factors=(0.5, 1, 2), epochs=2, widen=0), tmp_path)
    specs = plan.next_specs()
    assert {Path(spec.config.out).parent.name for spec in specs} == {
        cell.column.key for cell in cells if cell.is_comparator
    }
    fedavg = strategy_class("fedavg").card.rates.tuned["digits", "batch"]
    expected = sorted({*candidates(lfd, (0.5, 1, 2)), *candidates(fedavg, (0.5, 1, 2))})
    assert sorted(spec.config.lr for spec in specs) == expected and len(expected) == 6


def test_a_halving_rung_at_chance_drops_no_rate(tiny, tmp_path, fedavg_at_005):
    """After the first rung (2 of 4 epochs) every rate is within 5 points of chance, so
    all three go on to 4 epochs, where the slowest starter wins; scores away from chance
    drop the worst."""
    cells, _ = plan_cells(tiny, Settings(seeds=(0,), epochs=4), tmp_path)
    cells = [cell for cell in cells if cell.column.key == "fedavg"]
    tuning = Tuning(factors=(0.5, 1, 2), epochs=4, halving=True, widen=0)
    tune = tmp_path / "tune" / "classes-2" / "fedavg"

    def asked():
        return tuning_asks(cells, tuning, tmp_path)

    learnt = {"lr-0.025": [0.3, 0.35], "lr-0.05": [0.5, 0.6], "lr-0.1": [0.4, 0.45]}
    for name, accuracies in learnt.items():
        fake_trial(tune / name, accuracies, classes=10)
    assert asked() == [("lr-0.05", 4), ("lr-0.1", 4)]
    first = {"lr-0.025": [0.1, 0.1], "lr-0.05": [0.12, 0.13], "lr-0.1": [0.14, 0.12]}
    for name, accuracies in first.items():
        fake_trial(tune / name, accuracies, classes=10)
    assert asked() == [("lr-0.025", 4), ("lr-0.05", 4), ("lr-0.1", 4)]
    fake_trial(tune / "lr-0.025", [0.1, 0.1, 0.5, 0.7], classes=10)
    fake_trial(tune / "lr-0.05", [0.12, 0.13, 0.3, 0.4], classes=10)
    fake_trial(tune / "lr-0.1", [0.14, 0.12, 0.2, 0.2], classes=10)
    plan = TuningPlan(cells, tuning, tmp_path)
    assert plan.next_specs() == []
    (choice,) = plan.choices().values()
    assert choice.lr == 0.025


def test_every_halving_rung_trains_past_the_methods_warm_up(tmp_path):
    """FedBSS warming up 3 rounds, tuned 6 epochs by halving: plain halving would race its
    three rates for 3 epochs, all warm-up, and keep two of them on a score its mechanism
    never touched; every rung lasts at least the warm-up + 2 epochs instead."""
    grid = Grid(
        "fedbss-halving",
        "FedBSS tuned by halving",
        {"dataset": "digits", "mode": "batch", "epochs": 6},
        (partition_row("iid", "IID"),),
        (method_column("fedbss", warmup_rounds=3),),
    )
    cells, _ = plan_cells(grid, Settings(seeds=(0,), clients=4), tmp_path)
    tuning = Tuning(factors=(0.5, 1, 2), epochs=6, halving=True, widen=0)
    specs = TuningPlan(cells, tuning, tmp_path).next_specs()
    assert len(specs) == 3
    rungs_seen = []
    while specs:
        epochs = {spec.config.epochs for spec in specs}
        assert min(epochs) > 3, epochs  # every rung trains after the warm-up ends
        rungs_seen.append((len(specs), *epochs))
        for rank, spec in enumerate(specs):
            fake_trial(Path(spec.config.out), [0.5 - 0.1 * rank] * spec.config.epochs)
        specs = TuningPlan(cells, tuning, tmp_path).next_specs()
    assert rungs_seen == [(3, 5), (2, 6)]


def test_a_trial_scores_its_mean_validation_accuracy_over_its_last_rounds(
    tiny, tmp_path, fedavg_at_005
):
    records = [
        {"epoch": 1, "validation_accuracy": 0.5},
        {"epoch": 2, "validation_accuracy": 0.8},
        {"epoch": 3, "validation_accuracy": 0.8},
        {"epoch": 4, "validation_accuracy": 0.7},
    ]
    # the last 3 of 4 rounds (docs/architecture.md: the last-rounds window), and the last epoch
    assert validation_score(records) == (pytest.approx((0.8 + 0.8 + 0.7) / 3), 4)
    # and so does the tuning trial read back from a run's folder
    cells, _ = plan_cells(tiny, Settings(seeds=(0,), epochs=4), tmp_path)
    cells = [cell for cell in cells if cell.column.key == "fedavg"]
    tuning = Tuning(factors=(1,), epochs=4, widen=0)
    fake_trial(tmp_path / "tune" / "classes-2" / "fedavg" / "lr-0.05", [0.5, 0.8, 0.8, 0.7])
    plan = TuningPlan(cells, tuning, tmp_path)
    assert plan.next_specs() == []
    (choice,) = plan.choices().values()
    assert [(t.accuracy, t.epoch) for t in choice.trials] == [(pytest.approx(0.7667, abs=1e-4), 4)]


def test_a_rate_that_swings_loses_to_a_steady_one_whatever_its_best_round():
    # peak validation 0.9 but ending low: the best-round score chose such rates, whose
    # final runs then ended far below the steady rate's
    swinging = [
        {"epoch": e + 1, "validation_accuracy": a}
        for e, a in enumerate([0.2, 0.9, 0.2, 0.9, 0.2, 0.3])
    ]
    steady = [
        {"epoch": e + 1, "validation_accuracy": a}
        for e, a in enumerate([0.5, 0.6, 0.7, 0.7, 0.7, 0.7])
    ]
    trials = [
        Trial(0.3, *validation_score(swinging), "finished"),
        Trial(0.03, *validation_score(steady), "finished"),
    ]
    assert choose(trials, 0.1) == 0.03


def test_a_grid_tuned_by_halving_runs_and_resumes_to_the_same_choice(tiny, tmp_path):
    tuning = Tuning(factors=(0.5, 1, 2), validation=0.2, epochs=2, halving=True, widen=1)
    settings = Settings(seeds=(0,), epochs=1)
    display, phases = recorder()
    first = reproduce(
        "tiny", tmp_path, settings, tuning=tuning, backend=LocalBackend(1), display=display
    )
    titles = list(phases)
    assert titles[:2] == ["tiny · tuning lr", "tiny · tuning lr, step 2"]
    assert first.chosen is not None
    for choice in first.chosen.values():
        at_two = [t for t in choice.trials if t.epochs == 2]
        assert len(at_two) >= 2 and choice.lr == choose(at_two, choice.default)
    display, phases = recorder()
    again = reproduce(
        "tiny", tmp_path, settings, tuning=tuning, backend=LocalBackend(1), display=display
    )
    assert again.chosen == first.chosen
    assert all(s == "skipped" for events in phases.values() for _, s in statuses(events))
    rows = list(csv.DictReader(open(tmp_path / "tuning.csv")))
    for group, choice in first.chosen.items():
        trained = {t.epochs for t in choice.trials}
        # the first rung (1 epoch) drops a rate unless every rate was still within 5
        # points of chance (digits: 10 classes) after it
        after_one = [
            read_records(tmp_path / "tune" / group / f"lr-{t.lr:g}")[0]["validation_accuracy"]
            for t in choice.trials
        ]
        assert trained == ({2} if max(after_one) <= 0.15 else {1, 2})
    assert {row["epochs"] for row in rows} <= {"1", "2"}


# -- running grids ------------------------------------------------------------------------


def test_resume_skips_finished_cells(tiny, tmp_path):
    settings = Settings(seeds=(0, 1))
    display, phases = recorder()
    first = reproduce("tiny", tmp_path, settings, backend=LocalBackend(1), display=display)
    assert [r.status for r in first.results] == ["finished"] * 4
    assert all(s == "finished" for _, s in statuses(phases["tiny"]))
    before = accuracy_columns(tmp_path / "results.csv")
    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.glob("cells/**/metrics.jsonl")}

    display, phases = recorder()
    reproduce("tiny", tmp_path, settings, backend=LocalBackend(1), display=display)
    assert all(s == "skipped" for _, s in statuses(phases["tiny"]))
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps

    # one cell stopped after its first epoch: only that one runs, resuming from there
    cell = next(c for c in first.cells if c.key == "classes-2/stratify/seed-1")
    shutil.rmtree(cell.config.out)
    Run(dataclasses.replace(cell.config, epochs=1)).train()
    display, phases = recorder()
    reproduce("tiny", tmp_path, settings, backend=LocalBackend(1), display=display)
    assert statuses(phases["tiny"]) == [
        ("classes-2/fedavg/seed-0", "skipped"),
        ("classes-2/fedavg/seed-1", "skipped"),
        ("classes-2/stratify/seed-0", "skipped"),
        ("classes-2/stratify/seed-1", "finished"),
    ]
    assert accuracy_columns(tmp_path / "results.csv") == before


def test_a_diverged_run_is_not_trained_again_on_resume(monkeypatch, tmp_path, capsys):
    def grid_at(lr):
        hot = Column("hot", "FedAvg (hot)", {"algorithm": "fedavg", "lr": lr}, {"local_epochs": 1})
        return dataclasses.replace(TINY, name="hot", columns=(hot, TINY.columns[1]))

    monkeypatch.setitem(GRIDS, "hot", grid_at(1e6))
    settings = Settings(seeds=(0,))
    display, phases = recorder()
    first = reproduce("hot", tmp_path, settings, backend=LocalBackend(1), display=display)
    assert statuses(phases["hot"]) == [
        ("classes-2/hot/seed-0", "diverged"),
        ("classes-2/stratify/seed-0", "finished"),
    ]
    message = first.results[0].message
    assert "non-finite" in message
    assert "classes-2/hot/seed-0" in json.loads((tmp_path / "diverged.json").read_text())

    # a dry run counts it as ended, as a resume does, and calibrates nothing (the grid
    # above ran with no data folder: CI's STRATIFY_DATA_DIR would make it another run)
    monkeypatch.delenv("STRATIFY_DATA_DIR", raising=False)
    capsys.readouterr()
    main(["reproduce", "hot", "--out", str(tmp_path), "--seeds", "0", "--dry-run"])
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "cells: 2 runs, 1 finished, 1 diverged (not run again), 0 to run, 0 epochs left",
        "nothing left to run",
    ], err
    assert not (tmp_path / "calibration.json").exists()

    # resumed, in the same configuration: nothing trains, the divergence is still reported
    display, phases = recorder()
    again = reproduce("hot", tmp_path, settings, backend=LocalBackend(1), display=display)
    assert statuses(phases["hot"]) == [("classes-2/stratify/seed-0", "skipped")]
    assert [(r.status, r.message) for r in again.results] == [
        ("diverged", message),
        ("finished", ""),
    ]
    assert any("not run again" in note and "hot/seed-0" in note for note in again.run_notes)
    # so does a report of the folder
    report = reproduce("hot", tmp_path, settings, report_only=True)
    assert report.results[0].status == "diverged"

    # another rate is another run: it trains
    monkeypatch.setitem(GRIDS, "hot", grid_at(1e5))
    display, phases = recorder()
    reproduce("hot", tmp_path, settings, backend=LocalBackend(1), display=display)
    assert ("classes-2/hot/seed-0", "diverged") in statuses(phases["hot"])


def test_a_dry_run_estimates_without_a_kind_whose_calibration_diverges(
    monkeypatch, tmp_path, capsys
):
    # its calibration runs diverge in epoch 1: the estimate leaves the column out with a
    # note (it ended in "this is a bug in stratify"), the other column is estimated
    hot = Column("hot", "FedAvg (hot)", {"algorithm": "fedavg", "lr": 1e6}, {"local_epochs": 1})
    monkeypatch.setitem(
        GRIDS, "hot", dataclasses.replace(TINY, name="hot", columns=(hot, TINY.columns[1]))
    )
    monkeypatch.delenv("STRATIFY_DATA_DIR", raising=False)
    main(
        ["reproduce", "hot", "--out", str(tmp_path), "--seeds", "0", "--dry-run", "--workers", "1"]
    )
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("note: hot left out")]
    assert len(lines) == 1 and "diverged" in lines[0] and "non-finite" in lines[0], err
    assert "cost of stratify here" in err and "estimated" in err and "bug" not in err, err
    stored = json.loads((tmp_path / "calibration.json").read_text())["kinds"]
    assert list(stored) == ["stratify"]


def test_the_diverged_record_does_not_unguard_an_input_it_links_to(tmp_path):
    from stratify.files import guard_input, guarded_as, release_input
    from stratify.reproduce.diverged import DIVERGED_FILE, DivergedRuns

    data = tmp_path / "data.json"
    data.write_text("{}")
    (tmp_path / DIVERGED_FILE).symlink_to(data)
    guard_input(data, "a data file of the command")
    try:
        DivergedRuns(tmp_path)
        assert guarded_as(data) is not None
    finally:
        release_input(data)


def test_a_run_two_cells_share_is_trained_once_and_copied(monkeypatch, tmp_path):
    fedavg = method_column("fedavg", local_epochs=1)
    twice = dataclasses.replace(
        TINY,
        name="twice",
        columns=(fedavg, dataclasses.replace(fedavg, key="fedavg-again", label="FedAvg again")),
    )
    monkeypatch.setitem(GRIDS, "twice", twice)
    display, phases = recorder()
    report = reproduce(
        "twice", tmp_path, Settings(seeds=(0, 1)), backend=LocalBackend(1), display=display
    )
    assert statuses(phases["twice"]) == [
        ("classes-2/fedavg/seed-0", "finished"),
        ("classes-2/fedavg/seed-1", "finished"),
    ]
    assert [r.status for r in report.results] == ["finished"] * 4
    assert any(
        "run once and copied" in note and "fedavg-again/seed-1 from" in note
        for note in report.run_notes
    )
    for seed in (0, 1):
        trained = tmp_path / "cells/classes-2/fedavg" / f"seed-{seed}"
        copied = tmp_path / "cells/classes-2/fedavg-again" / f"seed-{seed}"
        assert read_records(copied) == read_records(trained)
        assert json.loads((copied / "config.json").read_text())["out"] == str(copied)
    accuracies = {(row[0], row[1]): row[2] for row in accuracy_columns(tmp_path / "results.csv")}
    assert accuracies[("FedAvg", "0")] == accuracies[("FedAvg again", "0")] != ""

    # the copy is a whole run: run again, nothing trains and every cell reads back
    display, phases = recorder()
    again = reproduce(
        "twice", tmp_path, Settings(seeds=(0, 1)), backend=LocalBackend(1), display=display
    )
    assert all(status == "skipped" for _, status in statuses(phases["twice"]))
    assert [r.status for r in again.results] == ["finished"] * 4


def test_results_csv_and_the_papers_table(tiny, tmp_path):
    report = reproduce("tiny", tmp_path, Settings(seeds=(0, 1)), backend=LocalBackend(1))
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    assert len(rows) == 4
    lasts = {}
    for row in rows:
        records = read_records(row["run_dir"])
        best = max(records, key=lambda record: record["test_accuracy"])
        assert float(row["best_accuracy"]) == best["test_accuracy"]
        assert int(row["best_epoch"]) == best["epoch"]
        assert row["status"] == "finished" and row["tuned"] == "False"
        # two epochs: the last-rounds window is both; the final one is the last epoch's
        accuracies = [record["test_accuracy"] for record in records]
        assert float(row["last_mean_accuracy"]) == pytest.approx(sum(accuracies) / 2)
        assert float(row["final_accuracy"]) == accuracies[-1] and row["last_rounds"] == "2"
        gradients = sum(record["sample_gradients"] for record in records) / 2
        assert float(row["sample_gradients_per_round"]) == gradients > 0
        assert float(row["bytes_per_round"]) == sum(r["bytes_sent"] for r in records) / 2
        lasts.setdefault(row["column"], []).append(float(row["last_mean_accuracy"]))
    table = (tmp_path / "results.md").read_text()
    assert "| Partitioning | FedAvg | Stratify |" in table and "chosen on the test set" in table
    line = next(line for line in table.splitlines() if line.startswith("| #C=2 |"))
    cells = line.strip("|").split("|")[1:]
    pattern = r" \d+\.\d\d ± \d+\.\d\d% \(best \d+\.\d\d ± \d+\.\d\d%, E[12]\) "
    assert all(re.fullmatch(pattern, cell) for cell in cells), line
    stratify = [r for r in report.results if r.cell.column.key == "stratify"]
    best_mean = sum(r.best[0] for r in stratify) / 2
    last_mean, last_std = mean_std(lasts["Stratify"])
    assert cells[1].startswith(f" {100 * last_mean:.2f} ± {100 * last_std:.2f}% (best ")
    assert f"(best {100 * best_mean:.2f} ± " in cells[1]


def test_a_grid_reads_only_its_own_epochs_from_runs_extended_past_them(tiny, tmp_path):
    reproduce("tiny", tmp_path, Settings(seeds=(0,), epochs=3), backend=LocalBackend(1))
    display, phases = recorder()
    settings = Settings(seeds=(0,), epochs=2)
    reproduce("tiny", tmp_path, settings, backend=LocalBackend(1), display=display)
    assert all(status == "skipped" for _, status in statuses(phases["tiny"]))
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    assert len(rows) == 2
    for row in rows:
        records = read_records(row["run_dir"])
        assert len(records) == 3  # the folders hold the longer runs
        asked = records[:2]
        best = max(asked, key=lambda record: record["test_accuracy"])
        assert (row["status"], int(row["epochs"])) == ("finished", 2)
        assert float(row["best_accuracy"]) == best["test_accuracy"]
        assert int(row["best_epoch"]) == best["epoch"]
        assert float(row["final_accuracy"]) == asked[-1]["test_accuracy"]
        assert int(row["total_transfers"]) == sum(record["transfers"] for record in asked)


def test_tuning_picks_each_lr_on_the_validation_split(tiny, tmp_path):
    tuning = Tuning(factors=(0.5, 2.0), validation=0.2, epochs=1, widen=0)
    report = reproduce(
        "tiny", tmp_path, Settings(seeds=(0, 1)), tuning=tuning, backend=LocalBackend(1)
    )
    assert report.chosen is not None and set(report.chosen) == {
        "classes-2/fedavg",
        "classes-2/stratify",
    }
    for group, choice in report.chosen.items():
        assert [t.lr for t in choice.trials] == [choice.default * 0.5, choice.default * 2]
        best = {}
        for trial in choice.trials:
            folder = tmp_path / "tune" / group / f"lr-{trial.lr:g}"
            saved = json.loads((folder / "config.json").read_text())
            assert saved["validation"] == 0.2 and saved["seed"] == 0
            # 1 tuning epoch, or the cell's 2 where every rate was still near chance
            assert saved["epochs"] == trial.epochs in (1, 2)
            assert saved["resolved"]["evaluated_on"] == "validation and test"
            best[trial.lr] = validation_score(read_records(folder))[0]
            assert trial.accuracy == best[trial.lr]
        assert choice.lr == choose(choice.trials, choice.default)
        assert best[choice.lr] == max(best.values())
    for result in report.results:
        saved = json.loads(Path(result.cell.config.out, "config.json").read_text())
        assert saved["validation"] == 0.0 and saved["resolved"]["evaluated_on"] == "test"
        assert saved["lr"] == report.chosen[result.cell.group].lr
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    assert {(r["column"], float(r["lr"]), r["tuned"]) for r in rows} == {
        (label, report.chosen[f"classes-2/{key}"].lr, "True")
        for label, key in (("FedAvg", "fedavg"), ("Stratify", "stratify"))
    }
    table = (tmp_path / "results.md").read_text()
    for choice in report.chosen.values():
        assert f"· lr {choice.lr:g}" in table
    assert (tmp_path / "tuning.csv").exists()


def test_tuning_reads_the_validation_accuracy_never_the_test_accuracy():
    records = [
        {"epoch": 1, "validation_accuracy": 0.5, "test_accuracy": 0.99},
        {"epoch": 2, "validation_accuracy": 0.7, "test_accuracy": 0.10},
    ]
    assert validation_score(records) == (pytest.approx(0.6), 2)
    # a folder of a version whose tuning runs measured the split as test_accuracy
    assert validation_score([{"epoch": 1, "test_accuracy": 0.4}]) == (0.4, 1)


def test_a_folder_of_another_grid_setting_is_refused(tiny, tmp_path):
    reproduce("tiny", tmp_path, Settings(seeds=(0,), epochs=1), backend=LocalBackend(1))
    with pytest.raises(ConfigError, match="clients: 10 there, 5 now"):
        reproduce("tiny", tmp_path, Settings(seeds=(0,), epochs=1, clients=5))


def test_a_grid_copied_without_checkpoints_continues_to_the_same_results(tiny, tmp_path, capsys):
    """A finished run needs no checkpoint; a stopped one without its checkpoint is run
    again from epoch 1, and the dry run counts its epochs as left."""
    first, moved = tmp_path / "first", tmp_path / "moved"
    arguments = ["reproduce", "tiny", "--seeds", "0", "--workers", "1"]
    main([*arguments, "--out", str(first)])
    shutil.copytree(first, moved, ignore=shutil.ignore_patterns("checkpoint.pt"))
    stopped = moved / "cells" / "classes-2" / "stratify" / "seed-0"
    (stopped / "summary.json").unlink()
    lines = (stopped / "metrics.jsonl").read_text().splitlines(keepends=True)
    (stopped / "metrics.jsonl").write_text(lines[0])  # it stopped after epoch 1 of 2
    capsys.readouterr()
    main([*arguments, "--out", str(moved), "--dry-run"])
    assert "cells: 2 runs, 1 finished, 1 to run, 2 epochs left" in capsys.readouterr().err
    main([*arguments, "--out", str(moved)])
    assert len((stopped / "metrics.jsonl").read_text().splitlines()) == 2

    def figures(out):
        return [
            {key: row[key] for key in ("column", "seed", "epochs", "final_accuracy")}
            for row in csv.DictReader(open(out / "results.csv"))
        ]

    assert figures(moved) == figures(first)


def test_reproduce_command(tiny, tmp_path, capsys):
    out = tmp_path / "grid"
    main(
        ["reproduce", "tiny", "--out", str(out), "--seeds", "0", "--epochs", "1", "--workers", "1"]
    )
    captured = capsys.readouterr()
    assert "| #C=2 |" in captured.out
    assert (out / "accuracy-classes-2.png").exists()
    main(["reproduce", "tiny", "--out", str(out), "--seeds", "0,1", "--epochs", "1", "--dry-run"])
    assert "cells: 4 runs, 2 finished, 2 to run, 2 epochs left" in capsys.readouterr().err
    for flags, message in [
        (["nosuch"], "unknown grid 'nosuch'"),
        (["tiny", "--tune-epochs", "2"], "--tune-epochs applies with --tune"),
        (["tiny", "--workers", "2", "--backend", "ray"], "--workers applies to --backend local"),
        (["tiny", "--address", "auto"], "--address applies to --backend ray"),
        (["tiny", "--tune", "--validation", "0"], "--validation"),
    ]:
        with pytest.raises(SystemExit) as stop:
            main(["reproduce", *flags, "--out", str(tmp_path / "other")])
        assert stop.value.code == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1


# -- plots --------------------------------------------------------------------------------


def test_plot_draws_two_run_folders(tiny, tmp_path, capsys):
    reproduce("tiny", tmp_path, Settings(seeds=(0,)), backend=LocalBackend(1))
    runs = [
        str(tmp_path / "cells" / "classes-2" / key / "seed-0") for key in ("fedavg", "stratify")
    ]
    image = tmp_path / "curves.png"
    main(["plot", *runs, "--out", str(image)])
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"written: {image}" in capsys.readouterr().err
    main(["plot", *runs, "--out", str(image), "--metric", "transfers"])
    with pytest.raises(SystemExit) as stop:
        main(["plot", str(tmp_path), "--out", str(image)])  # no metrics.jsonl there
    assert stop.value.code == 2
    assert "no metrics.jsonl" in capsys.readouterr().err


def test_without_matplotlib_the_tables_are_still_written(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    report = reproduce("tiny", tmp_path, Settings(seeds=(0,), epochs=1), backend=LocalBackend(1))
    assert "pip install -e '.[plot]'" in report.plots_note
    assert (tmp_path / "results.md").exists() and (tmp_path / "results.csv").exists()
    assert not list(tmp_path.glob("*.png"))
    run = str(tmp_path / "cells" / "classes-2" / "stratify" / "seed-0")
    with pytest.raises(SystemExit) as stop:
        main(["plot", run, "--out", str(tmp_path / "x.png")])
    assert stop.value.code == 2
    assert "pip install -e '.[plot]'" in capsys.readouterr().err


# -- Ray ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_ray_runs_a_two_cell_grid_as_local_workers_do(tiny, tmp_path):
    import ray  # in the test extra: this test runs, never skips, in CI

    settings = Settings(seeds=(0,), epochs=1)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        # the address check lets a live cluster through: a trial driver joins it
        check_ray_address(ray.get_runtime_context().gcs_address)
        display, phases = recorder()
        report = reproduce(
            "tiny", tmp_path / "ray", settings, backend=RayBackend(), display=display
        )
    finally:
        ray.shutdown()
    assert [r.status for r in report.results] == ["finished", "finished"], [
        r.message for r in report.results
    ]
    assert sorted(s for _, s in statuses(phases["tiny"])) == ["finished", "finished"]
    reproduce("tiny", tmp_path / "local", settings, backend=LocalBackend(1))
    assert accuracy_columns(tmp_path / "ray" / "results.csv") == accuracy_columns(
        tmp_path / "local" / "results.csv"
    )


def test_defaults_grid_runs_every_method_and_mode_at_every_candidate_rate(tmp_path):
    cells, _ = plan_cells(GRIDS["defaults"], Settings(seeds=(0,)), tmp_path)
    assert {cell.config.lr for cell in cells} == set(DEFAULTS_CANDIDATES)
    assert all(cell.config.validation > 0 and cell.config.dataset == "digits" for cell in cells)
    planned = {(cell.config.algorithm, cell.config.mode): cell.config.epochs for cell in cells}
    expected = {
        (name, mode)
        for name in ALGORITHMS
        for mode in strategy_class(name).card.identity.modes
        if not strategy_class(name).card.paper.requires_batch_norm
    }
    assert set(planned) == expected
    # each with its own default options, for as long as its mechanism needs (FedBSS's
    # 50 warm-up rounds + 2)
    assert all(cell.config.options == {} for cell in cells)
    assert planned["fedbss", "batch"] == 52 and planned["fedavg", "batch"] == 5
    assert planned["fedavg", "single-sample"] == 10


def test_calibration_runs_cut_a_default_warm_up_too():
    """A FedBSS column at its defaults (50 warm-up rounds) is calibrated with a one-round
    warm-up, as one that gives the option: a 3-epoch run with 50 would be refused."""
    from stratify.config import TrainConfig
    from stratify.reproduce.estimate import calibration_options

    fedbss = TrainConfig(algorithm="fedbss", mode="batch", epochs=52, secure=False)
    assert calibration_options(fedbss) == {"warmup_rounds": 1}
    given = TrainConfig(
        algorithm="fedbss", mode="batch", epochs=52, secure=False, options={"warmup_rounds": 7}
    )
    assert calibration_options(given) == {"warmup_rounds": 1}
    fedavg = TrainConfig(
        algorithm="fedavg", mode="batch", secure=False, options={"local_epochs": 1}
    )
    assert calibration_options(fedavg) == {"local_epochs": 1}


def test_report_only_counts_diverged_tuning_runs_and_never_loses_ended_runs(tiny, tmp_path, capsys):
    # a factor of 1e6 makes every method's second candidate diverge within 2 epochs
    command = ["reproduce", "tiny", "--tune", "--tune-factors", "1e6", "--epochs", "2",
               "--seeds", "0", "--dataset", "digits", "--workers", "1",
               "--out", str(tmp_path)]  # fmt: skip
    main(command)
    recorded = json.loads((tmp_path / "diverged.json").read_text())
    assert any(name.startswith("tune/") for name in recorded), recorded
    files = ("results.md", "results.csv", "tuning.csv")
    before = {name: (tmp_path / name).read_bytes() for name in files}
    capsys.readouterr()

    # the report of the same folders is the run's own: the diverged tuning runs ended
    main([*command, "--report-only"])
    assert "unfinished" not in capsys.readouterr().out
    assert {name: (tmp_path / name).read_bytes() for name in files} == before

    # a cell's folder gone: the report would end fewer runs, so it replaces nothing
    shutil.move(tmp_path / "cells" / "classes-2" / "fedavg", tmp_path / "moved")
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--report-only"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fewer than the 2" in err[0] and "left as they are" in err[0], err
    assert {name: (tmp_path / name).read_bytes() for name in files} == before
