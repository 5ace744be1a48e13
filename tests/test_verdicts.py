"""Verdict words and the plateau budget of paired comparisons, on hand-computed cases."""

import statistics

import pytest

from stratify.errors import ConfigError
from stratify.measures import PlateauBudget, PlateauRule, plateau_budget
from stratify.reproduce.paired import PairedDifference, paired_difference, verdict


def interval(low_points: float, high_points: float, seeds: int = 5) -> PairedDifference:
    """A difference whose 95% interval is [low, high] points."""
    middle, half = (low_points + high_points) / 200, (high_points - low_points) / 200
    return PairedDifference(middle, half, seeds)


@pytest.mark.parametrize(
    "low, high, word",
    [
        (-0.9, 0.8, "level"),  # inside ±1 point
        (0.2, 0.8, "level"),  # excludes 0, but the effect is below a point
        (1.5, 4.0, "ahead"),
        (0.5, 1.5, "ahead"),  # above zero, reaches past +1
        (-6.0, -2.0, "behind"),
        (-9.9, 1.9, "inconclusive"),  # FedBR's −4.0 [−9.9, +1.9]: holds zero, wider than ±1
        (-1.2, 0.3, "inconclusive"),
    ],
)
def test_verdict_from_the_interval(low, high, word):
    assert verdict(interval(low, high), 0.9, 0.85, classes=10).word == word


def test_both_runs_near_chance_is_inconclusive_whatever_the_interval():
    # FedBSS #C=1: 10.0% and 10.0% on ten classes, "+0.00 [0, 0]"
    result = verdict(interval(0.0, 0.0), 0.10, 0.10, classes=10)
    assert (result.word, result.reason) == ("inconclusive", "both runs near chance")
    # one run 5 points from chance is still near it; 5.1 points is not
    assert verdict(interval(2.0, 4.0), 0.15, 0.12, classes=10).word == "inconclusive"
    assert verdict(interval(2.0, 4.0), 0.151, 0.12, classes=10).word == "ahead"
    # two classes: chance is 50%
    assert verdict(interval(2.0, 4.0), 0.53, 0.51, classes=2).word == "inconclusive"
    assert verdict(interval(2.0, 4.0), 0.53, 0.51, classes=10).word == "ahead"


def test_both_worst_groups_near_zero_is_inconclusive_not_level():
    # FedDiverse on colored-mnist #C=1: both runs get a whole group wrong (0.00% and 0.00%)
    result = verdict(interval(0.0, 0.0), 0.0, 0.0, classes=10, worst_group=True)
    assert (result.word, result.reason) == ("inconclusive", "both runs' worst group near 0")
    assert verdict(interval(0.0, 0.0), 0.0, 0.0, classes=10).word == "level"  # a mean accuracy
    # 5 points from 0 is still near it; one run past it is judged by the interval
    assert verdict(interval(-0.5, 0.5), 0.05, 0.03, 10, worst_group=True).word == "inconclusive"
    assert verdict(interval(-0.5, 0.5), 0.051, 0.03, 10, worst_group=True).word == "level"


def test_one_seed_or_none_has_no_verdict():
    assert verdict(paired_difference({0: 0.9}, {0: 0.5}), 0.9, 0.5, 10).word == "inconclusive"
    assert verdict(None, None, None, None).reason == "fewer than two seeds"


def test_verdict_of_a_computed_difference():
    # differences +1, +3, +5 points: mean 3, s = 2, t(0.975, 2)·2/√3 = 4.97 -> [−1.97, +7.97]
    difference = paired_difference({0: 0.91, 1: 0.93, 2: 0.95}, {0: 0.90, 1: 0.90, 2: 0.90})
    assert (
        str(verdict(difference, 0.93, 0.90, 10)) == "inconclusive (interval wider than the effect)"
    )
    # +3, +3.1, +2.9: s = 0.1 -> 3 ± 0.25: [+2.75, +3.25]
    difference = paired_difference({0: 0.93, 1: 0.931, 2: 0.929}, {0: 0.90, 1: 0.90, 2: 0.90})
    assert str(verdict(difference, 0.93, 0.90, 10)) == "ahead"


ACCURACIES = [0.1, 0.5, 0.8, 0.9, 0.95, 0.96, 0.962, 0.963, 0.963, 0.963]


