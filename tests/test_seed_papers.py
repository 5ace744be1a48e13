"""The seed-papers grid: FedDiverse's gsc:k federation, the paper settings each method
declares, and the grid's cells built from them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from stratify.algorithms import ALGORITHMS, strategy_class
from stratify.card import PaperSetting
from stratify.comparison import matched_config
from stratify.config import TrainConfig, resolve_lr
from stratify.data.heterogeneity import heterogeneity_triplet, interaction_matrix
from stratify.data.partition import (
    GSC_ALIGNMENT,
    GSC_DOMINANCE,
    gsc_counts,
    gsc_shares,
    partition,
    unassigned,
)
from stratify.errors import PartitionError
from stratify.reproduce.grids import GRIDS, Settings, paper_setting_grid, plan_cells

# -- gsc:k --------------------------------------------------------------------------------

#: groups (label, attribute) in sorted order: (0, 0), (0, 1), (1, 0), (1, 1); label 0's
#: usual attribute is 0, label 1's is 1
GROUP_SIZES = (112, 24, 24, 80)


def grouped_data(sizes=GROUP_SIZES) -> tuple[np.ndarray, np.ndarray]:
    groups = [(0, 0), (0, 1), (1, 0), (1, 1)]
    labels = np.concatenate([np.full(n, y) for (y, _), n in zip(groups, sizes)])
    attributes = np.concatenate([np.full(n, a) for (_, a), n in zip(groups, sizes)])
    return labels, attributes


def composition(labels, attributes, indices) -> list[int]:
    return [
        int(np.sum((labels[indices] == y) & (attributes[indices] == a)))
        for y in (0, 1)
        for a in (0, 1)
    ]


def test_gsc_gives_each_client_type_the_composition_computed_by_hand():
    # 6 clients, gsc:1: client 0 class-imbalanced (label 0: 0.9, split equally over the
    # colours; label 1: 0.1), client 1 attribute-imbalanced (attribute 0: 0.9 over both
    # labels), clients 2-5 spuriously correlated (0.95 in (0, 0) and (1, 1)). Per sample of
    # a client the groups need 2.8, 0.6, 0.6 and 2.0 samples: the pools of 112, 24, 24 and
    # 80 give exactly 40 per client, every sample used.
    labels, attributes = grouped_data()
    parts = partition(labels, 6, "gsc:1", seed=3, domains=attributes)
    assert [composition(labels, attributes, part) for part in parts] == [
        [18, 18, 2, 2],
        [18, 2, 18, 2],
        [19, 1, 1, 19],
        [19, 1, 1, 19],
        [19, 1, 1, 19],
        [19, 1, 1, 19],
    ]
    assert len(np.unique(np.concatenate(parts))) == len(labels)
    assert (GSC_DOMINANCE, GSC_ALIGNMENT) == (0.9, 0.95)  # the figures above


def test_gsc_drops_what_the_common_client_size_does_not_need():
    # 10 more images of (0, 0) and 3 of (1, 0) change nothing: the groups (0, 1) and
    # (1, 1) still allow 40 samples per client
    labels, attributes = grouped_data((122, 24, 27, 80))
    parts = partition(labels, 6, "gsc:1", seed=0, domains=attributes)
    assert [len(part) for part in parts] == [40] * 6
    dropped = unassigned(len(labels), parts)
    assert composition(labels, attributes, dropped) == [10, 0, 3, 0]
    # seeded: the same draw again, another draw with another seed
    again = partition(labels, 6, "gsc:1", seed=0, domains=attributes)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = partition(labels, 6, "gsc:1", seed=1, domains=attributes)
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other))


def test_gsc_rounds_each_client_to_the_common_size_and_stays_within_the_pools():
    # one client, shares 1/3 each of three groups: m = 10 rounds to 4, 3, 3 (largest
    # remainder, the lower group first); 9 samples of the last group would allow 27, the
    # first group's 4 only 12, so m = 12 → 4, 4, 4
    shares = np.array([[1 / 3, 1 / 3, 1 / 3]])
    assert gsc_counts(shares, np.array([4, 20, 9])).tolist() == [[4, 4, 4]]
    assert gsc_counts(shares, np.array([4, 3, 9])).tolist() == [[3, 3, 3]]
    with pytest.raises(PartitionError, match="cannot give each of 1 clients one sample"):
        gsc_counts(shares, np.array([0, 3, 9]))


def test_each_gsc_client_type_is_dominated_by_its_kind_of_heterogeneity():
    labels, attributes = grouped_data()
    groups, shares = gsc_shares(labels, attributes, 6, 1)
    assert groups == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert np.allclose(shares.sum(axis=1), 1.0)
    parts = partition(labels, 6, "gsc:1", seed=0, domains=attributes)
    triplets = [
        heterogeneity_triplet(interaction_matrix(labels[p], attributes[p], 2, 2)) for p in parts
    ]
    ci, ai, sc = (np.array(column) for column in zip(*triplets))
    assert ci[0] > 0.3 and ai[0] == pytest.approx(0) and sc[0] == pytest.approx(0)
    assert ai[1] > 0.3 and ci[1] == pytest.approx(0) and sc[1] == pytest.approx(0)
    assert np.all(sc[2:] > 0.5) and np.allclose(ci[2:], 0) and np.allclose(ai[2:], 0)


@pytest.mark.parametrize(
    "spec, domains, message",
    [
        ("gsc:4", True, "more than the 6 clients"),
        ("gsc:1", False, "needs per-sample domains"),
        ("gsc:-1", True, "whole number of clients k >= 0"),
        ("gsc:x", True, "whole number of clients k >= 0"),
    ],
)
def test_gsc_refuses_what_it_cannot_build(spec, domains, message):
    labels, attributes = grouped_data()
    with pytest.raises(PartitionError, match=message):
        partition(labels, 6, spec, domains=attributes if domains else None)


def test_gsc_needs_two_attributes():
    labels, _ = grouped_data()
    with pytest.raises(PartitionError, match="at least 2 labels and 2 attributes"):
        partition(labels, 6, "gsc:1", domains=np.zeros(len(labels), dtype=np.int64))


# -- the declared paper settings ----------------------------------------------------------


def declaring() -> list[str]:
    return [name for name in ALGORITHMS if strategy_class(name).card.paper.settings]


def test_the_seed_methods_declare_their_paper_settings():
    assert set(declaring()) >= {"fedbss", "fedbr", "feddiverse", "lfd"}


@pytest.mark.parametrize("name", declaring())
def test_a_declared_paper_setting_names_config_fields_and_the_methods_own_options(name):
    cls = strategy_class(name)
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    own = {entry.name for entry in cls.options_class.option_fields()}
    comparator = strategy_class(cls.card.comparison.comparator)
    base = {entry.name for entry in comparator.options_class.option_fields()}
    # a setting is its key and variant: each names one run
    keys = [(setting.key, setting.variant) for setting in cls.card.paper.settings]
    assert len(set(keys)) == len(keys)
    for setting in cls.card.paper.settings:
        assert set(setting.values) <= fields - {"algorithm", "options", "seed", "out"}
        assert set(setting.options) <= own
        assert set(setting.comparator_options) <= base


def test_a_paper_setting_with_another_comparator_is_a_named_variant():
    with pytest.raises(ValueError, match="is a variant: name it"):
        PaperSetting("k", "label", comparator_options={"local_momentum": 0.9})


def test_a_paper_setting_names_its_rate():
    with pytest.raises(ValueError, match="name its learning rate"):
        PaperSetting("k", "label", {"epochs": 5})


def test_a_default_rate_chosen_on_other_settings_does_not_move_a_paper_setting(
    monkeypatch, tmp_path
):
    def planned_rates():
        cells, _ = plan_cells(GRIDS["seed-papers"], Settings(seeds=(0,)), tmp_path)
        return {(cell.row.key, cell.column.key): resolve_lr(cell.config) for cell in cells}

    before = planned_rates()
    for name in (*declaring(), "fedavg", "fedavgm"):
        cls = strategy_class(name)
        rates = {(family, "batch"): 0.777 for family in ("mnist", "digits")}
        tuned = dataclasses.replace(cls.card.rates, tuned=rates)
        monkeypatch.setattr(cls, "card", dataclasses.replace(cls.card, rates=tuned))
    assert planned_rates() == before
    assert 0.777 not in before.values()


def test_the_seed_papers_grid_is_the_declared_settings():
    rows, columns = paper_setting_grid()
    by_key = {row.key: row for row in rows}
    by_column = {column.key: column for column in columns}
    planned = 0
    for name in declaring():
        for setting in strategy_class(name).card.paper.settings:
            row = by_key[f"{name}-{setting.key}"]
            assert row.values == dict(setting.values)
            # the row's options and its variant's column's make the setting's options
            (column,) = [
                by_column[key]
                for key in row.columns or ()
                if by_column[key].label.endswith(f"({setting.variant})" if setting.variant else "")
                and (setting.variant or "(" not in by_column[key].label)
            ]
            assert column.algorithm == name and column.paired
            assert {**row.options, **column.options} == dict(setting.options)
            assert column.comparator_options == dict(setting.comparator_options)
            planned += 1
    assert sum(len(row.columns or ()) for row in rows) == planned
    assert GRIDS["seed-papers"].rows == rows and GRIDS["seed-papers"].columns == columns


def test_variants_of_one_setting_must_share_its_values(monkeypatch):
    from stratify.errors import ConfigError

    lfd = strategy_class("lfd")
    first = lfd.card.paper.settings[0]
    clash = dataclasses.replace(first, values={**first.values, "epochs": 3}, variant="other")
    paper = dataclasses.replace(lfd.card.paper, settings=(first, clash))
    monkeypatch.setattr(lfd, "card", dataclasses.replace(lfd.card, paper=paper))
    with pytest.raises(ConfigError, match="differ in label, values"):
        paper_setting_grid()


# -- the grid's cells ------------------------------------------------------------------


@pytest.fixture(scope="module")
def seed_paper_cells(tmp_path_factory):
    out = tmp_path_factory.mktemp("seed-papers")
    cells, notes = plan_cells(GRIDS["seed-papers"], Settings(seeds=(0, 1, 2)), out)
    assert notes == []
    return cells


def cells_of(cells, row: str, role: str, column: str | None = None):
    """A row's three method cells (of ``column``), or the comparator cells of those."""
    methods = [
        c
        for c in cells
        if c.row.key == row and c.comparator is not None and column in (None, c.column.key)
    ]
    if column is None:
        methods = [c for c in methods if c.column.key == methods[0].column.key]
    chosen = methods
    if role == "base":
        chosen = [c for c in cells if c.row.key == row and c.column.key == methods[0].comparator]
    assert len(chosen) == 3, (row, role)
    return chosen


