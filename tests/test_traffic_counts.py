"""Traffic counters of whole runs against values counted by hand (README "Semantics").

With a single client every count is known without looking at the plan: the model makes
one hop per epoch in single-sample mode, and every global batch has one participant in
batch mode. The model's size is worked out from its layers.
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
def test_single_client_single_sample_run_is_one_hop_per_epoch(tmp_path, chunk):
    summary, rows = one_client_run(tmp_path, "single-sample", {"chunk": chunk})
    for row in rows:
        assert (row["steps"], row["skipped"]) == (REPEATS * LABELS, 0)
        assert row["transfers"] == 1  # the first hop of the epoch; it never moves again
        assert row["bytes_sent"] == CNN_DIGITS_BYTES
    assert summary["total_transfers"] == 2
    assert summary["total_steps"] == 800


def test_single_client_batch_run_is_one_participant_per_global_batch(tmp_path):
    summary, rows = one_client_run(tmp_path, "batch", {"batch_labels": 16})
    for row in rows:
        assert row["steps"] == 400 // 16  # 25 global batches
        assert row["transfers"] == 25  # one participant each
        assert row["bytes_sent"] == 25 * (CNN_DIGITS_BYTES + CNN_DIGITS_BYTES)  # model + grad
    assert summary["total_transfers"] == 50
    assert summary["total_steps"] == 50
