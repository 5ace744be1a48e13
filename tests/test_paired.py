"""Matched comparisons: each method against its base with the same local training."""

import csv
import dataclasses
import json

import pytest
from conftest import assert_refused_in_one_line

from stratify.algorithms import ALGORITHMS, build_strategy, strategy_class
from stratify.comparison import LOCAL_TRAINING, comparator_for, matched_config
from stratify.config import TrainConfig
from stratify.data.datasets import load_dataset
from stratify.errors import ConfigError
from stratify.parallel import LocalBackend, folder_state
from stratify.reproduce.grids import GRIDS, Grid, Settings, paired_column, partition_row, plan_cells
from stratify.reproduce.paired import pair_budgets, paired_difference
from stratify.reproduce.results import rate_regime
from stratify.reproduce.runner import plan_runs, reproduce
from stratify.reproduce.sequential import extension
from stratify.reproduce.tuning import Choice, Tuning, tuned_cells, tuning_cells
from stratify.runfiles import read_records


def test_every_method_with_a_base_has_one_and_the_rest_are_refused_in_one_line():
    for method in ALGORITHMS:
        mode = "batch"
        if strategy_class(method).card.comparison.comparator is not None:
            base, options = comparator_for(method, {}, mode)
            assert base == strategy_class(method).card.comparison.comparator
            resolved = build_strategy(method, {}, mode).options
            for name in LOCAL_TRAINING:
                if name == "weighting" and method == "scaffold":
                    continue  # SCAFFOLD averages Δy uniformly whatever its option says
                assert options.get(name) == getattr(resolved, name, None), (method, name)
        else:
            with pytest.raises(ConfigError, match="no matched comparator") as error:
                comparator_for(method, {}, mode)
            assert "\n" not in str(error.value)


def test_comparators_by_hand():
    # FedBSS: its paper's SGD, E = 10 of batch 64, 10% of the clients, equal weights
    assert comparator_for("fedbss", {"warmup_rounds": 3}) == (
        "fedavg",
        {
            "local_epochs": 10,
            "local_batch_size": 64,
            "local_momentum": 1e-4,
            "local_weight_decay": 1e-5,
            "client_fraction": 0.1,
            "weighting": "equal",
        },
    )
    # FedBR: K = 20 iterations of 64 in place of epochs, plain SGD (official d382a37)
    base, options = comparator_for("fedbr", {})
    assert base == "fedavg" and options["local_steps"] == 20 and "local_epochs" not in options
    assert options["local_momentum"] == 0.0 and options["weighting"] == "equal"
    # SCAFFOLD: plain SGD, and its uniform average of Δy is equal weighting
    assert comparator_for("scaffold", {})[1]["weighting"] == "equal"
    # FedDiverse: FedAvgM with its β 0.95 and 4 of 10 clients drawn uniformly
    base, options = comparator_for("feddiverse", {"dht": "known"})
    assert base == "fedavgm" and options["server_momentum"] == 0.95
    assert options["client_fraction"] == 0.375 and options["local_batch_size"] == 28
    # what is given to the method is given to its comparator, the mechanism is not
    base, options = comparator_for("fedprox", {"mu": 0.5, "local_epochs": 2})
    assert base == "fedavg" and options["local_epochs"] == 2 and "mu" not in options


def test_matched_config_copies_the_resolved_rate_rounds_and_seed():
    config = TrainConfig(
        algorithm="fedbr",
        dataset="digits",
        partition="iid",
        clients=4,
        mode="batch",
        epochs=7,
        seed=5,
        secure=False,
    )
    matched = matched_config(config)
    # FedBR's own rate on the digits, as its run resolves it
    own = strategy_class("fedbr").card.rates.tuned["digits", "batch"]
    assert (matched.algorithm, matched.lr, matched.lr_schedule) == ("fedavg", own, "constant")
    assert (matched.epochs, matched.seed, matched.clients) == (7, 5, 4)
    assert matched.partition == "iid" and matched.out is None
    assert matched_config(TrainConfig(**{**vars(config), "lr": 0.05})).lr == 0.05


