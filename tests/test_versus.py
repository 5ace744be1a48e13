"""Table I's comparison: one column against every other, paired by seed, each method at
its own rate, with whether each run converged (stratify.reproduce.versus)."""

from stratify.reproduce.results import CSV_FIELDS
from stratify.reproduce.tables import schedule_report, table1_report
from stratify.reproduce.versus import VERSUS_HEADER, versus_counts, versus_lines


def run(row, column, label, seed, last, converged="", status="finished", final=None):
    """A row of a grid's results.csv (every field, empty where not set here)."""
    return dict.fromkeys(CSV_FIELDS, "") | {
        "tuned": "False",
        "row": {"classes-1": "#C=1", "iid": "IID"}[row],
        "partition": {"classes-1": "classes:1", "iid": "iid"}[row],
        "column": label,
        "seed": str(seed),
        "status": status,
        "epochs": "30",
        "last_mean_accuracy": str(last),
        "last_std_accuracy": "0.01",
        "final_accuracy": str(last if final is None else final),
        "best_accuracy": str(last + 0.01),
        "best_epoch": "25",
        "converged_epoch": converged,
        "classes": "10",
        "sample_gradients_per_round": "7200.0",
        "transfers_per_epoch": "20.0",
        "run_dir": f"grid/cells/{row}/{column}/seed-{seed}",
    }


def rows():
    """Stratify at 97-98% and converged; FedAvg near chance on #C=1 and never converged;
    FedAvg level on IID; SFL diverged on one seed of IID."""
    out = []
    for seed, (ours, theirs) in enumerate([(0.97, 0.15), (0.98, 0.12), (0.975, 0.18)]):
        out.append(run("classes-1", "stratify", "Stratify", seed, ours, converged="22"))
        out.append(run("classes-1", "fedavg", "FedAvg", seed, theirs))
    for seed, (ours, theirs) in enumerate([(0.980, 0.981), (0.982, 0.980), (0.981, 0.981)]):
        out.append(run("iid", "stratify", "Stratify", seed, ours, converged=str(20 + seed)))
        out.append(run("iid", "fedavg", "FedAvg", seed, theirs, converged="24"))
        out.append(run("iid", "sfl", "SFL", seed, 0.9, status="diverged" if seed else "finished"))
    return out


def test_every_other_column_against_the_reference_paired_by_seed():
    lines = versus_lines(rows(), "stratify", {("classes-1", "stratify"): "98.80%, E4"})
    verdict = VERSUS_HEADER.index("verdict")
    converged = VERSUS_HEADER.index("converged by the cap (seeds, epoch): reference / other")
    table = {(line[0], line[1]): line for line in lines}
    assert list(table) == [("#C=1", "FedAvg"), ("IID", "FedAvg"), ("IID", "SFL")]
    # #C=1: differences +82, +86, +79.5 points: mean 82.5, s = 3.279, t(0.975, 2) = 4.303
    # -> half-width 4.303 · 3.279 / √3 = 8.145
    first = table[("#C=1", "FedAvg")]
    assert first[4] == "+82.50 [+74.36, +90.64]"
    assert first[verdict] == ("ahead at each one's own rate; FedAvg not converged on every seed")
    assert first[converged] == "3/3 (E22) / 0/3"
    assert first[VERSUS_HEADER.index("paper: reference / other")] == "98.80%, E4 / –"
    # IID: differences −0.1, +0.2, 0 points: inside ±1 point
    iid = table[("IID", "FedAvg")]
    assert iid[verdict] == "level at each one's own rate; both converged"
    assert iid[converged] == "3/3 (E20–22) / 3/3 (E24)"
    assert table[("IID", "SFL")][verdict] == "diverged (2 run(s) of 6)"
    assert versus_counts(lines) == "1 ahead, 0 behind, 1 level, 0 inconclusive, 1 diverged"


def test_the_table1_report_names_stratify_and_counts_the_verdicts():
    report = table1_report(rows())
    assert "| split | against | Stratify, % | other, % | Stratify − other" in report
    assert "Verdicts: 1 ahead, 0 behind, 1 level, 0 inconclusive, 1 diverged." in report
    # the paper's figure beside ours, from the grid's own table of them
    assert "98.80%, E4 / 18.71%, E10" in report


def test_a_grid_without_the_paper_s_figures_shows_no_paper_column():
    report = schedule_report(rows())
    header = next(line for line in report.splitlines() if line.startswith("| split |"))
    assert "paper" not in header and "| verdict |" in header
    line = next(line for line in report.splitlines() if line.startswith("| #C=1 | FedAvg |"))
    # every line has the header's cells: split, against, ..., transfers
    assert line.count("|") == header.count("|")
    assert "– / –" not in line
    assert "Verdicts: 1 ahead, 0 behind, 1 level, 0 inconclusive, 1 diverged." in report


def test_a_run_s_converged_epoch_is_where_the_plateau_rule_first_holds():
    from stratify.config import TrainConfig
    from stratify.reproduce.grids import Cell, Column, Row
    from stratify.reproduce.results import CellResult, converged_epoch

    config = TrainConfig(dataset="digits", mode="batch", epochs=30, secure=False)
    cell = Cell(Row("r", "r"), Column("c", "c"), 0, config)

    def result(validation):
        records = tuple({"epoch": e, "validation_accuracy": v} for e, v in enumerate(validation, 1))
        return CellResult(cell, "finished", records, 0.01, classes=10)

    # 10% a round up to 90% in round 9, then flat: at round 20 the best of rounds 11-20
    # is that of rounds 1-10 and their median is the best (w = 10)
    climbing = [0.1 * k for k in range(1, 10)] + [0.9] * 21
    assert converged_epoch(result(climbing)) == 20
    # still climbing at the cap, or an epoch without a validation accuracy: none
    assert converged_epoch(result([0.3 + 0.02 * k for k in range(30)])) is None
    assert converged_epoch(result([*climbing[:-1], None])) is None


def test_the_reference_is_reported_over_each_pair_s_own_seeds():
    """Where the reference ran more seeds (the sequential design extended another pair),
    a line's reference figures are those of the seeds the pair shares, the ones its
    difference subtracts from."""
    runs = [run("iid", "stratify", "Stratify", seed, 0.98, converged="21") for seed in range(2)]
    runs += [run("iid", "stratify", "Stratify", 2, 0.90, converged="")]
    runs += [run("iid", "fedavg", "FedAvg", seed, 0.97, converged="24") for seed in range(2)]
    (line,) = versus_lines(runs, "stratify")
    assert line[2] == "98.00 ± 0.00"  # not 95.33, the mean over all three of its seeds
    assert line[4].startswith("+1.00 ")
    converged = VERSUS_HEADER.index("converged by the cap (seeds, epoch): reference / other")
    assert line[converged] == "2/2 (E21) / 2/2 (E24)"