def test_converged_once_no_new_best_for_a_window_and_the_median_is_near_the_best():
    # the 10% window alone: w = ceil(0.1·r) = 1 up to round 10, so patience is one round:
    # round 5 sets a best 5 points above round 4's, round 6 one point, round 7 0.2 (less
    # than 0.5: no new best) and its median (itself) is the best -> converged at 7
    rule = PlateauRule(5, 50, minimum_window=1)
    assert plateau_budget(ACCURACIES, rule) == PlateauBudget(7, "plateau", 5, 50)
    # R_min 8: not before round 8 (gain 0.1 point)
    rule = PlateauRule(8, 50, minimum_window=1)
    assert plateau_budget(ACCURACIES, rule) == PlateauBudget(8, "plateau", 8, 50)
    # the default window is at least 10 rounds, and a run is undecided before two
    # windows: at round 20 the best of rounds 11-20 (96.3) is no higher than that of
    # rounds 1-10 and their median is the best
    assert plateau_budget(ACCURACIES, PlateauRule(5, 50)) is None
    assert plateau_budget([*ACCURACIES, *[0.963] * 9], PlateauRule(5, 50)) is None
    assert plateau_budget([*ACCURACIES, *[0.963] * 10], PlateauRule(5, 50)).rounds == 20


def test_a_declining_run_is_not_converged():
    # up to 90% in round 10, then one point lower every round: the median of the last
    # rounds gains nothing on the rounds before (the earlier rule stopped it at round 21,
    # 11 points below its best), but it sits ever further below the best: on to the cap
    declining = [0.1 + 0.08 * r for r in range(1, 11)] + [0.9 - 0.01 * k for k in range(1, 41)]
    assert plateau_budget(declining, PlateauRule(20, 50)) == PlateauBudget(50, "cap", 20, 50)
    # a collapse to chance in rounds 21-30 and a recovery to its old level: from R_min 25
    # not converged in the collapse, converged once the median of the last 10 rounds is
    # back at its best (round 36: rounds 27-36 hold four rounds at 10%, six at 90%)
    collapse = [0.9] * 20 + [0.1] * 10 + [0.9] * 20
    assert plateau_budget(collapse[:35], PlateauRule(25, 50)) is None
    assert plateau_budget(collapse, PlateauRule(25, 50)) == PlateauBudget(36, "plateau", 25, 50)


def test_a_swinging_curve_that_climbs_goes_on():
    # one point a round, and every 7th round 20 points higher (a lucky round): every
    # window holds a new best and its median is 20 points below it, so to the cap
    swinging = [0.3 + 0.01 * r + (0.2 if r % 7 == 0 else 0.0) for r in range(40)]
    assert plateau_budget(swinging, PlateauRule(20, 40)) == PlateauBudget(40, "cap", 20, 40)


def test_one_round_dip_stops_nothing_and_one_lucky_round_keeps_a_run_going():
    # flat at 95% with a dip to 30% in round 20: the best of rounds 11-20 is that of
    # rounds 1-10 and their median is 95, but the dip is in the 3 last rounds a table
    # reports (mean 73.3) until round 23 -> converged at round 23
    flat = [0.95] * 30
    flat[19] = 0.30
    assert plateau_budget(flat, PlateauRule(20, 50)) == PlateauBudget(23, "plateau", 20, 50)
    # a peak to 99% in round 15: from round 25 on no new best, but the median sits 4
    # points below the best (more than the 2-point margin): on to the cap
    peak = [0.95] * 60
    peak[14] = 0.99
    assert plateau_budget(peak, PlateauRule(20, 60)) == PlateauBudget(60, "cap", 20, 60)
    assert plateau_budget(peak, PlateauRule(20, 60, margin_points=4.5)).rounds == 25
    # and a run at chance converges as soon as it has two windows, unless the rule knows
    # the chance level
    assert plateau_budget([0.1] * 25, PlateauRule(5, 50)) == PlateauBudget(20, "plateau", 5, 50)
    assert plateau_budget([0.1] * 25, PlateauRule(5, 50, chance=0.1)) is None