def test_paired_difference_with_its_t_interval_by_hand():
    # differences 0.01, 0.02, 0.03: mean 0.02, s = 0.01, t(0.975, 2) = 4.302653
    result = paired_difference({0: 0.51, 1: 0.62, 2: 0.73}, {0: 0.50, 1: 0.60, 2: 0.70, 3: 0.9})
    assert result is not None and result.seeds == 3
    assert result.mean == pytest.approx(0.02)
    assert result.half_width == pytest.approx(4.302653 * 0.01 / 3**0.5, rel=1e-5)
    single = paired_difference({0: 0.5}, {0: 0.25})
    assert single is not None and single.interval is None and single.mean == 0.25
    assert paired_difference({0: 0.5}, {1: 0.5}) is None


def budgets_by_hand(grid: str, n: int) -> dict[str, float]:
    """Sample-gradients a round of each method of ``grid`` takes on ``n`` training samples,
    from the grid's settings and the methods' papers: participants × local epochs × the
    mean client size ``n / K`` (or participants × K_steps × B)."""
    if grid == "paired":  # 10 clients in every row, E = 1 where the grid sets it
        return {
            "FedProx": 10 * 1 * n / 10,
            "SCAFFOLD": 10 * 1 * n / 10,
            "FedAvgM": 10 * 1 * n / 10,
            "LfD": 10 * 1 * n / 10,
            "FedBSS": 1 * 10 * n / 10,  # C = 0.1 of 10 clients, its paper's E = 10
            "FedBR": 10 * 20 * 64,  # every client, K = 20 iterations of 64
            "FedDiverse": 4 * 1 * n / 10,  # round(0.375 · 10) = 4 clients a round
        }
    raise AssertionError(f"no budgets by hand for grid {grid}")  # seed-papers: test_seed_papers


@pytest.mark.parametrize("grid", ["paired"])
def test_every_pair_plans_equal_sample_gradients_per_round(tmp_path, grid):
    cells, notes = plan_cells(GRIDS[grid], Settings(dataset="digits", seeds=(0, 1)), tmp_path)
    budgets = pair_budgets(cells)
    methods = {cell.column.key for cell in cells if cell.comparator is not None}
    assert len(budgets) == len({(c.row.key, c.column.key) for c in cells if c.comparator})
    hand = budgets_by_hand(grid, len(load_dataset("digits").y_train))
    assert methods and {budget.method.split(" (")[0] for budget in budgets} == set(hand)
    for budget in budgets:
        expected = pytest.approx(hand[budget.method.split(" (")[0]])
        assert budget.method_sample_gradients == expected, budget
        assert budget.comparator_sample_gradients == expected, budget
    # several methods share FedAvg with NIID-Bench's SGD: it is planned once per row and seed
    if grid == "paired":
        keys = {(c.row.key, c.comparator) for c in cells if c.column.key in ("fedprox", "fedavgm")}
        assert len(keys) == len(GRIDS[grid].rows)
        assert any("FedTAN" in note and "BatchNorm" in note for note in notes)


def test_asking_for_a_method_without_a_base_leaves_it_out_with_a_note(tmp_path):
    settings = Settings(dataset="digits", seeds=(0,), methods=("stratify", "sfl", "fedprox"))
    cells, notes = plan_cells(GRIDS["paired"], settings, tmp_path)
    assert {cell.config.algorithm for cell in cells} == {"fedprox", "fedavg"}
    assert any(note.startswith("Stratify: no matched comparator") for note in notes)
    assert any(note.startswith("SFL: no matched comparator") for note in notes)
    with pytest.raises(ConfigError, match="no cell can run here"):
        plan_cells(GRIDS["paired"], Settings(seeds=(0,), methods=("stratify",)), tmp_path)