def test_every_setting_runs_three_seeds_beside_its_comparator(seed_paper_cells):
    rows, _ = paper_setting_grid()
    for row in rows:
        cells = [c for c in seed_paper_cells if c.row.key == row.key]
        methods = [c for c in cells if c.comparator is not None]
        bases = {c.column.key: c for c in cells if c.comparator is None}
        assert {(c.column.key, c.seed) for c in methods} == {
            (key, seed) for key in row.columns or () for seed in (0, 1, 2)
        }
        assert all(m.comparator in bases for m in methods)
        # variants whose comparator comes out the same share its runs
        assert len(cells) == len(methods) + 3 * len({m.comparator for m in methods})


def test_fedbss_cells_take_about_100_local_steps_and_warm_up_for_50_rounds(seed_paper_cells):
    for row in ("fedbss-shards-2-12-clients", "fedbss-shards-2-12-clients-lr-0-01"):
        for cell in cells_of(seed_paper_cells, row, "method"):
            config = cell.config
            assert (config.clients, config.epochs, config.partition) == (12, 200, "shards:2")
            assert config.options["warmup_rounds"] == 50
            # 8,000 training images over 12 clients, E = 10, batch 64: ⌈667 / 64⌉ · 10
            assert -(-8000 // 12 // 64) * 10 == 110
        (base,) = {
            c.config.options["client_fraction"] for c in cells_of(seed_paper_cells, row, "base")
        }
        assert round(base * 12) == 4


def test_fedbr_runs_300_rounds_against_plain_and_momentum_fedavg(seed_paper_cells):
    row, official = (
        "fedbr-rotated-dir-0-1",
        "fedbr-against-momentum-0-9-fedavg-first-official-commit",
    )
    plain = cells_of(seed_paper_cells, row, "base", "fedbr")[0].config
    momentum = cells_of(seed_paper_cells, row, "base", official)[0].config
    method = cells_of(seed_paper_cells, row, "method", official)[0].config
    assert method.options == {} and method.epochs == plain.epochs == 300
    assert plain.options["local_momentum"] == 0.0 and momentum.options["local_momentum"] == 0.9
    # the rest as matched: the same local work, rate and data
    assert {**momentum.options, "local_momentum": 0.0} == plain.options
    assert matched_config(method) == dataclasses.replace(plain, out=None)
    assert momentum.lr == plain.lr == 1e-3
    rate = cells_of(seed_paper_cells, "fedbr-rotated-dir-0-1-lr-0-01", "base")[0].config
    assert rate.lr == 1e-2


def test_feddiverse_runs_the_24_client_gsc_federation_for_100_rounds(seed_paper_cells):
    for cell in cells_of(seed_paper_cells, "feddiverse-cmnist-gsc", "method"):
        config = cell.config
        assert (config.dataset, config.partition, config.clients) == ("colored-mnist", "gsc:4", 24)
        assert config.epochs >= 100 and config.dataset_options["binary_labels"] is True


def test_the_lfd_ablations_share_the_full_lfds_comparator(seed_paper_cells):
    variants = ("lfd", "lfd-no-drift-regulariser", "lfd-cosine-classifier-alone")
    for split in ("dir-0-5", "classes-3"):
        row = f"lfd-{split}-e1"
        keys = {cells_of(seed_paper_cells, row, "base", key)[0].column.key for key in variants}
        assert len(keys) == 1, keys  # drift_weight and margin are LfD's mechanism
        options = [
            cells_of(seed_paper_cells, row, "method", key)[0].config.options for key in variants
        ]
        assert [o["local_epochs"] for o in options] == [1, 1, 1]
        assert "drift_weight" not in options[0] and options[1]["drift_weight"] == 0.0
        assert options[2]["drift_weight"] == 0.0 and options[2]["margin"] == 0.0


def test_every_seed_paper_pair_plans_the_sample_gradients_computed_by_hand(tmp_path):
    # on digits (1,437 training images here, no attributes: FedDiverse's gsc row, which
    # needs them, is planned on colored-mnist in the test below)
    from stratify.data.datasets import load_dataset
    from stratify.reproduce.paired import pair_budgets

    n = len(load_dataset("digits").y_train)
    settings = Settings(dataset="digits", seeds=(0,), methods=("fedbss", "fedbr", "lfd"))
    cells, _ = plan_cells(GRIDS["seed-papers"], settings, tmp_path)
    hand = {
        "FedBSS": 4 * 10 * n / 12,  # 4 of 12 clients, E = 10
        "FedBR": 10 * 20 * 64,  # every one of 10 clients, K = 20 iterations of 64
        "LfD": 10 * 10 * n / 10,  # E = 10: the paper setting's row
    }
    budgets = pair_budgets(cells)
    assert len(budgets) == len({(c.row.key, c.column.key) for c in cells if c.comparator})
    for budget in budgets:
        expected = hand[budget.method.split(" (")[0]]
        if budget.row.endswith("E = 1, 20 rounds"):
            expected = 10 * 1 * n / 10
        assert budget.method_sample_gradients == pytest.approx(expected), budget
        assert budget.comparator_sample_gradients == pytest.approx(expected), budget


def test_the_feddiverse_pair_plans_9_clients_of_the_gsc_federation(tmp_path, shared_data_dir):
    from stratify.reproduce.paired import pair_budgets

    settings = Settings(data_dir=shared_data_dir, seeds=(0,), methods=("feddiverse",))
    cells, _ = plan_cells(GRIDS["seed-papers"], settings, tmp_path)
    (budget,) = pair_budgets(cells)
    # 24 equal clients of gsc:4 on binary colored-mnist (correlation 0.5): 297 images each
    # (the minority colours of label 0 allow no more), 9 a round, E = 10
    assert budget.method_sample_gradients == budget.comparator_sample_gradients == 9 * 10 * 297


def test_a_run_shorter_than_fedbss_warm_up_leaves_its_rows_out_with_a_note(tmp_path):
    # the warm-up is a row option of the paper setting: a shorter run would make FedBSS
    # another algorithm, so its rows go, not the whole grid
    cells, notes = plan_cells(GRIDS["seed-papers"], Settings(epochs=2, seeds=(0,)), tmp_path)
    assert not any(cell.config.algorithm == "fedbss" for cell in cells)
    assert any(
        "FedBSS" in note and "--warmup-rounds 50 is longer than the run" in note for note in notes
    )
    assert {cell.config.algorithm for cell in cells} >= {"fedbr", "feddiverse", "lfd"}
