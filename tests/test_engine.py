"""Traffic counters of whole runs against values counted by hand (docs/usage.md, "Semantics").

With a single client every count is known without looking at the plan: in single-sample
mode the model goes down to the client once an epoch and comes back once, and every
global batch has one participant in batch mode. The model's size is worked out from its
layers.
"""

import json

import pytest

from stratify.run import Run, TrainConfig

# NIID-Bench's simple CNN on 8x8 digits (padding 2 keeps 8x8, pools give 4x4 then 2x2):
# conv 1->6 5x5: 150 + 6, conv 6->16 5x5: 2400 + 16, fc 64->120: 7680 + 120,
# fc 120->84: 10080 + 84, fc 84->10: 840 + 10 = 21,386 float32 parameters, no buffers.
CNN_DIGITS_BYTES = 21_386 * 4
LABELS = 10
REPEATS = 40  # per label and epoch: 400 schedule entries; every digit has > 100 samples


def one_client_run(tmp_path, mode, options):
    config = TrainConfig(
        dataset="digits",
        partition="iid",
        clients=1,
        epochs=2,
        lr=0.05,
        secure=False,
        mode=mode,
        options={"repeat_count": REPEATS, **options},
        out=str(tmp_path / mode),
    )
    summary = Run(config).train()
    lines = (tmp_path / mode / "metrics.jsonl").read_text().splitlines()
    return summary, [json.loads(line) for line in lines]


@pytest.mark.parametrize("chunk", [1, 7])
@pytest.mark.parametrize("hops", ["server", "direct"])
def test_single_client_single_sample_run_is_one_trip_per_epoch(tmp_path, chunk, hops):
    summary, rows = one_client_run(tmp_path, "single-sample", {"chunk": chunk, "hops": hops})
    for row in rows:
        assert (row["steps"], row["skipped"]) == (REPEATS * LABELS, 0)
        # down to the client at the start of the epoch, back at its end; it never moves between
        assert row["transfers"] == 2
        assert row["bytes_sent"] == 2 * CNN_DIGITS_BYTES
        assert row["sample_gradients"] == REPEATS * LABELS
    assert summary["total_transfers"] == 4
    assert summary["total_steps"] == 800
    assert summary["bytes_per_round"] == 2 * CNN_DIGITS_BYTES


@pytest.mark.parametrize(("hops", "per_round"), [("server", 2 * 3), ("direct", 3 + 1)])
def test_sfl_counts_its_chain_of_three_clients(tmp_path, hops, per_round):
    # server -> c1 -> c2 -> c3 -> server: 1 + 2 + 2 + 1 relayed, 1 + 1 + 1 + 1 direct
    config = TrainConfig(
        dataset="digits",
        partition="iid",
        clients=3,
        epochs=2,
        secure=False,
        mode="batch",
        algorithm="sfl",
        options={"hops": hops},
        out=str(tmp_path / hops),
    )
    summary = Run(config).train()
    rows = [
        json.loads(line) for line in (tmp_path / hops / "metrics.jsonl").read_text().splitlines()
    ]
    assert [row["transfers"] for row in rows] == [per_round, per_round]
    assert [row["bytes_sent"] for row in rows] == [per_round * CNN_DIGITS_BYTES] * 2
    assert summary["distinct_clients_trained"] == 3


def test_single_client_batch_run_is_one_participant_per_global_batch(tmp_path):
    summary, rows = one_client_run(tmp_path, "batch", {"batch_labels": 16})
    for row in rows:
        assert row["steps"] == 400 // 16  # 25 global batches
        assert row["transfers"] == 25  # one participant each
        assert row["bytes_sent"] == 25 * (CNN_DIGITS_BYTES + CNN_DIGITS_BYTES)  # model + grad
        assert row["sample_gradients"] == 400
    assert summary["total_transfers"] == 50
    assert summary["total_steps"] == 50