TINY_PAIRED = Grid(
    "tiny-paired",
    "FedProx and FedAvgM against FedAvg on digits",
    {"dataset": "digits", "mode": "batch", "epochs": 3, "clients": 4},
    (partition_row("dirichlet:0.5", "Dir(0.5)"),),
    (
        paired_column("fedprox", local_epochs=1, local_batch_size=32),
        paired_column("fedavgm", local_epochs=1, local_batch_size=32),
    ),
)


def test_a_paired_grid_runs_each_shared_comparator_once_and_tables_the_difference(
    monkeypatch, tmp_path
):
    monkeypatch.setitem(GRIDS, "tiny-paired", TINY_PAIRED)
    report = reproduce("tiny-paired", tmp_path, Settings(seeds=(0, 1)), backend=LocalBackend(1))
    # FedProx and FedAvgM share FedAvg with batch 32, one epoch: 3 × 2 seeds, not 4 × 2
    assert len(report.cells) == 6
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    assert all(row["status"] == "finished" for row in rows)
    roles = sorted(row["role"] for row in rows)
    assert roles == ["comparator"] * 2 + ["method"] * 4
    comparator = {row["seed"]: row for row in rows if row["role"] == "comparator"}
    for row in rows:
        if row["role"] == "method":
            matched = comparator[row["seed"]]
            assert row["comparator"] == matched["run_dir"].split("/")[-2]
            # the same local work: every client's data once a round, in both runs
            assert row["sample_gradients_per_round"] == matched["sample_gradients_per_round"]
    table = (tmp_path / "results.md").read_text()
    line = next(line for line in table.splitlines() if line.startswith("| Dir(0.5) | FedProx |"))
    ours = [float(r["last_mean_accuracy"]) for r in rows if r["algorithm"] == "fedprox"]
    theirs = [
        float(comparator[r["seed"]]["last_mean_accuracy"])
        for r in rows
        if r["algorithm"] == "fedprox"
    ]
    difference = paired_difference(dict(enumerate(ours)), dict(enumerate(theirs)))
    assert difference is not None
    assert f"{100 * difference.mean:+.2f}".replace("-", "−") in line
    assert "chosen on the test set" in table
    for row in rows:
        assert len(read_records(row["run_dir"])) == 3


def test_paired_dry_run_lists_every_pair_with_equal_budgets(capsys, tmp_path):
    from stratify.cli.main import main

    main(["reproduce", "paired", "--out", str(tmp_path), "--dataset", "digits", "--dry-run"])
    err = capsys.readouterr().err
    pairs = [line for line in err.splitlines() if " vs " in line]
    assert len(pairs) == 5 * 7  # five splits, seven methods (FedTAN needs BatchNorm)
    assert all("sample-gradients per round each" in line for line in pairs)
    assert "UNEQUAL" not in err
    # --dataset replaces FedDiverse's own colored-mnist too: its label says so
    assert "FedDiverse (digits) vs" in err and "colored-mnist" not in err


UNEQUAL_PAIRED = Grid(
    "unequal-paired",
    "a method whose clients do twice the work its options (and its comparator) plan",
    {"dataset": "digits", "mode": "batch", "epochs": 2, "clients": 4},
    (partition_row("iid", "IID"),),
    (
        paired_column("double-work-fedprox", "Double-work FedProx", local_epochs=1),
        paired_column("fedprox", local_epochs=1),
    ),
)


def test_a_paired_dry_run_flags_a_pair_whose_budgets_differ(monkeypatch, capsys, tmp_path):
    from stratify.cli.main import main

    monkeypatch.setitem(ALGORITHMS, "double-work-fedprox", "toy_methods:DoubleWorkFedProx")
    monkeypatch.setitem(GRIDS, "unequal-paired", UNEQUAL_PAIRED)
    main(["reproduce", "unequal-paired", "--out", str(tmp_path), "--seeds", "0", "--dry-run"])
    pairs = [line for line in capsys.readouterr().err.splitlines() if " vs " in line]
    # every client's data once a round is 1437 samples; the toy's clients pass it twice
    assert pairs == [
        "IID · Double-work FedProx vs FedAvg (matched): UNEQUAL: 2,874 against 1,437 "
        "sample-gradients per round",
        "IID · FedProx vs FedAvg (matched): 1,437 sample-gradients per round each",
    ]


