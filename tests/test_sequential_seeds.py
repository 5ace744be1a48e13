"""The two-stage seed design of --seeds-until-verdict (stratify.reproduce.paired,
stratify.reproduce.sequential), on hand-computed values."""

import pytest

from stratify.reproduce.grids import GRIDS, Settings, plan_cells
from stratify.reproduce.paired import seeds_for_verdict, stein_difference
from stratify.reproduce.results import CSV_FIELDS
from stratify.reproduce.sequential import extension

# first stage: +4, 0, +2, +5, −1 points: mean 2, s0 = 2.5495, t(0.975, 4) = 2.7764
# half-width over 5 seeds 3.166: [−1.17, +5.17], inconclusive
FIRST = [0.04, 0.00, 0.02, 0.05, -0.01]


def test_the_seeds_a_pair_needs_come_from_its_first_stage_spread():
    # aim: half the larger of |mean| = 2 and 1 point -> h = 1 point;
    # n = ceil((2.7764 · 2.5495 / 1)²) = ceil(50.11) = 51
    assert seeds_for_verdict(FIRST, 100) == 51
    assert seeds_for_verdict(FIRST, 20) == 20  # the cap
    # +3, +1, +2, +4, 0: s0 = 1.58, half-width 1.96 -> [+0.04, +3.96]: ahead already
    assert seeds_for_verdict([0.03, 0.01, 0.02, 0.04, 0.00], 100) == 5
    # one seed, or no spread: nothing to compute from
    assert seeds_for_verdict([0.05], 100) == 1
    assert seeds_for_verdict([0.0, 0.0, 0.0], 100) == 3


def test_stein_s_interval_uses_the_first_stage_spread_and_every_seed():
    every = FIRST + [0.02] * 46
    difference = stein_difference(FIRST, every)
    # mean 2 points; half-width 2.7764 · 2.5495 / √51 = 0.9912 point
    assert difference.seeds == 51
    assert difference.mean == pytest.approx(0.02)
    assert difference.half_width == pytest.approx(0.009912, abs=1e-6)


def test_extended_groups_run_further_seeds_and_their_comparators_too(tmp_path):
    settings = Settings(
        dataset="digits",
        seeds=(0, 1, 2),
        methods=("fedprox", "fedavgm"),
        extended={"iid/fedprox": 5},
    )
    cells, _ = plan_cells(GRIDS["paired"], settings, tmp_path)
    seeds = {}
    for cell in cells:
        seeds.setdefault((cell.row.key, cell.column.key), []).append((cell.seed, cell.stage))
    assert seeds[("iid", "fedprox")] == [(0, 1), (1, 1), (2, 1), (3, 2), (4, 2)]
    assert seeds[("iid", "fedavgm")] == [(0, 1), (1, 1), (2, 1)]
    assert seeds[("classes-1", "fedprox")] == [(0, 1), (1, 1), (2, 1)]
    # FedProx's and FedAvgM's matched comparators are the same FedAvg: it runs once per
    # seed, the two seeds only FedProx asked for included
    comparator = next(cell.comparator for cell in cells if cell.group == "iid/fedprox")
    assert seeds[("iid", comparator)] == [(0, 1), (1, 1), (2, 1), (3, 2), (4, 2)]


def rows(row, column, values, label=None, **fields):
    """results.csv rows of one group, a seed per value; ``column`` its folder name."""
    return [
        dict.fromkeys(CSV_FIELDS, "")
        | {
            "row": row,
            "column": label or column,
            "seed": str(seed),
            "stage": "1",
            "status": "finished",
            "epochs": "30",
            "classes": "10",
            "last_mean_accuracy": str(value),
            "run_dir": f"grid/cells/{row}/{column}/seed-{seed}",
            **fields,
        }
        for seed, value in enumerate(values)
    ]


def test_the_plan_extends_inconclusive_pairs_only():
    ours = [0.90 + d for d in FIRST]
    runs = (
        rows("iid", "stratify", ours)
        + rows("iid", "fedavg", [0.90] * 5)  # inconclusive: extended to 51, capped
        + rows("iid", "sfl", [0.50] * 5)  # 40 points behind on every seed: ahead
        + rows("classes-1", "stratify", [0.10, 0.11, 0.12, 0.09, 0.10])
        + rows("classes-1", "fedavg", [0.12, 0.10, 0.09, 0.11, 0.10])  # both near chance
    )
    assert extension(runs, 30, reference="stratify") == {"iid/fedavg": 30, "iid/stratify": 30}
    # a paired grid: a method and its comparator; a pair with a diverged run gets no seeds
    paired = rows("iid", "fedprox", ours, role="method", comparator="base") + rows(
        "iid", "base", [0.90] * 5, label="FedAvg (matched)", role="comparator"
    )
    assert extension(paired, 12) == {"iid/fedprox": 12}
    paired[0]["status"] = "diverged"
    assert extension(paired, 12) == {}