def test_a_swing_in_the_reported_last_rounds_is_not_converged():
    # flat at 95% for 30 rounds, then rounds 28-30 at 60%: the median of the last 10
    # rounds (seven at 95%) is the best, but the last 3 rounds a table reports average 60%,
    # 35 points below it; the median alone stopped such a run at round 30. It goes on
    # until the swing has left the reported rounds: round 34, whose last ceil(3.4) = 4
    # rounds (31-34) are back at 95% (round 33's last 4 still hold round 30)
    swing = [0.95] * 40
    swing[27:30] = [0.6, 0.6, 0.6]
    assert not PlateauRule(20, 50).converged(swing[:30])
    assert statistics.median(swing[20:30]) == 0.95
    assert plateau_budget(swing, PlateauRule(30, 50)) == PlateauBudget(34, "plateau", 30, 50)
    # one reported round 5 points down: mean 3.3 below -> not converged at 2 points, at 4 it is
    dip = [0.95] * 30
    dip[29] = 0.85
    assert not PlateauRule(30, 50).converged(dip)
    assert PlateauRule(30, 50, margin_points=4.0).converged(dip)


def test_a_run_that_has_not_left_chance_has_not_converged():
    # 10 classes: flat at 10-15% for 40 rounds, then climbing 2 points a round to 90%
    # (round 78) and flat there (FedAvgM with momentum at a small rate on digits does this)
    rule = PlateauRule(20, 200, chance=0.1)
    start = [0.1, 0.12, 0.15, 0.11] * 10
    curve = start + [min(0.9, 0.15 + 0.02 * r) for r in range(1, 100)]
    assert plateau_budget(start, rule) is None  # at chance: on, not stopped at round 20
    # converged once the 90% of round 78 lies before the window: round 88 (w = 10)
    assert plateau_budget(curve, rule) == PlateauBudget(88, "plateau", 20, 200)
    # a run that stays within 5 points of chance goes to the cap, one just above it stops
    assert plateau_budget([0.15] * 60, PlateauRule(20, 50, chance=0.1)).reason == "cap"
    assert plateau_budget([0.16] * 60, PlateauRule(20, 50, chance=0.1)).rounds == 20


def test_the_window_is_the_last_tenth_of_the_rounds():
    # 0.6 point a round up to round 20, then flat at 62%
    climbing = [0.5 + 0.006 * r for r in range(20)] + [0.62] * 10
    rule = PlateauRule(10, 100, minimum_window=1)
    assert rule.window_rounds(10) == 1 and rule.window_rounds(11) == 2
    assert rule.window_rounds(21) == 3
    # rounds 21-23 set a best 1.8, 1.2, 0.6 points above the rounds before their 3-round
    # window; round 24: its window (rounds 22-24, all 62%) adds nothing to round 21's 62%
    assert plateau_budget(climbing, rule) == PlateauBudget(24, "plateau", 10, 100)


def test_the_cap_stops_a_pair_that_never_converges():
    rising = [0.1 + 0.01 * r for r in range(30)]
    assert plateau_budget(rising, PlateauRule(5, 20)) == PlateauBudget(20, "cap", 5, 20)
    assert plateau_budget(rising[:19], PlateauRule(5, 20)) is None


@pytest.mark.parametrize("minimum, cap", [(0, 10), (11, 10)])
def test_a_rule_whose_bounds_cross_is_refused(minimum, cap):
    with pytest.raises(ConfigError, match="1 ≤ R_min ≤ cap"):
        PlateauRule(minimum, cap)


@pytest.mark.parametrize("field", ["gain_points", "margin_points"])
def test_a_rule_without_a_positive_gain_or_margin_is_refused(field):
    with pytest.raises(ConfigError, match="positive gain and margin"):
        PlateauRule(5, 10, **{field: 0.0})