def test_a_tuned_plateau_paired_grid_keeps_each_pair_matched(monkeypatch, tmp_path):
    """--tune on a paired grid tunes the comparators only, and each method steps at its
    comparator's rate, and again at its own (untuned) rate in a column of its own;
    --plateau stops each comparator where its validation accuracy plateaued, and its
    methods run exactly the rounds it ran, seed by seed."""
    grid = Grid(
        "tiny-plateau",
        "",
        {"dataset": "digits", "mode": "batch", "epochs": 40, "clients": 4},
        (partition_row("iid", "IID"),),
        (
            paired_column("fedprox", local_epochs=1, local_batch_size=32),
            paired_column("fedavgm", local_epochs=1, local_batch_size=32),
        ),
    )
    monkeypatch.setitem(GRIDS, "tiny-plateau", grid)
    tuning = Tuning(factors=(1.0, 3.0), epochs=2, widen=0)
    report = reproduce(
        "tiny-plateau",
        tmp_path,
        Settings(seeds=(0, 1), plateau=3),
        tuning=tuning,
        backend=LocalBackend(1),
    )
    tuned = sorted(path.parent.parent.name for path in (tmp_path / "tune").rglob("config.json"))
    assert len(tuned) == 2 and all(name.startswith("fedavg-matched-") for name in tuned)
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    comparator = {row["seed"]: row for row in rows if row["role"] == "comparator"}
    own = [row for row in rows if row["column"].endswith("(own rate)")]
    matched = [row for row in rows if row not in own]
    assert len({row["lr"] for row in matched}) == 1  # the comparator's chosen rate, for all
    assert all(row["tuned"] == "True" for row in matched)
    # the own-rate columns: each method's default here, untuned, beside the same comparator
    assert (
        sorted(row["column"] for row in own)
        == ["FedAvgM (own rate)"] * 2 + ["FedProx (own rate)"] * 2
    )
    for row in own:
        default = strategy_class(row["algorithm"]).card.rates.tuned["digits", "batch"]
        assert float(row["lr"]) == default and row["tuned"] == "False"
        assert row["comparator"] == comparator[row["seed"]]["run_dir"].split("/")[-2]
    rounds = set()
    for row in rows:
        records = read_records(row["run_dir"])
        assert all(record["validation_accuracy"] is not None for record in records)
        matched = read_records(comparator[row["seed"]]["run_dir"])
        assert len(records) == len(matched)
        rounds.add(len(records))
    assert rounds and max(rounds) <= 40 and min(rounds) >= 3
    assert any(len(read_records(r["run_dir"])) < 40 for r in comparator.values())
    table = (tmp_path / "results.md").read_text()
    line = next(line for line in table.splitlines() if line.startswith("| IID | FedProx |"))
    assert "plateaued, cap 40)" in line and "at the base's rate" in line
    matched_table, own_table = table.split("Each method at its own rate", 1)
    assert "(own rate)" not in matched_table
    line = next(line for line in own_table.splitlines() if line.startswith("| IID | FedProx"))
    assert "FedProx (own rate)" in line and "at each one's own rate" in line
    assert len(report.cells) == 10

    # a dry run reads the folders as the run does: the rates chosen, each method at the
    # rounds its comparator ran, so nothing is left (it counted each method to the cap)
    settings = Settings(seeds=(0, 1), plateau=3)
    cells, _ = plan_cells(grid, settings, tmp_path, own_rates=True)
    planned = plan_runs(grid, cells, settings, tuning, tmp_path)
    assert not planned.tuning_open and not planned.diverged
    assert [title for title, _ in planned.phases] == ["comparators", "methods"]
    specs = [spec for _, phase in planned.phases for spec in phase]
    assert len(specs) == 10 and all(folder_state(s.config).kind == "finished" for s in specs)


def test_plateau_needs_a_paired_grid_and_a_cap_above_r_min(capsys, tmp_path):
    command = ["reproduce", "table1", "--out", str(tmp_path / "x"), "--plateau", "5"]
    assert_refused_in_one_line(capsys, command + ["--dry-run"], "no comparators", tmp_path / "x")
    command = ["reproduce", "paired", "--out", str(tmp_path / "x"), "--plateau", "30"]
    command += ["--dataset", "digits", "--dry-run"]
    assert_refused_in_one_line(capsys, command, "the cap (--epochs) is 20", tmp_path / "x")
    # FedBSS's stage 2 starts after its 5 warm-up rounds: a shorter pair would compare nothing
    command = ["reproduce", "paired", "--out", str(tmp_path / "x"), "--plateau", "4"]
    command += ["--dataset", "digits", "--methods", "fedbss", "--dry-run"]
    assert_refused_in_one_line(capsys, command, "give --plateau 7 or more", tmp_path / "x")


def test_summary_json_of_a_comparator_names_its_matched_options(tmp_path):
    config = matched_config(
        TrainConfig(
            algorithm="lfd",
            dataset="digits",
            partition="iid",
            clients=2,
            mode="batch",
            epochs=1,
            secure=False,
        )
    )
    assert json.dumps(config.options, sort_keys=True) == json.dumps(
        {
            "client_fraction": 1.0,
            "local_batch_size": 128,
            "local_epochs": 10,
            "local_momentum": 0.9,
            "local_weight_decay": 1e-5,
            "weighting": "samples",
        },
        sort_keys=True,
    )


def test_report_only_tables_a_grid_stopped_part_way_and_runs_nothing(monkeypatch, tmp_path):
    monkeypatch.setitem(GRIDS, "tiny-paired", TINY_PAIRED)
    settings = Settings(seeds=(0, 1))
    reproduce("tiny-paired", tmp_path, settings, backend=LocalBackend(1))
    full = (tmp_path / "results.md").read_text()
    # one comparator run cut after its first epoch: the report says so, trains nothing,
    # and compares no pair at unequal rounds
    lost = next((tmp_path / "cells").glob("*/fedavg-matched-*/seed-1"))
    metrics = lost / "metrics.jsonl"
    metrics.write_text(metrics.read_text().splitlines(keepends=True)[0])
    # a grid stopped part way has written no tables yet (a report with fewer ended runs
    # than the results.csv it would replace is refused: test_reproduce.py)
    (tmp_path / "results.csv").unlink()
    (tmp_path / "results.md").unlink()
    report = reproduce("tiny-paired", tmp_path, settings, report_only=True)
    assert [result.cell.key for result in report.failed] == [
        f"dirichlet-0-5/{lost.parent.name}/seed-1"
    ]
    assert len(read_records(lost)) == 1
    partial = (tmp_path / "results.md").read_text()
    assert partial != full and "(1 of 2 seeds)" in partial


def test_a_plateau_dry_run_calibrates_on_runs_that_never_stop_early(capsys, tmp_path):
    # the calibration runs time CALIBRATION_EPOCHS epochs: with the plateau rule kept,
    # their cap (3) fell below R_min and the dry run refused its own calibration runs
    from stratify.cli.main import main

    command = ["reproduce", "paired", "--out", str(tmp_path), "--dataset", "digits"]
    command += ["--methods", "fedprox", "--seeds", "0", "--plateau", "5", "--epochs", "10"]
    main(command + ["--dry-run", "--workers", "1"])
    err = capsys.readouterr().err
    assert "estimated" in err and "error" not in err