def cell_results(row: str, method: str, ours: list[float], theirs: list[float], classes: int):
    """A paired method's and its comparator's results over seeds 0, 1, …: one epoch each
    at the accuracy given."""
    from stratify.config import TrainConfig
    from stratify.reproduce.grids import Cell, Column, Row
    from stratify.reproduce.results import CellResult

    config = TrainConfig(dataset="digits", mode="batch", epochs=1, secure=False)
    split = Row(row, row)
    column = Column(method, method, {"algorithm": method})
    base = Column("base", "FedAvg (matched)", {})
    results = []
    for seed, (a, b) in enumerate(zip(ours, theirs)):
        for cell, accuracy in (
            (Cell(split, column, seed, located(config, row, method, seed), comparator="base"), a),
            (Cell(split, base, seed, located(config, row, "base", seed)), b),
        ):
            record = {"epoch": 1, "test_accuracy": accuracy, "transfers": 2, "wall_seconds": 1}
            results.append(CellResult(cell, "finished", (record,), 0.01, classes=classes))
    return results


def located(config, row: str, column: str, seed: int):
    """``config`` of the seed, with a grid's run folder for its row, column and seed."""
    from dataclasses import replace

    return replace(config, seed=seed, out=f"grid/cells/{row}/{column}/seed-{seed}")


def csv_rows(results):
    """``results`` as a paired grid's results.csv holds them."""
    from stratify.reproduce.grids import Column, Grid
    from stratify.reproduce.results import csv_runs

    grid = Grid("paired", "a paired grid", {}, (), (Column("m", "m", paired=True),))
    return csv_runs(grid, results, False)


def test_the_paired_table_has_a_verdict_per_row_and_counts_them():
    from stratify.reproduce.results import PAIRED_HEADER, paired_lines, verdict_counts

    results = [
        *cell_results("Dir(0.5)", "FedProx", [0.93, 0.931, 0.929], [0.90] * 3, 10),
        *cell_results("Dir(0.1)", "FedProx", [0.80, 0.802, 0.801], [0.80, 0.801, 0.802], 10),
        *cell_results("#C=1", "FedProx", [0.10, 0.11, 0.10], [0.10, 0.10, 0.12], 10),
        *cell_results("IID", "FedProx", [0.50, 0.60, 0.70], [0.55, 0.55, 0.55], 10),
    ]
    lines = paired_lines(csv_rows(results), 3, "last_mean_accuracy")
    column = PAIRED_HEADER.index("verdict")
    assert [(line[0], line[column]) for line in lines] == [
        ("Dir(0.5)", "ahead at the method's rate"),
        ("Dir(0.1)", "level at the method's rate"),
        ("#C=1", "inconclusive at the method's rate (both runs near chance)"),
        ("IID", "inconclusive at the method's rate (interval wider than the effect)"),
    ]
    assert verdict_counts(lines) == (
        "1 ahead, 0 behind, 1 level, 2 inconclusive (1 with both runs near chance)"
    )


def test_the_worst_group_table_tells_two_runs_that_fail_a_group_from_level_ones():
    from stratify.reproduce.results import PAIRED_HEADER, paired_lines, verdict_counts

    results = [
        *cell_results("#C=1", "FedProx", [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], 10),
        *cell_results("IID", "FedProx", [0.45, 0.451, 0.449], [0.45, 0.451, 0.45], 10),
    ]
    runs = csv_rows(results)
    for run in runs:
        run["last_mean_worst_group_accuracy"] = run["last_mean_accuracy"]
    lines = paired_lines(runs, 3, "last_mean_worst_group_accuracy")
    column = PAIRED_HEADER.index("verdict")
    assert [line[column] for line in lines] == [
        "inconclusive at the method's rate (both runs' worst group near 0)",
        "level at the method's rate",
    ]
    assert verdict_counts(lines) == (
        "0 ahead, 0 behind, 1 level, 1 inconclusive (1 with both runs' worst group near 0)"
    )
    # the same values as mean accuracies are judged by the interval alone
    plain = paired_lines(runs, 3, "last_mean_accuracy")
    assert plain[0][column] == "level at the method's rate"


def test_a_pair_that_cannot_be_judged_gets_no_verdict_and_is_not_counted():
    from stratify.reproduce.results import PAIRED_HEADER, paired_lines, verdict_counts

    column = PAIRED_HEADER.index("verdict")

    def judged(change):
        runs = csv_rows(cell_results("IID", "FedProx", [0.93, 0.931, 0.929], [0.90] * 3, 10))
        for run in runs:
            change(run)
        lines = paired_lines(runs, 3, "last_mean_accuracy")
        return lines[0][column], verdict_counts(lines)

    def nothing(run):
        pass

    assert judged(nothing) == (
        "ahead at the method's rate",
        "1 ahead, 0 behind, 0 level, 0 inconclusive",
    )

    def tuned(run):
        run["tuned"] = "True"

    assert judged(tuned)[0] == "ahead at the base's rate"

    def diverged(run):
        if run["role"] == "method" and run["seed"] == "1":
            run["status"] = "diverged"

    assert judged(diverged) == (
        "diverged at this rate (1 run(s) of 6)",
        "0 ahead, 0 behind, 0 level, 0 inconclusive; not counted: 1 diverged",
    )

    def unmatched(run):
        if run["role"] == "comparator":
            run["column"] = "FedAvg (momentum=0.9)"

    assert judged(unmatched)[0] == "unmatched (comparator FedAvg (momentum=0.9))"

    def unequal(run):
        if run["role"] == "method" and run["seed"] == "2":
            run["epochs"] = "2"

    assert judged(unequal)[0] == "unequal (rounds differ within a seed)"

    def stopped(best, ended, cap="50", epochs="1"):
        def change(run):
            if run["role"] == "comparator":
                run.update(plateau="20", cap=cap, epochs=epochs)
                run.update(best_validation_accuracy=best, last_mean_validation_accuracy=ended)
            else:
                run["epochs"] = epochs

        return change

    # stopped 5.1 points below its best: not converged; 5.0 points, or at the cap: judged,
    # the verdict naming a run that ended more than 5 points below its best
    assert judged(stopped("0.951", "0.90"))[0] == (
        "unconverged (a comparator stopped on a plateau 5.1 points below its best)"
    )
    assert judged(stopped("0.95", "0.90"))[0] == "ahead at the method's rate"
    assert judged(stopped("0.951", "0.90", cap="1"))[0] == (
        "ahead at the method's rate (a comparator run ended 5.1 points below its best)"
    )

    def both_fell(run):
        # an oscillating comparator and a collapsed method, both at the cap
        run.update(plateau="20", cap="1", epochs="1")
        if run["role"] == "comparator":
            run.update(best_validation_accuracy="0.90", last_mean_validation_accuracy="0.80")
        else:
            run.update(best_validation_accuracy="0.70", last_mean_validation_accuracy="0.10")

    assert judged(both_fell) == (
        "ahead at the method's rate (a method run ended 60.0 points below its best and a "
        "comparator run ended 10.0 points below its best)",
        "1 ahead, 0 behind, 0 level, 0 inconclusive",
    )

    def stopped_before_validation_was_recorded(run):
        # files from before best_validation_accuracy: the test accuracy's best and mean
        if run["role"] == "comparator":
            run.update(plateau="20", cap="50", best_accuracy="0.96", best_validation_accuracy="")

    assert judged(stopped_before_validation_was_recorded)[0].startswith("unconverged")


def test_the_rounds_column_tells_a_diverged_comparator_from_a_plateaued_one():
    from stratify.reproduce.results import rounds_text

    def run(epochs, status="finished"):
        return {"epochs": str(epochs), "status": status, "plateau": "40", "cap": "100"}

    assert rounds_text([run(42), run(100), run(59, "diverged")]) == (
        "42–100 (1 of 3 plateaued, 1 diverged, cap 100)"
    )
    assert rounds_text([run(42), run(66)]) == "42–66 (2 of 2 plateaued, cap 100)"


def test_a_new_best_exactly_the_gain_above_the_best_before_is_an_improvement():
    # "less than gain_points above" is no improvement: a gain of exactly 0.5 points (in
    # floating point: 0.000 then 0.005) is one, and the run goes on; 0.4 points is not
    rule = PlateauRule(1, 100)
    before = [0.0] * 10
    assert 100 * (0.005 - 0.0) == rule.gain_points
    assert not rule.converged([*before, 0.005, *[0.0] * 9])
    assert rule.converged([*before, 0.004, *[0.0] * 9])
    # the same boundary at another gain, with accuracies exact in binary
    other = PlateauRule(1, 100, gain_points=12.5, margin_points=20.0)
    assert not other.converged([*[0.5] * 10, 0.625, *[0.5] * 9])
    assert other.converged([*[0.5] * 10, 0.5 + 2**-4, *[0.5] * 9])