def test_a_first_stage_report_writes_no_tables(monkeypatch, tmp_path):
    # --seeds-until-verdict: the first stage's report plans the second and writes nothing,
    # so a report-only pass over an extended grid is not refused as "fewer runs than the
    # results.csv" the second stage wrote; the second stage writes both stages' tables
    monkeypatch.setitem(GRIDS, "tiny-paired", TINY_PAIRED)
    settings = Settings(seeds=(0, 1))
    first = reproduce("tiny-paired", tmp_path, settings, backend=LocalBackend(1), write=False)
    assert len(first.results) == 6 and not first.failed  # 2 methods, 1 shared comparator
    assert not (tmp_path / "results.csv").exists() and not (tmp_path / "results.md").exists()
    key = next(cell.group for cell in first.cells if cell.comparator is not None)
    extended = dataclasses.replace(settings, extended={key: 3})
    second = reproduce("tiny-paired", tmp_path, extended, backend=LocalBackend(1))
    # seed 2 for one method and the comparator it shares with the other
    assert len(second.results) == 8 and (tmp_path / "results.csv").exists()
    again = reproduce("tiny-paired", tmp_path, settings, report_only=True, write=False)
    assert len(again.results) == 6  # no refusal: nothing is written


def test_own_rate_cells_copy_each_method_cell_and_keep_its_rate_out_of_tuning(tmp_path):
    grid = GRIDS["paired"]
    settings = Settings(seeds=(0, 1), methods=("fedprox",))
    plain, _ = plan_cells(grid, settings, tmp_path)
    cells, _ = plan_cells(grid, settings, tmp_path, own_rates=True)
    methods = [cell for cell in plain if cell.comparator is not None]
    own = [cell for cell in cells if cell.column.own_rate]
    assert len(cells) == len(plain) + len(methods) and len(own) == len(methods)
    for cell in own:
        assert cell.column.key == "fedprox-own-rate" and cell.column.label == "FedProx (own rate)"
        assert cell.config.out.endswith(f"/{cell.row.key}/fedprox-own-rate/seed-{cell.seed}")
        # its own rate group: tuning neither runs for it nor replaces its rate
        assert cell.rate_group == cell.group != f"{cell.row.key}/{cell.comparator}"
    assert not set(tuning_cells(cells)) & {cell.group for cell in own}
    chosen = {group: Choice(group, 0.1, 0.123, ()) for group in tuning_cells(cells)}
    tuned = {cell.key: cell.config.lr for cell in tuned_cells(cells, chosen)}
    assert all(tuned[cell.key] == cell.config.lr != 0.123 for cell in own)
    assert all(tuned[cell.key] == 0.123 for cell in cells if not cell.column.own_rate)


@pytest.mark.parametrize(
    ("method", "comparator", "regime"),
    [
        ("True", "True", "at the base's rate"),
        ("False", "False", "at the method's rate"),
        ("False", "True", "at each one's own rate"),
    ],
)
def test_the_rate_regime_of_a_pair_by_hand(method, comparator, regime):
    assert rate_regime([{"tuned": method}], [{"tuned": comparator}]) == regime


def test_the_sequential_design_adds_seeds_to_matched_pairs_only():
    def runs(column, role, values, comparator=""):
        return [
            {
                "run_dir": f"out/cells/iid/{column}/seed-{seed}",
                "role": role,
                "comparator": comparator,
                "column": "FedAvg (matched)" if role == "comparator" else column,
                "seed": str(seed),
                "stage": "1",
                "status": "finished",
                "epochs": "20",
                "last_mean_accuracy": str(value),
                "classes": "10",
            }
            for seed, value in enumerate(values)
        ]

    # a noisy difference: the first stage's spread calls for more seeds
    rows = runs("fedavg-matched-x", "comparator", [0.80, 0.90, 0.70, 0.85, 0.75])
    rows += runs("fedprox", "method", [0.82, 0.86, 0.75, 0.83, 0.80], "fedavg-matched-x")
    rows += runs("fedprox-own-rate", "method", [0.82, 0.86, 0.75, 0.83, 0.80], "fedavg-matched-x")
    plan = extension(rows, 10)
    assert "iid/fedprox" in plan and not any("own-rate" in group for group in plan)
